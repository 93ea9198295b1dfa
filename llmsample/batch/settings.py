"""A batch run's settings, each request's sampling settings resolved from them, and what the
run log keeps of a request: without torch, so that a batch on a warm engine resolves and logs
its requests here as the in-process run does."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from llmsample.batch.requests import Request
from llmsample.batch.result_lines import TokenLevel
from llmsample.errors import UserError
from llmsample.events import TokenEvent
from llmsample.logs.recorder import LogRecorder
from llmsample.sampling import presets as preset_store
from llmsample.sampling.config import ConfigError, SamplingConfig, fresh_seed


@dataclass(frozen=True)
class BatchSettings:
    """What the run's flags say; a request's own keys win over them."""

    preset: str | None = None
    preset_file: Path | None = None
    overrides: dict[str, Any] = field(default_factory=dict)  # flags given on the command line
    system: str | None = None
    raw: bool = False
    truncate: str = "error"
    top_n: int = 5
    ignore_eos: bool = False
    batch_size: int | None = None  # None: as many rows as memory holds (``default_batch_size``)
    draft_tokens: int | None = None  # with a drafter: a fixed K (None: adaptive)
    ngram: tuple[int, int] | None = None  # --draft ngram: each row drafts from its own tokens
    drafter: str | None = None  # the engine's own drafter (a job's ``drafter``: suffix, model)
    reference: bool = False  # every token scored under the reference model (--reference)
    tokens: TokenLevel = "full"
    fmt: Literal["jsonl", "openai"] = "jsonl"


def request_config(request: Request, settings: BatchSettings) -> tuple[str, SamplingConfig]:
    """The request's preset (or the run's), the run's flags on top, the request's own keys on top
    of those; a request without a seed gets a fresh one, reported in its record."""
    if request.preset:
        name, cfg = preset_store.load(request.preset)
    else:
        name, cfg = preset_store.load(settings.preset, settings.preset_file)
    try:
        cfg = cfg.with_overrides(**settings.overrides).with_overrides(**request.overrides)
    except ConfigError as exc:
        raise UserError(f"{exc.key}: {exc.reason}") from exc
    if cfg.seed is None:
        cfg = dataclasses.replace(cfg, seed=fresh_seed())
    return name, cfg


def asked(request: Request, system: str | None) -> tuple[str, str | None]:
    """What a request asked, as the run log keeps it: its prompt (its messages as JSON) and system message."""
    if request.messages is not None:
        return json.dumps(request.messages, ensure_ascii=False), None
    return request.prompt or "", request.system or system


def request_recorder(
    command: str, request: Request, system: str | None, cfg: SamplingConfig, events: list[TokenEvent]
) -> LogRecorder:
    """A decoded request's events through the log's renderer: its summary keeps the run."""
    prompt, system = asked(request, system)
    recorder = LogRecorder(command, prompt, cfg.as_dict(), system)
    for event in events:
        recorder.token(event)
    return recorder
