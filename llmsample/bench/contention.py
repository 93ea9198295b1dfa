"""``bench --contended``: how much each side slows when another program keeps one core busy.
Quiet and contended runs of every side alternate in the same rotating rounds
(:func:`~llmsample.bench.timing.rounds`), the hog (:class:`CpuHog`: a busy loop in a process of
its own, pinned to one core) started before a contended run and stopped after it. A side's
degradation is its contended rate over its quiet rate in the same round; the figure is ours over
llama-cpp-python's, the median of the rounds' (at least 1: ours degrades no more than theirs).

- **generate**: the default ``llmsample generate`` (:mod:`llmsample.bench.default_run`) against
  ``Llama.generate`` on the same GGUF, one chat prompt, EOS ignored (the same work quiet and
  contended);
- **batch**: ``llmsample batch``'s own path (:func:`~llmsample.batch.run.run_batch` on the
  in-process engine, the command's default settings) on :data:`BATCH` chat prompts against
  llama-cpp-python on them one after another (it has no batch of its own), aggregate tokens/s.
  Its records go out as ``-o FILE`` gets them, each as its request ends; the batch's last run
  says when its first row ended and when its first record was written."""

from __future__ import annotations

import atexit
import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from llmsample.bench.default_run import DefaultGenerate, command_options, load_default
from llmsample.bench.peer_llama import PeerGenerate
from llmsample.bench.prompts import batch_prompts
from llmsample.bench.timing import paired_ratio, rounds
from llmsample.models.loading import LoadedModel

BATCH = 8
PROMPT = "Explain to a child, in a short paragraph, why the sea is salty and where the salt comes from."
HOG_CORE = 0
HOG = "import sys\nprint('spinning', flush=True)\nwhile True:\n    pass\n"


class CpuHog:
    """A busy loop in a process of its own on core ``core`` (where the OS lets a process be
    pinned), running from ``start`` (which waits until it spins) to ``stop``; stopped at exit too."""

    def __init__(self, core: int = HOG_CORE) -> None:
        self.core = core
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", HOG], stdout=subprocess.PIPE, text=True)
        atexit.register(self.stop)
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(self.process.pid, {self.core})
        assert self.process.stdout is not None
        self.process.stdout.readline()  # it spins from here

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            process.kill()
            process.wait()
            atexit.unregister(self.stop)

    @contextmanager
    def running(self) -> Iterator[None]:
        self.start()
        try:
            yield
        finally:
            self.stop()


@dataclass
class BatchTimes:
    """The batch's last run: seconds from its start to its first row's end and to its first
    record written."""

    first_row_s: float = 0.0
    first_record_s: float = 0.0


@dataclass(frozen=True)
class Degradation:
    """One pair of sides: quiet and contended medians (tokens/s) and degradations, and the
    median of the rounds' ``ours / theirs`` degradation ratios (target ≥ 1)."""

    name: str
    ours_quiet: float
    ours_contended: float
    theirs_quiet: float
    theirs_contended: float
    ours_degradation: float
    theirs_degradation: float
    ratio: float


