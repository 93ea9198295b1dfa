"""``llmsample batch``: a file of requests decoded together in one process, one output line each."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from llmsample.commands.help import GroupedCommand
from llmsample.commands.host_options import with_engine_options
from llmsample.commands.model_options import load_model_with_progress, model_options
from llmsample.commands.option_group import check_utf8_option
from llmsample.commands.options import (
    deterministic_option,
    draft_options,
    end_rank,
    keeps_log,
    log_option,
    prompt_cache_option,
    quiet_option,
    reference_option,
)
from llmsample.commands.sampling_options import (
    constraint_options,
    resolve_sampling,
    sampling_options,
    sampling_overrides,
)
from llmsample.errors import Interrupted, RuntimeFailure, UserError

if TYPE_CHECKING:
    from llmsample.batch.settings import BatchSettings


@click.command(cls=GroupedCommand)
@click.argument("input_path", metavar="[INPUT]", default="-", type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Write here (resumes a partial file)."
)
@model_options
@sampling_options
@constraint_options
@click.option("--system", metavar="TEXT", callback=check_utf8_option, help="System message for prompts without one.")
@click.option("--raw", is_flag=True, help="Plain-text prompts go to the model as they are, without the chat template.")
@click.option("--truncate", type=click.Choice(["error", "left"]), default="error", show_default=True,
              help="A prompt longer than the context: an error record, or its start cut off.")  # fmt: skip
@click.option("--format", "fmt", type=click.Choice(["jsonl", "openai"]), default="jsonl", show_default=True,
              help="Our records, or OpenAI Batch output lines (for OpenAI Batch input).")  # fmt: skip
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
@prompt_cache_option
@draft_options
@reference_option
@deterministic_option()
@log_option
@quiet_option("progress")
@with_engine_options
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

    With --compile, requests decode in waves of --batch-size over one static cache (the next wave
    starts once every request of the last one is done): one compiled step for the whole run.
    A warm engine of the same model (llmsample start) decodes the requests as rows of its batch.
    """
    from llmsample.batch.distributed import launched_ranks
    from llmsample.batch.output import claim_output
    from llmsample.jobs import drafter_asked

    if options["compile_model"] and drafter_asked(options["draft"]):
        raise UserError(
            "--draft with --compile: speculation verifies ragged drafts and rolls rows back one by one, "
            "which the static cache's fixed waves cannot; leave one of them out"
        )
    settings = batch_settings(options)
    ranks = launched_ranks()
    if ranks.world > 1:
        _run_distributed(_read_input(options), settings, options, ranks)
        return
    from llmsample.commands.host_options import open_engine

    engine = open_engine(options, refused_flags(options))  # before anything imports torch
    # The output is checked and locked first: before the model loads, and before stdin is read.
    claim = claim_output(options["output"]) if options["output"] else None
    try:
        outcome = _run_alone(_read_input(options), settings, options, claim, engine)
    finally:
        if claim is not None:
            claim.release()
    if outcome.failed:
        raise click.exceptions.Exit(1)


def refused_flags(options: dict[str, Any]) -> list[str]:
    """``batch``'s (and ``sweep``'s) own flags an engine elsewhere cannot honour: its rows and
    prompt cache are the engine's, and OpenAI records need the tokenizer's bytes and the
    template's tool shapes."""
    source = click.get_current_context().get_parameter_source
    given = source("prompt_cache_mb") not in (None, click.core.ParameterSource.DEFAULT)
    return [flag for flag, refused in (
        ("--format openai", options["fmt"] == "openai"),
        ("--batch-size", options["batch_size"] is not None),
        ("--prompt-cache-mb", given),
    ) if refused]  # fmt: skip


