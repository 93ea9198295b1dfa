"""``generate --replay ID``: a logged generate or speculate run decoded again with its prompt,
settings, seed, model and flags, printed as any run is, then one stderr line: matched, or where
the two first part and why (:mod:`llmsample.logs.rerun`)."""

from __future__ import annotations

from typing import Any

from llmsample.errors import UserError

REPLAYED_FLAGS = ("raw", "truncate", "ignore_eos", "top_n", "draft", "draft_tokens", "ngram_min", "ngram_max",
                  "quantize", "gguf_type")  # fmt: skip
"""The command's flags a run's tokens depend on beyond its settings: kept with it in the log."""


def logged_flags(options: dict[str, Any]) -> dict[str, Any]:
    """What the log keeps of ``options`` so that ``--replay`` can repeat the run."""
    return {key: options[key] for key in REPLAYED_FLAGS if options.get(key) is not None}


def replay_options(options: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, Any, str], Any]:
    """The logged run's options (the model, dtype, device and backend it ran on, unless given
    here), its preset, settings (with the sampling flags given here on top) and prompt, and the
    check that compares the new tokens with it."""
    from llmsample.commands.sampling_options import sampling_overrides
    from llmsample.logs import store
    from llmsample.logs.rerun import ReplayCheck
    from llmsample.sampling.config import ConfigError, SamplingConfig

    run = store.get(options["replay"])
    if run is None:
        raise UserError(f"no run {options['replay']} in the log ({store.database_path()}); `llmsample logs` lists them")
    if run.command not in ("generate", "speculate"):
        how = "`llmsample chat -c --replay`" if run.command == "chat" else "its own command"
        raise UserError(f"run {run.id} is a {run.command} run; --replay repeats generate and speculate runs ({how})")
    if run.summary.get("facts", {}).get("constraint") is not None:
        raise UserError(f"run {run.id} was constrained, and the log does not keep its constraint; rerun it by hand")
    if run.flags is None:
        raise UserError(f"run {run.id} was logged before the log kept its flags; rerun it by hand")
    facts = run.summary.get("facts", {})
    given = {key: options[key] for key in ("device", "dtype", "backend") if options[key] != "auto"}
    dtype = facts.get("dtype") if run.backend != "llama.cpp" else None  # llama.cpp runs its GGUF's own
    options = {**options, "prompt": run.prompt, "system": run.system, "model": options["model"] or logged_model(run),
               "dtype": dtype or "auto", "device": facts.get("device") or "auto",
               "backend": run.backend or "auto", **given, **run.flags}  # fmt: skip
    try:
        cfg = SamplingConfig.from_mapping(run.settings)
    except (ConfigError, TypeError) as exc:
        raise UserError(f"run {run.id}: its settings do not load here ({exc})") from exc
    try:  # a flag given here changes that setting: where does the run part from the logged one?
        cfg = cfg.with_overrides(**sampling_overrides(options))
    except ConfigError as exc:
        raise UserError(f"--{exc.key.replace('_', '-')}: {exc.reason}") from exc
    if run.command == "speculate":
        options["draft"] = options.get("draft") or "ngram"
    return options, (run.preset or "custom", cfg, run.prompt), ReplayCheck(run.id, run.records)


def logged_model(run: Any) -> str | None:
    """The model to load for a logged run: None for the default model (logged by its name), a
    local folder as logged; a folder that is gone is one line saying how to go on."""
    from pathlib import Path

    from llmsample.models.checkpoint import looks_like_path
    from llmsample.models.gguf_to_hf import DEFAULT_MODEL

    if Path(run.model).expanduser().exists():
        return run.model
    if run.model == DEFAULT_MODEL:
        return None
    if looks_like_path(run.model):
        raise UserError(f"run {run.id} ran on {run.model}, which is no longer there; pass -m MODEL to replay it on "
                        "another model (its tokens will differ)")  # fmt: skip
    return run.model
