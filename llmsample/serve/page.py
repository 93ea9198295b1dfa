"""``GET /``: a page to try the sampler in a browser (``page.html`` beside this file, no external
assets). It streams from the server's own completion endpoints with ``"llmsample": {"tokens":
"full"}`` and colours each token as ``--html`` does; what the page needs from Python (the colour
bands, the stages' labels, the presets' values for the sliders) is filled in here as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmsample.batch.run import BatchSettings
from llmsample.errors import UserError
from llmsample.render.bands import BANDS
from llmsample.render.html import PAGE_STYLE
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.stages import STAGES

SLIDERS = ("temperature", "top_k", "top_p", "min_p")
PLACEHOLDER = "/*LLMSAMPLE_CONFIG*/null"
NONCE = "LLMSAMPLE_NONCE"


def _sliders(cfg: SamplingConfig) -> dict[str, Any]:
    return {key: getattr(cfg, key) for key in SLIDERS}


def page_config(model: str, settings: BatchSettings, presets: frozenset[str]) -> dict[str, Any]:
    """The model's name, the bands (likeliest first, as the ``--html`` legend reads), the labels
    of the stages that count what they remove, the server's own defaults and each preset's sliders."""
    from llmsample.sampling import presets as preset_store

    name, default = preset_store.load(settings.preset, settings.preset_file)
    default = default.with_overrides(**settings.overrides)  # checked when the server started
    values = {}
    for preset in sorted(presets):
        try:
            values[preset] = _sliders(preset_store.load(preset)[1])
        except UserError:
            continue  # a preset file that does not read: the page leaves it out, a request names it
    return {
        "model": model,
        "bands": [{"low": band.low, "label": band.label, "color": band.hex} for band in BANDS],
        "labels": {info.name: info.label for info in STAGES},
        "server_default": {"name": name, **_sliders(default), "max_tokens": default.max_tokens},
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