def batch_settings(options: dict[str, Any]) -> BatchSettings:
    """The run's settings from the command's options (a benchmark of the command's path builds
    them here too); bad flags, an unknown preset and a bad constraint fail here, before anything
    runs."""
    from llmsample.batch.settings import BatchSettings
    from llmsample.jobs import engine_drafter

    constraint = resolve_sampling(options)[1].constraint
    overrides = {key: value for key, value in sampling_overrides(options).items() if value is not None}
    if constraint is not None:
        overrides["constraint"] = constraint
    return BatchSettings(
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
        ngram=(options["ngram_min"], options["ngram_max"]) if options["draft"] == "ngram" else None,
        drafter=None if options["compile_model"] else engine_drafter(options["draft"]),
        reference=bool(options["reference"]),
    )


def _read_input(options: dict[str, Any]) -> list[Any]:
    from llmsample.batch.requests import read_requests
    from llmsample.sampling import presets as preset_store

    known = preset_store.discover().keys()
    return list(read_requests(input_lines(options["input_path"]), known_presets=known))


def _run_alone(parsed: list[Any], settings: Any, options: dict[str, Any], claim: Any, engine: Any) -> Any:
    """One process: what earlier runs left (the output, parts of a run over several processes)
    merged in input order, the rest decoded (here, or on a warm engine) and appended, and
    the file put back in input order when the run ends (its records are appended as their
    requests end, so the first answers are there while the rest decode). A pipe or device
    (``-o /dev/stdout``), like stdout, is written in input order."""
    from llmsample.batch.output import consolidate

    done: frozenset[str] = frozenset()
    settled = None
    if claim is not None and claim.regular:
        settled = consolidate(claim.path, parsed, options["fmt"], keep_errors=False)
        done = settled.done
    output = claim.path if claim is not None else None
    outcome = _run(engine, parsed, done, settings, options, output, ordered=settled is None)
    if settled is not None:  # each record went out as its request ended: the file in input order
        consolidate(claim.path, parsed, options["fmt"], keep_errors=True)
    return outcome


def _run_distributed(parsed: list[Any], settings: Any, options: dict[str, Any], ranks: Any) -> None:
    """Under torchrun: rank 0 locks the output and merges what a killed run left, every rank
    decodes its share into its part file, and rank 0 merges the parts when all are done."""
    import os

    import torch
    import torch.distributed as dist

    from llmsample.batch.distributed import my_share, part_path
    from llmsample.batch.output import claim_output, consolidate, resolve_output
    from llmsample.commands.model_options import local_engine

    def refuse(message: str) -> None:  # before the rendezvous: every rank decides alike, rank 0 says it
        if ranks.main:
            raise UserError(message)
        raise click.exceptions.Exit(2)

    if options["output"] is None:
        refuse("a batch over several processes needs -o FILE (each rank writes its part next to it)")
    try:
        output, regular = resolve_output(options["output"])
    except UserError as exc:
        refuse(str(exc))
    if not regular:
        refuse(
            f"a batch over several processes needs -o a regular file (its parts go next to it), not {options['output']}"
        )
    # torchrun's rendezvous (one machine or many). Not accelerate's PartialState: on CPUs it does
    # not treat a torchrun launch as distributed, so its barriers would not wait.
    cuda = torch.cuda.is_available() and options["device"] in ("auto", "cuda")
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if cuda:
        options = {**options, "device": f"cuda:{local_rank}"}
    else:  # the ranks on one machine share its cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    claim = None
    status: list[Any] = [None, frozenset()]  # (message, exit code) of a failure; what is done
    if ranks.main:  # rank 0 holds the lock for the run and merges what a killed run left
        try:
            claim = claim_output(options["output"])
            status = [None, consolidate(output, parsed, options["fmt"], keep_errors=False).done]
        except (UserError, RuntimeFailure) as exc:
            if claim is not None:
                claim.release()
            status = [(str(exc), exc.exit_code), None]
    # Also the barrier: nobody writes a part before rank 0 has merged and removed the old ones.
    dist.broadcast_object_list(status, src=0, device=torch.device(options["device"]) if cuda else None)
    if status[0] is not None:
        _end_with(ranks, *status[0])
    done = status[1]
    options = {**options, "quiet": options["quiet"] or not ranks.main}
    lm = load_model_with_progress(options)
    failed = torch.zeros(1, device=lm.device if cuda else "cpu")
    merge_failed = None
    try:
        part = part_path(output, ranks)  # merged in input order at the end
        failed += _run(local_engine(options, lm), my_share(parsed, ranks), done, settings, options, part, ordered=False).failed
    finally:
        dist.barrier()
        if ranks.main:
            try:
                consolidate(output, parsed, options["fmt"], keep_errors=True)
            except (UserError, RuntimeFailure) as exc:
                merge_failed = exc
        dist.barrier()  # no rank may end (and have the launcher stop the rest) mid-merge
        if claim is not None:
            claim.release()
    dist.all_reduce(failed)
    if merge_failed is not None:
        _end_with(ranks, str(merge_failed), merge_failed.exit_code)
    end_rank(1 if ranks.main and failed.item() else 0)  # one exit status for the run, from rank 0


