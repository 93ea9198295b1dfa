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
from llmsample.commands.help import GroupedCommand
from llmsample.commands.model_options import model_options
from llmsample.errors import UserError
from llmsample.render.numbers import format_number


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
        log=_log(err), compile=options["compile_model"],
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


def _log(err: Any) -> Any:
    return lambda step: err.print(f"[dim]bench: {step}…[/]")


def _model_args(options: dict[str, Any]) -> Any:
    """The bench's model flags, for the processes a server's section starts."""
    from llmsample.bench.served import ModelArgs

    return ModelArgs(options["model"], options["device"], options["dtype"], options["backend"])


def _write(kind: str, figures: dict[str, Any], text: str, options: dict[str, Any], err: Any) -> None:
    """A section measured in processes of its own: its figures with the flags they ran with."""
    from llmsample.bench.results import machine_info, write_results
    from llmsample.models.device import resolve_device

    document = {
        "kind": kind, "model": options["model"] or "default", "backend": options["backend"],
        "device": str(resolve_device(options["device"])), "dtype": options["dtype"],
        "machine": machine_info().__dict__, "runs": options["runs"], **figures,
    }  # fmt: skip
    path = write_results(document, options["out"])
    click.echo(text)
    err.print(f"[dim]figures written to {path}[/]")


def bench_serve(options: dict[str, Any], err: Any) -> None:
    """``--serve``: the server under concurrent streaming clients against ``llmsample batch``."""
    from llmsample.bench.serve_load import run_serve_benchmark, table

    clients, requests, tokens = options["clients"] or 16, options["requests"] or 32, min(options["tokens"], 64)
    result = run_serve_benchmark(_model_args(options), clients, requests, options["runs"], tokens, _log(err))
    _write("bench-serve", result.to_dict(), table(result), options, err)


def bench_serve_peers(options: dict[str, Any], err: Any) -> None:
    """``--serve-peers``: our server against llama-server and llama_cpp.server on one GGUF."""
    from llmsample.bench.serve_peers import CLIENTS, ours, run_serve_peers, served_gguf, table

    gguf_type = options.get("gguf_type")
    side = ours(_model_args({**options, "backend": "llama.cpp"}), *(["--gguf-type", gguf_type] if gguf_type else []))
    gguf, threads = served_gguf(options["model"], gguf_type)
    counts = (options["clients"],) if options["clients"] else CLIENTS
    result = run_serve_peers(side, gguf, threads, counts, options["requests"], options["runs"],
                             min(options["tokens"], 64), _log(err))  # fmt: skip
    _write("bench-serve-peers", result.to_dict(), table(result), {**options, "backend": "llama.cpp"}, err)


def bench_sweep(options: dict[str, Any], err: Any) -> None:
    """``--sweep``: a sweep against batch on the same rows."""
    from llmsample.bench.sweep_cost import run_sweep_cost, table

    result = run_sweep_cost(_model_args(options), options["runs"], min(options["tokens"], 64), _log(err))
    _write("bench-sweep", result.to_dict(), table(result), options, err)


def bench_vs_llamacpp(options: dict[str, Any], err: Any) -> None:
    """``--vs-llamacpp``: the default run against llama-cpp-python on four workloads."""
    from llmsample.bench.vs_llamacpp import bench_vs_llamacpp as run

    run(options, err)


def bench_contended(options: dict[str, Any], err: Any) -> None:
    """``--contended``: both sides quiet and beside a busy core."""
    from llmsample.bench.contention import bench_contended as run

    run(options, err)


def bench_multi_turn(options: dict[str, Any], err: Any) -> None:
    """``--multi-turn``: a growing conversation with the server's prompt cache and without."""
    from llmsample.bench.multi_turn import run_multi_turn_benchmark, table

    turns, tokens = options["turns"] or 10, min(options["tokens"], 64)
    result = run_multi_turn_benchmark(_model_args(options), turns, options["runs"], tokens, _log(err))
    _write("bench-multi-turn", result.to_dict(), table(result), options, err)


