"""``GET /``: a page to try the sampler in a browser (``page.html`` beside this file, no external
assets). It streams from the server's own completion endpoints with ``"llmsample": {"tokens":
"full"}`` and colours each token as ``--html`` does; what the page needs from Python (the colour
bands, the stages' labels, a control for every numeric key of the chain with each preset's
values, whether the model chats) is filled in here as JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmsample.batch.run import BatchSettings
from llmsample.errors import UserError
from llmsample.render.bands import BANDS
from llmsample.render.html import PAGE_STYLE
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.stages import STAGES

if TYPE_CHECKING:
    from llmsample.models.loading import LoadedModel

PLACEHOLDER = "/*LLMSAMPLE_CONFIG*/null"
NONCE = "LLMSAMPLE_NONCE"


@dataclass(frozen=True)
class Control:
    """One sampling key as the page shows it: a slider (``integer``: a whole-number field;
    ``flag``: a checkbox) in a group named as the docs name the stages; the range is the
    slider's, the key's own rules are the server's (a value out of them is the server's 400,
    shown on the page). ``common``: in the row above Send (with the preset and the seed); the
    rest wait in one closed section, so the reply is in sight on a laptop's screen."""

    key: str
    label: str
    group: str
    low: float
    high: float
    step: float
    integer: bool = False
    flag: bool = False
    common: bool = False


CONTROLS: tuple[Control, ...] = (
    Control("temperature", "temperature", "Temperature and truncation", 0, 2, 0.05, common=True),
    Control("dynatemp_range", "dynamic ±", "Temperature and truncation", 0, 2, 0.05),
    Control("dynatemp_exponent", "dynamic exponent", "Temperature and truncation", 0, 4, 0.05),
    Control("smoothing_factor", "smoothing", "Temperature and truncation", 0, 5, 0.05),
    Control("smoothing_curve", "smoothing curve", "Temperature and truncation", 1, 10, 0.1),
    Control("top_k", "top-k", "Temperature and truncation", 0, 200, 1, integer=True),
    Control("top_p", "top-p", "Temperature and truncation", 0.05, 1, 0.01, common=True),
    Control("min_p", "min-p", "Temperature and truncation", 0, 0.5, 0.01, common=True),
    Control("typical_p", "typical-p", "Temperature and truncation", 0.05, 1, 0.01),
    Control("top_n_sigma", "top-n-σ", "Temperature and truncation", 0, 5, 0.1),
    Control("epsilon_cutoff", "epsilon", "Temperature and truncation", 0, 0.01, 0.0001),
    Control("eta_cutoff", "eta", "Temperature and truncation", 0, 0.01, 0.0001),
    Control("top_h", "top-h", "Temperature and truncation", 0, 1, 0.01),
    Control("top_a", "top-a", "Temperature and truncation", 0, 1, 0.01),
    Control("p_less", "p-less", "Temperature and truncation", 0, 1, 1, flag=True),
    Control("repetition_penalty", "repetition", "Penalties", 1, 2, 0.01),
    Control("frequency_penalty", "frequency", "Penalties", -2, 2, 0.05),
    Control("presence_penalty", "presence", "Penalties", -2, 2, 0.05),
    Control("no_repeat_ngram_size", "no-repeat n-gram", "Penalties", 0, 10, 1, integer=True),
    Control("dry_multiplier", "multiplier", "DRY", 0, 2, 0.05),
    Control("dry_base", "base", "DRY", 1, 4, 0.05),
    Control("dry_allowed_length", "allowed length", "DRY", 1, 20, 1, integer=True),
    Control("dry_penalty_last_n", "last n (0: all)", "DRY", 0, 4096, 1, integer=True),
    Control("xtc_probability", "probability", "XTC", 0, 1, 0.05),
    Control("xtc_threshold", "threshold", "XTC", 0.01, 0.5, 0.01),
    Control("mirostat", "mirostat (0 off, 1, 2)", "Mirostat and adaptive-p", 0, 2, 1, integer=True),
    Control("mirostat_tau", "mirostat τ", "Mirostat and adaptive-p", 0, 10, 0.1),
    Control("mirostat_eta", "mirostat η", "Mirostat and adaptive-p", 0, 1, 0.01),
    Control("adaptive_target", "adaptive-p target (<0 off)", "Mirostat and adaptive-p", -1, 1, 0.01),
    Control("adaptive_decay", "adaptive-p decay", "Mirostat and adaptive-p", 0, 0.99, 0.01),
    Control("min_tokens", "min tokens", "Length", 0, 4096, 1, integer=True),
    Control("max_tokens", "max tokens", "Length", 1, 4096, 1, integer=True, common=True),
    Control("reasoning_budget", "thinking budget (0: none)", "Length", 0, 8192, 1, integer=True),
)  # fmt: skip
"""Every numeric and on/off key of :class:`SamplingConfig` (a test holds the table to that), grouped.
Lists and tables (``stop``, ``logit_bias``, ``ban``, DRY's breakers) go in the page's JSON box."""


def _values(cfg: SamplingConfig) -> dict[str, Any]:
    return {control.key: getattr(cfg, control.key) for control in CONTROLS}


def page_config(lm: LoadedModel, settings: BatchSettings, presets: frozenset[str]) -> dict[str, Any]:
    """The model's name, whether it chats (its tokenizer has a chat template: the page opens in
    chat mode) and its context length, the bands (likeliest first, as the ``--html`` legend
    reads), the stages' labels, the controls, the server's own defaults and each preset's values."""
    from llmsample.engine.prompt import has_chat_template
    from llmsample.sampling import presets as preset_store

    name, default = preset_store.load(settings.preset, settings.preset_file)
    default = default.with_overrides(**settings.overrides)  # checked when the server started
    values = {}
    for preset in sorted(presets):
        try:
            values[preset] = _values(preset_store.load(preset)[1])
        except UserError:
            continue  # a preset file that does not read: the page leaves it out, a request names it
    return {
        "model": lm.name,
        "chat": has_chat_template(lm),
        "context_length": lm.context_length,
        "bands": [{"low": band.low, "label": band.label, "color": band.hex} for band in BANDS],
        "labels": {info.name: info.label for info in STAGES},
        "controls": [asdict(control) for control in CONTROLS],
        "server_default": {"name": name, **_values(default)},
        "presets": values,
    }


def render(config: dict[str, Any], nonce: str) -> str:
    """The page with ``config`` in its script (``<`` escaped, so no text in it can end the
    script), the ``--html`` view's styles, and ``nonce`` on its one script and style: with
    :func:`security_policy` nothing else on the page runs, whatever text it shows."""
    source = Path(__file__).with_name("page.html").read_text(encoding="utf-8")
    data = json.dumps(config, ensure_ascii=False).replace("<", "\\u003c")
    source = source.replace(NONCE, nonce).replace("/*LLMSAMPLE_STYLE*/", PAGE_STYLE)
    return source.replace(PLACEHOLDER, data)


def security_policy(nonce: str) -> str:
    """Only the page's own script and style, requests to this server, no frames around it."""
    return (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
