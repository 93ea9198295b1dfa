"""``llmsample batch``: a file of requests decoded together in one process, one output line each."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from llmsample.commands.options import (
    check_utf8_option,
    constraint_options,
    draft_options,
    end_rank,
    load_model_with_progress,
    model_options,
    quiet_option,
    reference_option,
    resolve_sampling,
    sampling_options,
    sampling_overrides,
)
from llmsample.errors import Interrupted, UserError


@click.command()
@click.argument("input_path", metavar="[INPUT]", default="-", type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Write here (resumes a partial file)."
)
@model_options
@sampling_options
@constraint_options
@click.option("--system", metavar="TEXT", callback=check_utf8_option, help="System message for prompts without one.")
@click.option("--raw", is_flag=True, help="Plain-text prompts go to the model as they are, without the chat template.")
@click.option("--truncate", type=click.Choice(["error", "left"]), default="error", show_default=True)
@click.option("--format", "fmt", type=click.Choice(["jsonl", "openai"]), default="jsonl", show_default=True)
@click.option(
    "--tokens",
    type=click.Choice(["none", "ids", "full"]),
    default="full",
    show_default=True,
    help="Per-token data in each record: none, ids and probabilities, or every figure.",
)
@click.option("--top-n", type=click.IntRange(0, 100), default=5, show_default=True, help="Alternatives per token.")
@click.option("--batch-size", type=click.IntRange(1, 1024), help="Rows decoded together [default: by memory].")
@click.option("--ignore-eos", is_flag=True, help="Keep going past end-of-sequence (benchmarks).")
@draft_options
@reference_option
@quiet_option("progress")
def batch(**options: Any) -> None:
    """Decode many requests in one process, together, with every token's figures.

    INPUT (a file, or - for stdin) has one request per line: plain text (a prompt), JSON with
    "prompt" or "messages" and any preset key, or OpenAI Batch lines. Output: one line per
    request, in input order; with -o an existing file is resumed.

    \b
    llmsample batch questions.txt -o answers.jsonl
    llmsample batch requests.jsonl --preset code --max-tokens 200 --tokens none
    llmsample batch openai-batch.jsonl --format openai -o results.jsonl
    llmsample batch rewrites.jsonl --draft ngram    # speculation per request, verified together
    """
    from llmsample.batch.distributed import existing_parts, launched_ranks, merge_parts
    from llmsample.batch.requests import read_requests
    from llmsample.batch.resume import prepare_resume
    from llmsample.batch.run import BatchSettings
    from llmsample.sampling import presets as preset_store

    if options["compile_model"]:
        raise UserError(
            "--compile decodes rows of one prompt in lockstep over a static cache, and batch requests have "
            "their own prompts; leave it out (batch decodes eagerly)"
        )
    # bad flags, an unknown preset and a bad constraint fail before anything runs
    constraint = resolve_sampling(options)[1].constraint
    overrides = {key: value for key, value in sampling_overrides(options).items() if value is not None}
    if constraint is not None:
        overrides["constraint"] = constraint
    settings = BatchSettings(
        preset=options["preset"],
        preset_file=options["preset_file"],
        overrides=overrides,
        system=options["system"],
        raw=options["raw"],
        truncate=options["truncate"],
        top_n=options["top_n"],
        ignore_eos=options["ignore_eos"],
        tokens=options["tokens"],
        fmt=options["fmt"],
        batch_size=options["batch_size"],
        draft_tokens=options["draft_tokens"],
    )
    parsed = list(read_requests(_input_lines(options["input_path"]), known_presets=preset_store.discover().keys()))
    ranks = launched_ranks()
    if ranks.world == 1:
        if options["output"] and existing_parts(options["output"]):  # a run over several processes was cut short
            merge_parts(options["output"], parsed, resume=options["fmt"])
        done = prepare_resume(options["output"], options["fmt"]).done if options["output"] else frozenset()
        lm = load_model_with_progress(options)
        if _run(lm, parsed, done, settings, options).failed:
            raise click.exceptions.Exit(1)
    else:
        _run_distributed(parsed, settings, options, ranks)


def _run_distributed(parsed: list[Any], settings: Any, options: dict[str, Any], ranks: Any) -> None:
    """Under torchrun: this rank's share into its part file; rank 0 merges when all are done."""
    import os

    import torch
    import torch.distributed as dist

    from llmsample.batch.distributed import finished_everywhere, merge_parts, my_share, part_path

    output = options["output"]
    if output is None:
        raise UserError("a batch over several processes needs -o FILE (each rank writes its part next to it)")
    # torchrun's rendezvous (one machine or many). Not accelerate's PartialState: on CPUs it does
    # not treat a torchrun launch as distributed, so its barriers would not wait.
    cuda = torch.cuda.is_available() and options["device"] in ("auto", "cuda")
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if cuda:
        options = {**options, "device": f"cuda:{local_rank}"}
    else:  # the ranks on one machine share its cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    if ranks.main:  # rank 0 repairs torn files before anyone reads them
        finished_everywhere(output, options["fmt"])
    dist.barrier()
    done = finished_everywhere(output, options["fmt"])
    dist.barrier()  # nobody writes a part before every rank has read them all
    options = {**options, "output": part_path(output, ranks), "quiet": options["quiet"] or not ranks.main}
    lm = load_model_with_progress(options)
    failed = torch.zeros(1, device=lm.device if cuda else "cpu")
    try:
        failed += _run(lm, my_share(parsed, ranks), done, settings, options).failed
    finally:
        dist.barrier()
        if ranks.main:
            merge_parts(output, parsed)
        dist.barrier()  # no rank may end (and have the launcher stop the rest) mid-merge
    dist.all_reduce(failed)
    end_rank(1 if ranks.main and failed.item() else 0)  # one exit status for the run, from rank 0