def bench_constraints(options: dict[str, Any], err: Any) -> None:
    """``--constraints``: what a constraint costs a step, and how public schemas fare."""
    from llmsample.bench.constraint_cost import run_constraint_benchmark, table
    from llmsample.bench.results import machine_info, write_results
    from llmsample.models.loading import load_model

    lm = load_model(options["model"], options["device"], options["dtype"], backend=options["backend"])
    result = run_constraint_benchmark(lm, options["runs"], options["tokens"], _log(err))
    dtype = lm.quantization or str(lm.dtype).removeprefix("torch.")
    document = {
        "kind": "bench-constraints", "model": lm.name, "backend": lm.backend, "device": str(lm.device),
        "dtype": dtype, "machine": machine_info().__dict__, "runs": options["runs"], **result.to_dict(),
    }  # fmt: skip
    path = write_results(document, options["out"])
    click.echo(table(result))
    err.print(f"[dim]figures written to {path}[/]")


def bench_startup(options: dict[str, Any], err: Any) -> None:
    """``--startup``: what a command waits for before its first token, cold and warm (the
    default model; at most 64 tokens per caller)."""
    import time

    from llmsample.bench.first_token import run_startup_benchmark, table
    from llmsample.bench.results import machine_info, write_document

    if options["model"] is not None:
        raise UserError("--startup measures the default model on both backends; leave out --model")
    result = run_startup_benchmark(options["runs"], min(options["tokens"], 64), _log(err))
    document = {**result.to_dict(), "machine": machine_info().__dict__}
    path = write_document(document, options["out"] / f"bench-startup-cpu-{time.strftime('%Y%m%d-%H%M%S')}.json")
    click.echo(table(result))
    err.print(f"[dim]figures written to {path}[/]")


def bench_quant(options: dict[str, Any], err: Any) -> None:
    """``--quant``: what each quantization variant buys and costs, against float32."""
    from llmsample.bench.quant import run_quant_benchmark, table, write

    run = run_quant_benchmark(
        options["quant"], min(options["tokens"], 64), options["runs"], options["model"], options["device"], log=_log(err)
    )
    path = write(run, options["out"])
    click.echo(table(run.results))
    err.print(f"[dim]figures written to {path}[/]")


def bench_llamacpp(options: dict[str, Any], err: Any) -> None:
    """``--backend llama.cpp``: our loop on llama.cpp against llama-cpp-python's own generation,
    our batch and our transformers path, on the same GGUF."""
    from llmsample.bench.llamacpp_peers import run_llamacpp_benchmark, table, write

    result = run_llamacpp_benchmark(
        options["model"], options["runs"], options["tokens"], log=_log(err), gguf_type=options.get("gguf_type")
    )
    path = write(result, options["out"])
    click.echo(
        f"llama.cpp backend, {result.model} ({result.quantization}), {result.tokens} new tokens, "
        f"{result.threads} threads, median of {result.runs}"
    )
    click.echo(table(result))
    err.print(f"[dim]figures written to {path}[/]")


def bench_workloads(options: dict[str, Any], err: Any) -> None:
    """``--workloads``: what users' batch runs cost against their easiest form, ratios in one run."""
    from rich.table import Table

    from llmsample.bench.results import machine_info, write_results
    from llmsample.bench.workloads import rows_to_dict, run_workload_benchmark
    from llmsample.models.loading import load_model
    from llmsample.terminal import stdout_console, use_color

    lm = load_model(options["model"], options["device"], options["dtype"])
    tokens = min(options["tokens"], 64)
    rows = run_workload_benchmark(lm, options["runs"], tokens, log=_log(err))
    document = {
        "kind": "bench-workloads", "model": lm.name, "device": str(lm.device), "dtype": str(lm.dtype).removeprefix("torch."),
        "machine": machine_info().__dict__, "new_tokens": tokens, "runs": options["runs"], "rows": rows_to_dict(rows),
    }  # fmt: skip
    path = write_results(document, options["out"])
    table = Table(title=f"batch workloads, {lm.name} ({document['dtype']}), medians of {options['runs']}")
    for column in ("workload", "tok/s", "baseline", "tok/s", "ratio"):
        table.add_column(column, justify="left" if column in ("workload", "baseline") else "right")
    for row in rows:
        table.add_row(row.workload, f"{row.tok_s:.1f}", row.baseline, f"{row.baseline_tok_s:.1f}", f"{row.ratio:.2f}")
    stdout_console(use_color()).print(table)
    err.print(f"[dim]figures written to {path}[/]")


