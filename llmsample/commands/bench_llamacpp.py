"""``llmsample bench --backend llama.cpp``: the llama.cpp section (:mod:`llmsample.bench_llamacpp`)."""

from __future__ import annotations

from typing import Any


def bench_llamacpp(options: dict[str, Any], err: Any) -> None:
    """Run it, write the figures as JSON beside the others, print the table."""
    from rich.table import Table

    from llmsample.bench import machine_info, write_results
    from llmsample.bench_llamacpp import run_llamacpp_benchmark
    from llmsample.render.numbers import format_number
    from llmsample.terminal import stdout_console, use_color

    result = run_llamacpp_benchmark(
        options["model"], options["runs"], options["tokens"], log=lambda step: err.print(f"[dim]bench: {step}…[/]")
    )
    document = {"kind": "bench-llamacpp", "model": options["model"] or "default", "device": "cpu",
                "dtype": "gguf", "machine": machine_info().__dict__, **result.to_dict()}  # fmt: skip
    path = write_results(document, options["out"])
    table = Table(
        title=f"llama.cpp backend, {document['model']}, {result.tokens} new tokens, {result.threads} threads, "
        f"median of {result.runs}"
    )
    table.add_column("side")
    table.add_column("tok/s", justify="right")
    rows = [
        ("llmsample on llama.cpp (full records)", result.ours_tok_s),
        ("llama-cpp-python's own generate", result.llama_cpp_python_tok_s),
        ("llmsample on llama.cpp, batch 8 (aggregate)", result.ours_batch8_tok_s),
        (f"llmsample on transformers ({result.transformers_dtype})", result.transformers_tok_s),
    ]
    for name, value in rows:
        table.add_row(name, format_number(value, 1))
    table.add_section()
    for name, value in result.ratios.items():
        table.add_row(name, f"{value:.2f}x")
    for backend, seconds in (("llama.cpp", result.start_llama_cpp_s), ("transformers", result.start_transformers_s)):
        table.add_row(f"fresh process to first token, {backend}", f"{format_number(seconds, 2)} s")
    stdout_console(use_color()).print(table)
    err.print(f"[dim]figures written to {path}[/]")
