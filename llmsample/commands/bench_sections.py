"""``llmsample bench``'s sections, one function each (``--serve``, ``--serve-peers``, ``--sweep``,
``--vs-llamacpp``, ``--contended``, ``--multi-turn``, ``--constraints``, ``--startup``, ``--quant``,
``--backend llama.cpp``, ``--workloads``, ``--suffix``, ``--batch-sizes``): each measures, prints
its table and writes its figures; :mod:`llmsample.commands.bench` picks one from the flags."""

from __future__ import annotations

from typing import Any

import click

from llmsample.errors import UserError
from llmsample.render.numbers import format_number


def step_log(err: Any) -> Any:
    """A section's progress lines on stderr."""
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
    result = run_serve_benchmark(_model_args(options), clients, requests, options["runs"], tokens, step_log(err))
    _write("bench-serve", result.to_dict(), table(result), options, err)


def bench_serve_peers(options: dict[str, Any], err: Any) -> None:
    """``--serve-peers``: our server against llama-server and llama_cpp.server on one GGUF."""
    from llmsample.bench.serve_peers import CLIENTS, ours, run_serve_peers, served_gguf, table

    gguf_type = options.get("gguf_type")
    side = ours(_model_args({**options, "backend": "llama.cpp"}), *(["--gguf-type", gguf_type] if gguf_type else []))
    gguf, threads = served_gguf(options["model"], gguf_type)
    counts = (options["clients"],) if options["clients"] else CLIENTS
    result = run_serve_peers(side, gguf, threads, counts, options["requests"], options["runs"],
                             min(options["tokens"], 64), step_log(err))  # fmt: skip
    _write("bench-serve-peers", result.to_dict(), table(result), {**options, "backend": "llama.cpp"}, err)


def bench_sweep(options: dict[str, Any], err: Any) -> None:
    """``--sweep``: a sweep against batch on the same rows."""
    from llmsample.bench.sweep_cost import run_sweep_cost, table

    result = run_sweep_cost(_model_args(options), options["runs"], min(options["tokens"], 64), step_log(err))
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
    result = run_multi_turn_benchmark(_model_args(options), turns, options["runs"], tokens, step_log(err))
    _write("bench-multi-turn", result.to_dict(), table(result), options, err)


def bench_constraints(options: dict[str, Any], err: Any) -> None:
    """``--constraints``: what a constraint costs a step, and how public schemas fare."""
    from llmsample.bench.constraint_cost import run_constraint_benchmark, table
    from llmsample.bench.results import machine_info, write_results
    from llmsample.models.loading import load_model

    lm = load_model(options["model"], options["device"], options["dtype"], backend=options["backend"])
    result = run_constraint_benchmark(lm, options["runs"], options["tokens"], step_log(err))
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
    result = run_startup_benchmark(options["runs"], min(options["tokens"], 64), step_log(err))
    document = {**result.to_dict(), "machine": machine_info().__dict__}
    path = write_document(document, options["out"] / f"bench-startup-cpu-{time.strftime('%Y%m%d-%H%M%S')}.json")
    click.echo(table(result))
    err.print(f"[dim]figures written to {path}[/]")


def bench_quant(options: dict[str, Any], err: Any) -> None:
    """``--quant``: what each quantization variant buys and costs, against float32."""
    from llmsample.bench.quant import run_quant_benchmark, table, write

    run = run_quant_benchmark(
        options["quant"], min(options["tokens"], 64), options["runs"], options["model"], options["device"], log=step_log(err)
    )
    path = write(run, options["out"])
    click.echo(table(run.results))
    err.print(f"[dim]figures written to {path}[/]")


def bench_llamacpp(options: dict[str, Any], err: Any) -> None:
    """``--backend llama.cpp``: our loop on llama.cpp against llama-cpp-python's own generation,
    our batch and our transformers path, on the same GGUF."""
    from llmsample.bench.llamacpp_peers import run_llamacpp_benchmark, table, write

    result = run_llamacpp_benchmark(
        options["model"], options["runs"], options["tokens"], log=step_log(err), gguf_type=options.get("gguf_type")
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
    rows = run_workload_benchmark(lm, options["runs"], tokens, log=step_log(err))
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
    rows = run_suffix_benchmark(lm, options["runs"], tokens, log=step_log(err))
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
        log=step_log(err),
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
