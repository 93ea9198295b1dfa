"""What ``llmsample bench`` measured, as typed figures, the machine they were taken on, and
writing them. Torch-free on import: the table and the JSON file are made from these without the
model stack. ``to_dict`` keeps the JSON keys of earlier results, so files from before and after
stay comparable."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmsample.errors import UserError
from llmsample.render.numbers import format_number


@dataclass(frozen=True)
class Machine:
    """Where the figures were taken: they only compare on the same machine and versions."""

    platform: str
    processor: str
    cpu_capability: str
    threads: int
    python: str
    torch: str
    transformers: str


@dataclass(frozen=True)
class Workload:
    """One prompt and setting: medians over the runs, our loop against transformers' generate."""

    workload: str
    ours_tok_s: float
    reference_tok_s: float | None
    ratio: float | None
    ttft_s: float | None
    runs: int


@dataclass(frozen=True)
class Generate(Workload):
    """A single-stream row: ``ratio`` against ``generate`` on our loaded model (the loops alone),
    ``loaded_ratio`` against ``generate`` on the model as transformers' users load it at the same
    dtype (what a user of either gets: our load reorders the weights for the CPU's kernels,
    :mod:`llmsample.models.prepacked`)."""

    loaded_reference_tok_s: float
    loaded_ratio: float


@dataclass(frozen=True)
class Speculation(Workload):
    """n-gram speculation against transformers' prompt lookup, and against our plain loop."""

    speedup_over_plain: float
    acceptance_rate: float
    tokens_per_pass: float


@dataclass(frozen=True)
class Defaults(Workload):
    """``llmsample generate``'s defaults (eager, ``--dtype auto``) against transformers' on the
    same prompt and preset: what each side runs without being told."""

    ours_dtype: str
    reference_dtype: str


@dataclass(frozen=True)
class StageCost:
    """One of the newer stages turned on over the inspection's preset: the pipeline's seconds per
    step with it, what it adds to the preset's (negative where it replaces stages, as mirostat
    does the truncation), and that against a decode step of plain text."""

    stage: str
    s_per_step: float
    extra_s_per_step: float
    share_of_step: float


@dataclass(frozen=True)
class Inspection:
    """What the per-token numbers cost: JSON lines against plain text, and the sampling
    pipeline's own time per step (model excluded)."""

    text_tok_s: float
    jsonl_tok_s: float
    jsonl_over_text: float
    pipeline_s_per_step: float
    pipeline_share_of_step: float
    stages: tuple[StageCost, ...] = ()  # added after, at the end


@dataclass(frozen=True)
class Bandwidth:
    """The memory-bandwidth bound on decoding (every weight read once per token) and how close
    the best greedy workload comes to it."""

    copy_gb_s: float
    weight_mb: float
    bound_tok_s: float
    best_greedy_tok_s: float
    fraction_of_bound: float


@dataclass(frozen=True)
class StartUp:
    """A fresh process until the model is ready (``start_s``), and a second load in it (``load_s``)."""

    start_s: float
    load_s: float

    @property
    def imports_s(self) -> float:
        return self.start_s - self.load_s


@dataclass(frozen=True)
class BenchResults:
    """One benchmark run. ``cold_load_s`` is None without a shipped GGUF; it is left out of the
    JSON file when ``cold`` was not asked for, as before."""

    machine: Machine
    model: str
    device: str
    dtype: str
    new_tokens: int
    runs: int
    compile: bool
    start_up: StartUp
    generate: tuple[Generate, ...]
    compile_s: float | None
    speculative: Speculation
    inspection: Inspection
    bandwidth: Bandwidth
    cold: bool
    cold_load_s: float | None
    peak_rss_mb: float
    defaults: tuple[Defaults, ...] = ()  # measured when the bench runs at the defaults (--dtype auto, eager)

    def to_dict(self) -> dict[str, Any]:
        """The JSON file's document, its keys in the order they always had."""
        document: dict[str, Any] = {
            "machine": dataclasses.asdict(self.machine),
            "model": self.model,
            "device": self.device,
            "dtype": self.dtype,
            "new_tokens": self.new_tokens,
            "runs": self.runs,
            "compile": self.compile,
            "warm_start_s": self.start_up.start_s,
            "warm_load_s": self.start_up.load_s,
            "generate": [dataclasses.asdict(row) for row in self.generate],
            "compile_s": self.compile_s,
            "speculative": dataclasses.asdict(self.speculative),
            "inspection": {**dataclasses.asdict(self.inspection), "stages": [*map(dataclasses.asdict, self.inspection.stages)]},
            "bandwidth": dataclasses.asdict(self.bandwidth),
        }
        if self.cold:
            document["cold_load_s"] = self.cold_load_s
        document["peak_rss_mb"] = self.peak_rss_mb
        if self.defaults:
            document["defaults"] = [dataclasses.asdict(row) for row in self.defaults]
        return document