@dataclass(frozen=True)
class Contention:
    model: str
    gguf_type: str | None
    threads: int
    tokens: int
    runs: int
    hog_core: int
    pinned: bool  # whether the hog could be pinned (Linux); unpinned it runs wherever the OS puts it
    rows: list[Degradation]
    batch_times: dict[str, dict[str, float]] = field(default_factory=dict)  # quiet/contended: BatchTimes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def lengths(tokens: int) -> list[int]:
    """The batch's answer lengths (EOS ignored): from ``tokens`` down to about half, the first
    request the longest, so that records held back for input order show."""
    return [tokens - tokens * i // (2 * BATCH) for i in range(BATCH)]


def our_batch(
    lm: LoadedModel, args: list[str], prompts: list[str], tokens: int, times: BatchTimes
) -> Callable[[], float]:
    """``llmsample batch``'s path on ``prompts`` (each its own seed and :func:`lengths`, EOS ignored), tokens/s;
    ``times`` gets the run's first row's end and its first record out."""
    import json

    from llmsample.batch.requests import read_requests
    from llmsample.batch.run import run_batch
    from llmsample.commands.batch import batch, batch_settings
    from llmsample.commands.model_options import local_engine

    options = command_options(batch, [*args, "-n", str(tokens), "--ignore-eos", "-"])
    settings = batch_settings(options)  # what the command builds from these options
    asks = enumerate(zip(prompts, lengths(tokens), strict=True))
    lines = [json.dumps({"prompt": prompt, "seed": i, "max_tokens": n}) for i, (prompt, n) in asks]

    def run() -> float:
        start, made = time.perf_counter(), []
        progress = _FirstRow()
        outcome = run_batch(local_engine(options, lm), list(read_requests(lines)), frozenset(), settings,
                            lambda record: made.append(time.perf_counter()), progress, ordered=False)  # fmt: skip
        elapsed = time.perf_counter() - start
        first_row = min(progress.at or made[0], made[0])  # a record in order is written before its row's progress
        times.first_row_s, times.first_record_s = first_row - start, made[0] - start
        return outcome.tokens / elapsed

    return run


class _FirstRow:
    """A batch's progress that keeps when its first row ended."""

    def __init__(self) -> None:
        self.at: float | None = None

    def planned(self, rows: int, tokens: int) -> None:
        pass

    def token(self, row: int) -> None:
        pass

    def finished(self, row: int, tokens: int, max_tokens: int) -> None:
        self.at = self.at or time.perf_counter()


def run_contention(
    args: list[str], runs: int, tokens: int, log: Callable[[str], None] = lambda step: None, hog: CpuHog | None = None
) -> Contention:
    """Both pairs of sides, each quiet and under the hog, in ``runs`` rotating rounds."""
    from llmsample.engine.prompt import prompt_id_list

    hog = hog or CpuHog()
    log("loading the default run's model, and llama-cpp-python on its GGUF")
    lm = load_default(args)
    ours = DefaultGenerate(lm, [*args, "-n", str(tokens), "--ignore-eos", "--seed", "0"])
    peer = PeerGenerate(lm.model.path, lm.model.threads, lm.eos_ids)
    prompts = batch_prompts(BATCH)
    cfg = ours.job(PROMPT)[1].cfg
    ids = prompt_id_list(lm, PROMPT)
    many = [prompt_id_list(lm, p) for p in prompts]
    one_each = [dataclasses.replace(cfg, max_tokens=n, seed=i) for i, n in enumerate(lengths(tokens))]
    quiet_times, contended_times = BatchTimes(), BatchTimes()
    sides = [
        lambda: _rate(lambda: ours(PROMPT).tokens),
        lambda: _rate(lambda: peer(ids, cfg, ignore_eos=True)),
        our_batch(lm, args, prompts, tokens, quiet_times),
        lambda: _rate(lambda: sum(peer(p, c, ignore_eos=True) for p, c in zip(many, one_each, strict=True))),
    ]
    contended_batch = our_batch(lm, args, prompts, tokens, contended_times)
    try:
        sides[0](), sides[1]()  # first touch of the weights and buffers on both sides
        log(f"{runs} rounds: generate and a batch of {BATCH}, each side quiet and with a busy core")
        under = [*sides[:2], contended_batch, sides[3]]
        figures = rounds(runs, [*sides, *(_contended(hog, side) for side in under)])
    finally:
        hog.stop()
        peer.close()
    rows = [_degradation(name, figures[k], figures[k + 1], figures[k + 4], figures[k + 5])
            for name, k in (("generate", 0), (f"batch of {BATCH}", 2))]  # fmt: skip
    times = {"quiet": asdict(quiet_times), "contended": asdict(contended_times)}
    return Contention(lm.name, lm.quantization, lm.model.threads, tokens, runs, hog.core,
                      hasattr(os, "sched_setaffinity"), rows, times)  # fmt: skip


def _rate(run: Callable[[], int]) -> float:
    start = time.perf_counter()
    return run() / (time.perf_counter() - start)


def _contended(hog: CpuHog, side: Callable[[], float]) -> Callable[[], float]:
    def run() -> float:
        with hog.running():
            return side()

    return run


def _degradation(
    name: str, ours_q: list[float], theirs_q: list[float], ours_c: list[float], theirs_c: list[float]
) -> Degradation:
    import statistics

    ours = [c / q for c, q in zip(ours_c, ours_q, strict=True)]
    theirs = [c / q for c, q in zip(theirs_c, theirs_q, strict=True)]
    median = statistics.median
    return Degradation(name, median(ours_q), median(ours_c), median(theirs_q), median(theirs_c), median(ours),
                       median(theirs), paired_ratio(ours, theirs))  # fmt: skip


def table(result: Contention) -> Any:
    """Each pair's rates quiet and contended, degradations and their ratio; the batch's first
    row and first record."""
    from rich.table import Table

    pinned = f"pinned to core {result.hog_core}" if result.pinned else "unpinned"
    out = Table(title=f"a busy core ({pinned}): {result.model} ({result.gguf_type}), {result.threads} threads, "
                f"{result.tokens} tokens a request, medians of {result.runs}")  # fmt: skip
    for column in ("side", "ours quiet", "ours busy", "ours kept", "theirs quiet", "theirs busy", "theirs kept",
                   "ours/theirs (target ≥ 1)"):  # fmt: skip
        out.add_column(column, justify="left" if column == "side" else "right")
    for row in result.rows:
        out.add_row(row.name, f"{row.ours_quiet:.1f}", f"{row.ours_contended:.1f}", f"{row.ours_degradation:.0%}",
                    f"{row.theirs_quiet:.1f}", f"{row.theirs_contended:.1f}", f"{row.theirs_degradation:.0%}",
                    f"{row.ratio:.2f}")  # fmt: skip
    for phase, times in result.batch_times.items():
        out.caption = (out.caption + "; " if out.caption else "") + (
            f"batch {phase}: first row ended at {times['first_row_s']:.2f} s, first record out at "
            f"{times['first_record_s']:.2f} s"
        )
    return out


def bench_contended(options: dict[str, Any], err: Any) -> None:
    """``--contended``: run, write the JSON document, print the table."""
    from llmsample.bench.default_run import model_args
    from llmsample.bench.results import machine_info, write_results
    from llmsample.terminal import stdout_console, use_color

    args = model_args(options["model"], options["backend"], options.get("gguf_type"))
    tokens = min(options["tokens"], 64)
    result = run_contention(args, options["runs"], tokens, log=lambda step: err.print(f"[dim]bench: {step}…[/]"))
    document = {"kind": "bench-contended", "device": "cpu", "dtype": result.gguf_type or "gguf",
                "machine": machine_info().__dict__, **result.to_dict()}  # fmt: skip
    path = write_results(document, options["out"])
    stdout_console(use_color()).print(table(result))
    err.print(f"[dim]figures written to {path}[/]")