def bench_suffix(options: dict[str, Any], err: Any) -> None:
    """``--suffix``: the cross-request drafter on its cases (records, code edits) and on open chat, ratios in one run."""
    from rich.table import Table

    from llmsample.bench.results import machine_info, write_results
    from llmsample.bench.suffix_drafting import rows_to_dict, run_suffix_benchmark
    from llmsample.models.loading import load_model
    from llmsample.terminal import stdout_console, use_color

    lm = load_model(options["model"], options["device"], options["dtype"], backend=options["backend"])
    tokens = min(options["tokens"], 48)
    rows = run_suffix_benchmark(lm, options["runs"], tokens, log=_log(err))
    dtype = lm.quantization or str(lm.dtype).removeprefix("torch.")
    document = {
        "kind": "bench-suffix", "model": lm.name, "backend": lm.backend, "device": str(lm.device), "dtype": dtype,
        "machine": machine_info().__dict__, "new_tokens": tokens, "runs": options["runs"], "rows": rows_to_dict(rows),
    }  # fmt: skip
    path = write_results(document, options["out"])
    table = Table(title=f"--draft suffix, {lm.name} ({lm.backend}, {dtype}), medians of {options['runs']}")
    for column in ("workload", "tok/s", "plain tok/s", "ratio", "bar", "accepted", "tokens/pass"):
        table.add_column(column, justify="left" if column == "workload" else "right")
    for row in rows:
        table.add_row(row.workload, f"{row.tok_s:.1f}", f"{row.plain_tok_s:.1f}", f"{row.ratio:.2f}",
                      f"{row.bar:.2f}", f"{row.acceptance_rate:.0%}", f"{row.tokens_per_pass:.2f}")  # fmt: skip
    stdout_console(use_color()).print(table)
    err.print(f"[dim]figures written to {path}[/]")


def bench_batch(options: dict[str, Any], err: Any) -> None:
    """``--batch-sizes``: the batch section alone (it takes minutes of its own)."""
    from rich.table import Table

    from llmsample.bench.batch_sizes import rows_to_dict, run_batch_benchmark
    from llmsample.bench.results import CAPTION, REFERENCE_COLUMNS, machine_info, write_results
    from llmsample.bench.sides import as_transformers_loads
    from llmsample.models.loading import load_model
    from llmsample.terminal import stdout_console, use_color

    lm = load_model(options["model"], options["device"], options["dtype"])
    rows = run_batch_benchmark(
        lm, as_transformers_loads(lm, options["model"], lm.dtype), options["batch_sizes"], runs=options["runs"], tokens=min(options["tokens"], 64),
        log=_log(err),
    )  # fmt: skip
    document = {
        "kind": "bench-batch", "model": lm.name, "device": str(lm.device), "dtype": str(lm.dtype).removeprefix("torch."),
        "machine": machine_info().__dict__, "prompts": 32, "new_tokens": min(options["tokens"], 64),
        "runs": options["runs"], "rows": rows_to_dict(rows),
    }  # fmt: skip
    path = write_results(document, options["out"])
    table = Table(title=f"batch decoding, {lm.name}, {document['dtype']} on {document['device']}", caption=CAPTION)
    headers = ("batch", "llmsample", *REFERENCE_COLUMNS, "vs batch 1", "model share")
    for header in headers:
        table.add_column(header, justify="right")
    base = rows[0].ours_tok_s if rows and rows[0].batch_size == 1 else None
    for row in rows:
        table.add_row(
            str(row.batch_size), format_number(row.ours_tok_s, 1), format_number(row.reference_tok_s, 1),
            format_number(row.ratio), format_number(row.loaded_reference_tok_s, 1), format_number(row.loaded_ratio),
            format_number(row.ours_tok_s / base if base else None), f"{row.model_share:.0%}",
        )  # fmt: skip
    stdout_console(use_color()).print(table)
    err.print(f"[dim]figures written to {path}[/]")
