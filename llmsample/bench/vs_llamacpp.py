"""``bench --vs-llamacpp``: what ``llmsample generate`` runs by default (:mod:`llmsample.bench.default_run`:
the command's own options, job and engine, so whatever it drafts by default) against
llama-cpp-python's plain ``Llama.generate`` on the same GGUF file with the same threads, on the
four workloads users run (:mod:`llmsample.bench.user_prompts`), greedy and sampled (the default
preset: temperature 0.7, top-k 40, top-p 0.9), side by side in rotating rounds, ratios of
rounds (:mod:`llmsample.bench.timing`).

Both sides get the same prompt ids (the chat template applied once, by our tokenizer), the
same settings (the peer's read from our job's, :func:`~llmsample.bench.peer_llama.peer_arguments`),
a seed per request, and run to an end-of-sequence id or ``--tokens``, whichever comes first,
tokens counted: EOS ignored, a drafting side would be timed on what the model writes after its
answer (repeats, easy to draft) rather than on the answer. Greedy, both sides write the same
answer; sampled, each its own draws, so the rate is each side's tokens over its time, prefill
included."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from llmsample.bench.default_run import Counts, DefaultGenerate, load_default
from llmsample.bench.peer_llama import PeerGenerate
from llmsample.bench.timing import paired_ratio, rounds
from llmsample.bench.user_prompts import TARGETS, WORKLOADS

MODES = {"greedy": ["-t", "0"], "sampled": []}
"""A mode's flags on top of the default run's (sampled: the default preset as it is)."""


@dataclass(frozen=True)
class PeerRow:
    """One workload in one mode: medians of tokens/s, the median of the rounds' ratios, and the
    last round's counts (``drafted``/``accepted``: our drafts, zero without drafting)."""

    workload: str
    mode: str
    requests: int
    ours_tok_s: float
    llama_cpp_python_tok_s: float
    ratio: float
    target: float
    ours_tokens: int
    llama_cpp_python_tokens: int
    drafted: int
    accepted: int


@dataclass(frozen=True)
class VsLlamaCpp:
    model: str
    gguf_type: str | None
    threads: int
    tokens: int  # the cap on an answer
    runs: int
    default_args: list[str]  # the model flags the default run was given
    rows: list[PeerRow]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Workload:
    """One workload's two sides in one mode, each a callable giving tokens/s over its requests."""

    def __init__(self, ours: DefaultGenerate, peer: PeerGenerate, prompts: Sequence[str], flags: list[str]) -> None:
        self.jobs = [ours.job(prompt, [*flags, "--seed", str(i)])[1] for i, prompt in enumerate(prompts)]
        self.asks = [(prompt, [*flags, "--seed", str(i)]) for i, prompt in enumerate(prompts)]
        self.ids = [prompt_ids(ours, job) for job in self.jobs]
        self.ours_side, self.peer = ours, peer
        self.ours_counts, self.peer_tokens = Counts(), 0

    def ours(self) -> float:
        start, counts = time.perf_counter(), Counts()
        for prompt, flags in self.asks:
            counts.add(self.ours_side(prompt, flags))
        self.ours_counts = counts
        return counts.tokens / (time.perf_counter() - start)

    def theirs(self) -> float:
        start = time.perf_counter()
        self.peer_tokens = sum(self.peer(ids, job.cfg) for ids, job in zip(self.ids, self.jobs, strict=True))
        return self.peer_tokens / (time.perf_counter() - start)


def prompt_ids(ours: DefaultGenerate, job: Any) -> list[int]:
    """The ids our engine decodes for ``job`` (its chat template, its system prompt)."""
    from llmsample.engine.prompt import prompt_id_list

    return prompt_id_list(ours.lm, job.prompt, job.system, job.raw, job.truncate)


def run_vs_llamacpp(
    args: list[str], runs: int, tokens: int, log: Callable[[str], None] = lambda step: None
) -> VsLlamaCpp:
    """Every workload in both modes, ours against the peer in ``runs`` rotating rounds."""
    log("loading the default run's model, and llama-cpp-python on its GGUF")
    lm = load_default(args)
    base = [*args, "-n", str(tokens)]
    ours = DefaultGenerate(lm, base)
    peer = PeerGenerate(lm.model.path, lm.model.threads, lm.eos_ids)
    try:
        warm = Workload(ours, peer, ["Say hello."], ["-n", "8"])
        warm.ours(), warm.theirs()  # first touch of the weights and buffers on both sides
        rows = []
        for name, make_prompts in WORKLOADS.items():
            prompts = make_prompts()
            for mode, flags in MODES.items():
                log(f"{name}, {mode}: {len(prompts)} requests, {runs} rounds")
                sides = Workload(ours, peer, prompts, flags)
                mine, theirs = rounds(runs, [sides.ours, sides.theirs])
                counts = sides.ours_counts
                rows.append(PeerRow(
                    name, mode, len(prompts), statistics.median(mine), statistics.median(theirs),
                    paired_ratio(mine, theirs), TARGETS[name], counts.tokens, sides.peer_tokens,
                    counts.drafted, counts.accepted,
                ))  # fmt: skip
    finally:
        peer.close()
    return VsLlamaCpp(lm.name, lm.quantization, lm.model.threads, tokens, runs, args, rows)


def table(result: VsLlamaCpp) -> Any:
    """The rows as a rich table (ratios against the issue's targets)."""
    from rich.table import Table

    title = (f"the default run against llama-cpp-python, {result.model} ({result.gguf_type}), {result.threads} "
             f"threads, at most {result.tokens} tokens an answer, medians of {result.runs}")  # fmt: skip
    out = Table(title=title)
    for column in ("workload", "mode", "ours tok/s", "llama-cpp-python tok/s", "ratio", "target", "accepted",
                   "tokens (ours/theirs)"):  # fmt: skip
        out.add_column(column, justify="left" if column in ("workload", "mode") else "right")
    for row in result.rows:
        accepted = f"{row.accepted}/{row.drafted}" if row.drafted else "-"
        out.add_row(row.workload, row.mode, f"{row.ours_tok_s:.1f}", f"{row.llama_cpp_python_tok_s:.1f}",
                    f"{row.ratio:.2f}", f"{row.target:.2f}", accepted,
                    f"{row.ours_tokens}/{row.llama_cpp_python_tokens}")  # fmt: skip
    return out


def bench_vs_llamacpp(options: dict[str, Any], err: Any) -> None:
    """``--vs-llamacpp``: run, write the JSON document, print the table."""
    from llmsample.bench.default_run import model_args
    from llmsample.bench.results import machine_info, write_results
    from llmsample.terminal import stdout_console, use_color

    args = model_args(options["model"], options["backend"], options.get("gguf_type"))
    result = run_vs_llamacpp(
        args, options["runs"], options["tokens"], log=lambda step: err.print(f"[dim]bench: {step}…[/]")
    )
    document = {"kind": "bench-vs-llamacpp", "device": "cpu", "dtype": result.gguf_type or "gguf",
                "machine": machine_info().__dict__, **result.to_dict()}  # fmt: skip
    path = write_results(document, options["out"])
    stdout_console(use_color()).print(table(result))
    err.print(f"[dim]figures written to {path}[/]")
