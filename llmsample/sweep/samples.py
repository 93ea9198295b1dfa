"""A sweep's decoding: its lines through :func:`~llmsample.batch.run.run_batch` on any engine
(here or warm), each record written with the setting it ran, its prompt and seed, and its
metrics; a judge model scores each text as it is written. Torch-free, like batch's run."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from llmsample.analysis.text_metrics import mean_logprob
from llmsample.batch.requests import Request, RequestError, read_requests
from llmsample.batch.run import BatchOutcome, BatchProgress, run_batch
from llmsample.batch.settings import BatchSettings
from llmsample.client.engine_client import EngineClient
from llmsample.jobs import Explanation, Job
from llmsample.sweep.grid import Planned
from llmsample.sweep.metrics import sample_metrics

Record = dict[str, Any]
SWEEP_KEYS = ("setting", "settings", "prompt_index", "metrics")
"""What a sample's record holds beyond ``batch``'s record of the same line."""


def prompts_language(prompts: Sequence[dict[str, Any]], detect: Callable[[str], str | None]) -> str | None:
    """The language of the prompts' words together: one line says too little ("How do I boil an
    egg?" reads as Nigerian Pidgin), a file of them does."""
    words = [prompt.get("prompt") or " ".join(m.get("content") or "" for m in prompt.get("messages") or [])
             for prompt in prompts]  # fmt: skip
    return detect(" ".join(words))


def parsed_lines(planned: Sequence[Planned]) -> list[Request | RequestError]:
    """The lines as ``batch`` reads them (the same parser, the same checks)."""
    return list(read_requests([json.dumps(p.line, ensure_ascii=False) for p in planned]))


class Annotator:
    """Adds to each record what the sweep knows of its line and what it measures of its text."""

    def __init__(
        self,
        planned: Sequence[Planned],
        base: dict[str, Any],
        detect: Callable[[str], str | None],
        language: str | None,
        judge: EngineClient | None = None,
    ) -> None:
        """``language``: the one every text should be in (None: not measured)."""
        self.by_id = {p.line["custom_id"]: p for p in planned}
        self.detect, self.language, self.judge = detect, language, judge
        settings = {p.setting.name: p.setting for p in planned}
        self.configs = {name: setting.config(base) for name, setting in settings.items()}  # read once a setting

    def __call__(self, record: Record) -> Record:
        planned = self.by_id[record["custom_id"]]
        setting = planned.setting
        annotated = {**record, "setting": setting.name, "settings": {"preset": setting.preset, **setting.values},
                     "prompt_index": planned.prompt}  # fmt: skip
        if "error" in record:
            return annotated
        cfg = self.configs[setting.name]
        metrics = sample_metrics(record, cfg.max_tokens, self.language, self.detect)
        found = asdict(metrics)
        if self.judge is not None:
            found["judge_logprob"] = self._judged(planned, record.get("text", ""))
        return {**annotated, "metrics": found}

    def _judged(self, planned: Planned, text: str) -> float | None:
        """The text's mean log-probability after its prompt under the judge (temperature 1, as
        ``explain --continuation`` scores it); None for no text (a sweep with a judge has no
        conversations: :func:`~llmsample.sweep.grid.read_prompts` refuses them)."""
        line = planned.line
        if not text or "prompt" not in line:
            return None
        assert self.judge is not None
        cfg = self.configs[planned.setting.name]
        job = Job(line["prompt"], cfg, planned.setting.preset, system=line.get("system"), raw=line.get("raw", False))
        scored = self.judge.explain(Explanation(job, continuation=text))
        assert isinstance(scored, list)
        return mean_logprob([token.model_prob for token in scored])


def run_sweep(
    engine: EngineClient,
    planned: Sequence[Planned],
    done: frozenset[str],
    settings: BatchSettings,
    write: Callable[[Record], None],
    annotate: Annotator,
    progress: BatchProgress | None = None,
) -> BatchOutcome:
    """Decode every line not in ``done`` (a resumed run's), as ``batch`` would, writing each
    record with the sweep's keys (:data:`SWEEP_KEYS`) as soon as it is in input order."""
    return run_batch(engine, parsed_lines(planned), done, settings, lambda record: write(annotate(record)), progress)
