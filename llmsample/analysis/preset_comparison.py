"""``compare-presets`` without the terminal: each preset's samples as one batch, a greedy
reference for the divergence index, and per-preset means. Formatting stays in the command."""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmsample.analysis.text_metrics import SampleMetrics, cross_sample_diversity, mean_pairwise_overlap, sample_metrics
from llmsample.errors import Interrupted, ignore_further_interrupts
from llmsample.events import RunStats, Summary, TokenEvent
from llmsample.sampling.config import SamplingConfig

if TYPE_CHECKING:
    from torch import Tensor

    from llmsample.models.loading import LoadedModel

Rows = Callable[[SamplingConfig, list[RunStats], list[int | None]], Iterator[tuple[int, Any]]]
"""Decodes one prompt's rows under a config, row i seeded ``seeds[i]``: yields ``(row, record)``,
a record a token, the row's summary, or its failure (anything with a ``message``)."""

Progress = Callable[[int], AbstractContextManager[Callable[[], None]]]
"""Given the number of presets, a context around the preset runs that yields "one more done"."""


@dataclass(frozen=True)
class PresetRun:
    """One sample of one preset: what it wrote, how it ended, and its numbers."""

    preset: str
    sample: int
    seed: int
    events: tuple[TokenEvent, ...]
    summary: Summary
    metrics: SampleMetrics

    failure: str | None = None  # why the sample ended early when its numbers broke (the others go on)

    @property
    def interrupted(self) -> bool:
        return self.summary.stop_reason == "interrupted"

    @property
    def token_ids(self) -> list[int]:
        return [e.token_id for e in self.events]


@dataclass(frozen=True)
class Comparison:
    """Every finished preset's runs, in preset then sample order, and how the comparison ended:
    ``exit_code`` is 0, or 130 (Ctrl-C), 143 (SIGTERM), 129 (SIGHUP) when it was interrupted."""

    runs: list[PresetRun]
    greedy: list[int]
    exit_code: int = 0


@dataclass(frozen=True)
class PresetAggregate:
    """One preset's numbers over its samples: means of the per-sample metrics (None where no
    sample has the figure), and, with two samples or more, how much the samples differ."""

    preset: str
    samples: int
    tokens: float
    tokens_per_s: float | None
    mean_logprob: float
    perplexity: float
    mean_entropy: float
    distinct_1: float
    distinct_2: float
    repetition_rate: float
    diversity: float | None
    overlap: float | None
    divergence: tuple[int | None, ...]


def _no_progress(total: int) -> AbstractContextManager[Callable[[], None]]:
    return contextlib.nullcontext(lambda: None)


def _exit_code(exc: BaseException) -> int:
    return exc.exit_code if isinstance(exc, Interrupted) else 130


def compare(
    lm: LoadedModel,
    prompt_ids: Tensor,
    configs: dict[str, SamplingConfig],
    samples: int,
    seed: int,
    max_tokens: int,
    progress: Progress = _no_progress,
) -> Comparison:
    """:func:`compare_rows` in this process."""
    return compare_rows(local_rows(lm, prompt_ids), lm.name, configs, samples, seed, max_tokens, progress)


def local_rows(lm: LoadedModel, prompt_ids: Tensor) -> Rows:
    """The prompt's rows decoded here, as one batch."""
    from llmsample.engine import loop

    def rows(cfg: SamplingConfig, stats: list[RunStats], seeds: list[int | None]) -> Iterator[tuple[int, Any]]:
        return loop.generate_rows(lm, prompt_ids, cfg, stats, seeds)

    return rows


def compare_rows(
    rows: Rows,
    model: str,
    configs: dict[str, SamplingConfig],
    samples: int,
    seed: int,
    max_tokens: int,
    progress: Progress = _no_progress,
) -> Comparison:
    """Every preset's samples (sample i uses seed ``seed + i``) as one batch each, after a greedy
    run that the divergence index is measured against. On Ctrl-C, SIGTERM or SIGHUP the presets
    that finished are kept, the interrupted one with what it had (its summaries say
    ``interrupted``), and the rest are skipped."""
    constraint = next(iter(configs.values())).constraint if configs else None  # the presets share it
    greedy_cfg = SamplingConfig(temperature=0.0, max_tokens=max_tokens, constraint=constraint)
    seeds = [seed + i for i in range(samples)]
    try:
        greedy = greedy_reference(rows, model, greedy_cfg, seeds)
    except (KeyboardInterrupt, Interrupted) as exc:  # before any preset: nothing to show
        ignore_further_interrupts()
        return Comparison([], [], _exit_code(exc))
    runs: list[PresetRun] = []
    code = 0
    with progress(len(configs)) as advance:
        for name, base in configs.items():
            cfg = dataclasses.replace(base, max_tokens=max_tokens, seed=seed)
            preset_runs, code = _run_preset(rows, model, name, cfg, seeds, greedy)
            runs.extend(preset_runs)
            if code:
                break
            advance()
    return Comparison(runs, greedy, code)