def _input_lines(path: str) -> list[bytes]:
    """Raw bytes per line: invalid UTF-8 is an error record for its line, not for the run."""
    if path == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise UserError("no input: pass a file of requests, or pipe them on stdin")
        return sys.stdin.buffer.read().splitlines(keepends=True)
    try:
        return Path(path).read_bytes().splitlines(keepends=True)
    except OSError as exc:
        raise UserError(f"cannot read {path} ({exc.strerror}); pass a file of requests, one per line") from exc


def _run(lm: Any, parsed: list[Any], done: frozenset[str], settings: Any, options: dict[str, Any]) -> Any:
    """Decode with a progress bar on stderr (a terminal only); exit 130/143 when interrupted, with
    every finished record written. Returns the outcome (how many requests failed)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from llmsample.batch.responses import dumps
    from llmsample.batch.resume import Appender
    from llmsample.batch.run import run_batch
    from llmsample.commands.generate import build_drafter, load_reference
    from llmsample.terminal import stderr_console

    drafter = build_drafter(options, lm) if options["draft"] else None
    reference = load_reference(options, lm) if options["reference"] else None
    todo = sum(1 for r in parsed if getattr(r, "custom_id", None) not in done)
    appender = Appender(options["output"]) if options["output"] else None

    def write(record: dict[str, Any]) -> None:
        if appender is not None:
            appender.write(record)
        else:
            sys.stdout.write(dumps(record) + "\n")
            sys.stdout.flush()

    console = stderr_console()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]}"), TimeRemainingColumn())  # fmt: skip
    disabled = options["quiet"] or not console.is_terminal
    try:
        with Progress(*columns, console=console, transient=True, disable=disabled) as progress:
            task = progress.add_task("requests", total=todo, rate="")
            generated = 0

            def finished(tokens: int) -> None:
                nonlocal generated
                generated += tokens
                elapsed = progress.tasks[task].elapsed or 0.0
                rate = f"{generated / elapsed:.1f} tok/s" if elapsed else ""
                progress.update(task, advance=1, rate=rate)

            outcome = run_batch(lm, parsed, done, settings, write, finished, drafter=drafter, reference=reference)
    except KeyboardInterrupt as exc:
        raise click.exceptions.Exit(130) from exc
    except Interrupted as exc:
        raise click.exceptions.Exit(exc.exit_code) from exc
    finally:
        if appender is not None:
            appender.close()
    if not options["quiet"]:
        console.print(
            f"[dim]{outcome.succeeded} done, {outcome.failed} failed, {outcome.tokens} tokens, "
            f"batch size {outcome.batch_size}[/]"
        )
    return outcome
