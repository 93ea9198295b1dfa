"""``llmsample bench --sweep``: what a sweep's measuring costs. The same rows (the sweep's own
lines, ``sweep --plan``) decoded by ``llmsample sweep`` and by ``llmsample batch``, each a fresh
process per round, the order rotating (:func:`~llmsample.bench.timing.rounds`); tokens per
second from each process's wall clock, load included on both sides alike."""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from llmsample.bench.prompts import batch_prompts
from llmsample.bench.served import ModelArgs
from llmsample.bench.timing import paired_ratio, rounds

GRID = ("--vary", "temperature=0.7,1.0", "--vary", "min_p=0,0.05")
PROMPTS, SEEDS = 8, 2


@dataclass(frozen=True)
class SweepCost:
    rows: int
    tokens: int  # new tokens at most per row
    sweep_tok_s: list[float]
    batch_tok_s: list[float]

    @property
    def ratio(self) -> float:
        """The sweep's tokens per second over batch's, the median of the rounds' own ratios."""
        return paired_ratio(self.sweep_tok_s, self.batch_tok_s)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}


def run_sweep_cost(args: ModelArgs, runs: int, tokens: int, log: Callable[[str], None]) -> SweepCost:
    with tempfile.TemporaryDirectory(prefix="llmsample-bench-sweep-") as folder:
        work = Path(folder)
        (work / "prompts.txt").write_text("\n".join(batch_prompts(PROMPTS)) + "\n")
        sweep = ["sweep", "prompts.txt", *GRID, "--seeds", str(SEEDS), "-n", str(tokens), "--local", "-q"]
        plan = _cli(work, [*sweep, "--plan"], args)
        (work / "lines.jsonl").write_text(plan.stdout)
        rows = len(plan.stdout.splitlines())
        counter = iter(range(10**6))

        def side(name: str, command: list[str]) -> Callable[[], float]:
            def run() -> float:
                out = work / f"{name}-{next(counter)}.jsonl"
                log(f"{name}, {rows} rows")
                start = time.perf_counter()
                _cli(work, [*command, "-o", str(out)], args)
                seconds = time.perf_counter() - start
                return _tokens(out) / seconds

            return run

        swept, batched = rounds(runs, [side("sweep", sweep), side("batch", ["batch", "lines.jsonl", "--local", "-q"])])
    return SweepCost(rows, tokens, swept, batched)


def table(cost: SweepCost) -> str:
    return (f"{cost.rows} rows of at most {cost.tokens} tokens, median of {len(cost.sweep_tok_s)} rounds:\n"
            f"  sweep  {statistics.median(cost.sweep_tok_s):.1f} tok/s\n"
            f"  batch  {statistics.median(cost.batch_tok_s):.1f} tok/s\n"
            f"  sweep / batch {cost.ratio:.2f}x")  # fmt: skip


def _cli(work: Path, command: list[str], args: ModelArgs) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "llmsample", command[0], *args.flags(), *command[1:]], cwd=work,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        from llmsample.errors import RuntimeFailure

        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
        raise RuntimeFailure(f"llmsample {command[0]} failed: {last}")
    return done


def _tokens(path: Path) -> int:
    import json

    return sum(json.loads(line).get("tokens", 0) for line in path.read_text().splitlines())
