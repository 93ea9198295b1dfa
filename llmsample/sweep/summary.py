"""A sweep's numbers per setting: each metric's mean and 95 % interval over its samples (or, for
what compares the seeds of one prompt, over its prompts), and which settings are on the Pareto
front of quality against diversity."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llmsample.sweep.grid import Setting
from llmsample.sweep.metrics import Interval, distinct, interval, self_bleu

SAMPLE_METRICS = ("logprob", "judge_logprob", "entropy", "tokens", "repeats", "loops", "early_end", "off_language")
"""Measured on each sample (a failure's rate is the mean of its 0s and 1s)."""

GROUP_METRICS = ("distinct_1", "distinct_2", "distinct_3", "self_bleu")
"""Measured across the seeds of one prompt."""

HIGHER_IS_BETTER = {"logprob": True, "judge_logprob": True, "entropy": True, "distinct_1": True, "distinct_2": True,
                    "distinct_3": True, "self_bleu": False}  # fmt: skip
"""The axes a plot may take, and which way each is better (a lower self-BLEU: more varied)."""


@dataclass(frozen=True)
class SettingSummary:
    setting: Setting
    samples: int
    failed: int
    metrics: dict[str, Interval | None]
    front: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"type": "setting", "setting": self.setting.name,
                "settings": {"preset": self.setting.preset, **self.setting.values}, "samples": self.samples,
                "failed": self.failed, "pareto": self.front,
                "metrics": {key: None if value is None else value.to_dict() for key, value in self.metrics.items()}}  # fmt: skip


def summarize(settings: Sequence[Setting], records: Sequence[dict[str, Any]], x: str, y: str) -> list[SettingSummary]:
    """One summary per setting, in the sweep's order, from its sample records (error records
    count as failed); the front is of ``y`` (quality) against ``x`` (diversity)."""
    mine: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        mine[record["setting"]].append(record)
    summaries = [_summary(setting, mine[setting.name]) for setting in settings]
    front = pareto([(s.metrics.get(x), s.metrics.get(y)) for s in summaries], HIGHER_IS_BETTER[x], HIGHER_IS_BETTER[y])
    return [SettingSummary(s.setting, s.samples, s.failed, s.metrics, i in front) for i, s in enumerate(summaries)]


def pareto(points: Sequence[tuple[Interval | None, Interval | None]], x_up: bool, y_up: bool) -> set[int]:
    """The points no other point beats on both axes (means; ``x_up``/``y_up``: higher is
    better); a point missing either axis is on no front."""
    signed = {i: (x.mean if x_up else -x.mean, y.mean if y_up else -y.mean)
              for i, (x, y) in enumerate(points) if x is not None and y is not None}  # fmt: skip
    return {i for i, (a, b) in signed.items()
            if not any(c >= a and d >= b and (c, d) != (a, b) for j, (c, d) in signed.items() if j != i)}  # fmt: skip


def _summary(setting: Setting, records: list[dict[str, Any]]) -> SettingSummary:
    samples = [record for record in records if "metrics" in record]
    metrics: dict[str, Interval | None] = {}
    for key in SAMPLE_METRICS:
        values = [record["metrics"].get(key) for record in samples]
        metrics[key] = interval([float(v) for v in values if v is not None])
    by_prompt: dict[int, list[list[int]]] = defaultdict(list)
    for record in samples:
        by_prompt[record["prompt_index"]].append([token["token_id"] for token in record.get("per_token") or []])
    groups = list(by_prompt.values())
    for n in (1, 2, 3):
        metrics[f"distinct_{n}"] = interval([distinct(group, n) for group in groups])
    metrics["self_bleu"] = interval([b for b in map(self_bleu, groups) if b is not None])
    return SettingSummary(setting, len(samples), len(records) - len(samples), metrics)