def machine_info() -> Machine:
    """This machine and the versions that matter (torch imported here, not on import)."""
    import torch
    import transformers

    return Machine(
        platform=platform.platform(),
        processor=platform.processor() or platform.machine(),
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        threads=torch.get_num_threads(),
        python=platform.python_version(),
        torch=torch.__version__,
        transformers=transformers.__version__,
    )


def write_document(document: dict[str, Any], path: Path) -> Path:
    """``document`` as JSON at ``path``, written to a hidden sibling and renamed, so a full disk
    or a kill never leaves a truncated JSON where the results go."""
    partial = path.parent / f".{path.name}.partial-{os.getpid()}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(document, indent=2))
        partial.replace(path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise UserError(
            f"cannot write the benchmark results to {path.parent} ({exc.strerror or exc}); "
            "free some space or pass --out with a writable directory"
        ) from exc
    return path


def write_results(document: dict[str, Any], directory: Path) -> Path:
    """A benchmark's document (``BenchResults.to_dict()`` or a section's) in ``directory``, named
    by its kind, device, dtype and the time."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    kind = document.get("kind", "bench")
    name = f"{kind}-{document['device'].replace(':', '')}-{document['dtype']}-{stamp}.json"
    return write_document(document, directory / name)


REFERENCE_COLUMNS = ("same model", "ratio", "own load", "ratio")
"""transformers' ``generate`` (tok/s, and ours over it) on our loaded model (the loops alone), then
on the model as its users load it at the same dtype (what a user of either gets): ``CAPTION``."""
CAPTION = (
    "tok/s; transformers' generate on our loaded model (same model) and on the model as transformers loads it "
    "(own load)"
)


def results_table(results: BenchResults) -> Any:
    """The Markdown-friendly table the README's Performance section shows."""
    from rich.table import Table

    m = results.machine
    title = (
        f"{results.model} · {results.device} · {results.dtype} · {results.new_tokens} new tokens · "
        f"median of {results.runs} · torch {m.torch} · transformers {m.transformers} · {m.cpu_capability}, "
        f"{m.threads} threads"
    )
    table = Table(title=title, caption=CAPTION, header_style="bold")
    for name in ("workload", "llmsample tok/s", *REFERENCE_COLUMNS, "TTFT s"):
        table.add_column(name, justify="left" if name == "workload" else "right")
    for row in results.generate:
        table.add_row(
            row.workload,
            format_number(row.ours_tok_s, 1),
            format_number(row.reference_tok_s, 1),
            format_number(row.ratio, 2),
            format_number(row.loaded_reference_tok_s, 1),
            format_number(row.loaded_ratio, 2),
            format_number(row.ttft_s, 2),
        )
    spec = results.speculative
    table.add_row(
        "code-rewrite / ngram speculation (vs prompt_lookup_num_tokens=10)",
        format_number(spec.ours_tok_s, 1), format_number(spec.reference_tok_s, 1), format_number(spec.ratio, 2),
        "", "", "",
    )  # fmt: skip
    for row in results.defaults:  # against transformers' own load (its default dtype: the row's name says)
        table.add_row(
            row.workload, format_number(row.ours_tok_s, 1), "", "", format_number(row.reference_tok_s, 1),
            format_number(row.ratio, 2), format_number(row.ttft_s, 2),
        )  # fmt: skip
    table.add_section()
    for name, value in notes(results):
        table.add_row(name, value, "", "", "", "", "")
    return table


def notes(results: BenchResults) -> list[tuple[str, str]]:
    """The figures under the table, one line each."""
    spec, inspect, bw, start = results.speculative, results.inspection, results.bandwidth, results.start_up
    return [
        (
            "ngram speedup over our plain loop",
            f"{spec.speedup_over_plain:.2f}x (acceptance {spec.acceptance_rate:.0%})",
        ),
        ("jsonl --top-n 5 vs plain text", f"{inspect.jsonl_over_text:.2f}x"),
        (
            "sampling + inspection per step",
            f"{inspect.pipeline_s_per_step * 1000:.2f} ms ({inspect.pipeline_share_of_step:.1%} of a step)",
        ),
        *(
            (f"+ {cost.stage} per step", f"{cost.extra_s_per_step * 1000:+.2f} ms ({cost.share_of_step:+.1%} of a step)")
            for cost in inspect.stages
        ),
        ("memory bandwidth (copy)", f"{bw.copy_gb_s:.1f} GB/s; weights {bw.weight_mb:.0f} MB"),
        ("bandwidth bound / reached", f"{bw.bound_tok_s:.1f} tok/s / {bw.fraction_of_bound:.0%}"),
        (
            "warm start: imports + load",
            f"{start.start_s:.2f} s = {start.imports_s:.2f} s + {start.load_s:.2f} s",
        ),
        ("cold load (GGUF conversion)", f"{format_number(results.cold_load_s, 1)} s"),
        ("peak resident memory", f"{results.peak_rss_mb:.0f} MB"),
    ]