def greedy_reference(rows: Rows, model: str, cfg: SamplingConfig, seeds: list[int]) -> list[int]:
    """The greedy text, decoded as each preset's samples are: one batch of a row per seed, the
    same shapes at every step. A row's numbers can depend on the batch's shape (matmul blocking,
    padding), so a reference decoded alone could part from a greedy preset at a near tie; decoded
    this way, a greedy preset is this very computation and never "diverges" from itself."""
    stats = [RunStats(model, "greedy", s) for s in seeds]
    return [e.token_id for row, e in rows(cfg, stats, list(seeds)) if row == 0 and isinstance(e, TokenEvent)]


def _run_preset(
    rows: Rows, model: str, name: str, cfg: SamplingConfig, seeds: list[int], greedy: list[int]
) -> tuple[list[PresetRun], int]:
    """One preset's samples as one batch, a row per seed; every row comes back, an interrupted
    one with the tokens it kept, with the exit code the interruption calls for (0 when none)."""
    stats = [RunStats(model, name, s) for s in seeds]
    events: list[list[TokenEvent]] = [[] for _ in seeds]
    summaries: dict[int, Summary] = {}
    failures: dict[int, str] = {}
    code = 0
    try:
        for row, item in rows(cfg, stats, list(seeds)):
            if isinstance(item, Summary):
                summaries[row] = item
            elif not isinstance(item, TokenEvent):  # this sample failed and ends; the others finish
                failures[row] = item.message
                summaries[row] = dataclasses.replace(
                    stats[row].summary("failed"), text="".join(e.text for e in events[row]), tokens=len(events[row])
                )
            else:
                events[row].append(item)
    except (KeyboardInterrupt, Interrupted) as exc:
        ignore_further_interrupts()
        code = _exit_code(exc)
    runs = []
    for row, row_seed in enumerate(seeds):
        # An interrupted row: its summary says so and counts the tokens it kept.
        summary = summaries.get(row) or dataclasses.replace(
            stats[row].summary("interrupted"),
            text="".join(e.text for e in events[row]),
            tokens=len(events[row]),
        )
        metrics = sample_metrics(name, row, events[row], summary, greedy)
        runs.append(PresetRun(name, row, row_seed, tuple(events[row]), summary, metrics, failures.get(row)))
    return runs, code


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def aggregate(runs: Sequence[PresetRun]) -> dict[str, PresetAggregate]:
    """Per preset, in the order the presets ran, the means over its samples."""
    by_preset: dict[str, list[PresetRun]] = {}
    for run in runs:
        by_preset.setdefault(run.preset, []).append(run)
    return {name: _aggregate(name, preset_runs) for name, preset_runs in by_preset.items()}


def _aggregate(name: str, runs: list[PresetRun]) -> PresetAggregate:
    metrics = [run.metrics for run in runs]

    def mean(key: str) -> Any:
        return _mean([getattr(m, key) for m in metrics])

    several = len(runs) > 1
    token_lists = [run.token_ids for run in runs]
    return PresetAggregate(
        preset=name,
        samples=len(runs),
        tokens=mean("tokens"),
        tokens_per_s=mean("tokens_per_s"),
        mean_logprob=mean("mean_logprob"),
        perplexity=mean("perplexity"),
        mean_entropy=mean("mean_entropy"),
        distinct_1=mean("distinct_1"),
        distinct_2=mean("distinct_2"),
        repetition_rate=mean("repetition_rate"),
        diversity=cross_sample_diversity(token_lists) if several else None,
        overlap=mean_pairwise_overlap(token_lists) if several else None,
        divergence=tuple(m.divergence_index for m in metrics),
    )