def _end_with(ranks: Any, message: str, code: int) -> None:
    """End every rank of a torchrun run with one exit status; only rank 0 says why, in one line."""
    if ranks.main:
        click.echo(f"Error: {message}", err=True)
    end_rank(code)


def input_lines(path: str, what: str = "requests") -> list[bytes]:
    """Raw bytes per line (``batch``'s requests, ``sweep``'s prompts): invalid UTF-8 is an
    error record for its line, not for the run."""
    if path == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise UserError(f"no input: pass a file of {what}, or pipe them on stdin")
        return sys.stdin.buffer.read().splitlines(keepends=True)
    try:
        return Path(path).read_bytes().splitlines(keepends=True)
    except OSError as exc:
        raise UserError(f"cannot read {path} ({exc.strerror}); pass a file of {what}, one per line") from exc


def _run(
    engine: Any,
    parsed: list[Any],
    done: frozenset[str],
    settings: Any,
    options: dict[str, Any],
    output: Path | None,
    ordered: bool = True,
) -> Any:
    """Decode on ``engine`` into ``output`` (None: stdout) with a progress bar on stderr (a
    terminal only); exit 130/143 when interrupted, with every finished record written (the
    engine gone: those, then one line, exit 1). ``ordered``: in input order (else as each
    request ends). Returns the outcome (how many requests failed)."""
    from llmsample.batch.run import run_batch
    from llmsample.client.engine_client import IN_PROCESS
    from llmsample.render.progress import TokenProgress
    from llmsample.terminal import stderr_console

    console = stderr_console()
    disabled = options["quiet"] or not console.is_terminal
    with record_writer(output) as write, TokenProgress(console, "requests", disabled) as progress:
        outcome = run_batch(engine, parsed, done, settings, write, progress, log=keeps_log(options), ordered=ordered)
    if not options["quiet"]:
        where = "" if engine.where == IN_PROCESS else f", on the engine at {engine.where}"
        console.print(f"[dim]{outcome.succeeded} done, {outcome.failed} failed, {outcome.tokens} tokens{where}[/]")
    return outcome


@contextlib.contextmanager
def record_writer(output: Path | None, stdout: bool = True) -> Iterator[Callable[[dict[str, Any]], None]]:
    """Where a batch run's records go, in-process or on an engine alike: ``output`` through an
    :class:`Appender`, else stdout a flushed line each (``stdout`` False: nowhere, ``sweep``'s
    stdout is its settings'). Ctrl-C exits 130 and an interruption with its own code, the
    records written so far kept (a rerun with ``-o`` resumes after them)."""
    from llmsample.batch.result_lines import dumps
    from llmsample.batch.resume import Appender

    appender = Appender(output) if output is not None else None

    def write(record: dict[str, Any]) -> None:
        if appender is not None:
            appender.write(record)
        elif stdout:
            sys.stdout.write(dumps(record) + "\n")
            sys.stdout.flush()

    try:
        yield write
    except KeyboardInterrupt as exc:
        raise click.exceptions.Exit(130) from exc
    except Interrupted as exc:
        raise click.exceptions.Exit(exc.exit_code) from exc
    finally:
        if appender is not None:
            appender.close()
