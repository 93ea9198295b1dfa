"""``batch`` on a warm engine: each request line a row of the engine's one continuous batch.
The requests are read and resolved here as the in-process run resolves them (presets, flags,
seeds, constraints), each sent as a job, and the records written from the rows' own records in
input order, so a line's record is the in-process one (its clocks and ``engine`` aside). A few
jobs more than the engine has rows are in flight at a time: a row that ends lets the next start."""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from llmsample.batch.requests import Request, RequestError
from llmsample.batch.settings import BatchSettings, request_config, request_recorder
from llmsample.client.connection import Target
from llmsample.client.wire import Failed
from llmsample.errors import Interrupted, RuntimeFailure, UserError
from llmsample.jobs import Job

Record = dict[str, Any]
WINDOW_FALLBACK = 8
"""Jobs in flight at once on a server whose status does not say its rows."""


@dataclass
class Outcome:
    """What the run did, for its last line and its exit status (1 when a request failed)."""

    succeeded: int = 0
    failed: int = 0
    tokens: int = 0


def refused_flags(options: dict[str, Any]) -> list[str]:
    """``batch``'s own flags an engine cannot honour: its rows and prompt cache are the
    engine's, and OpenAI records need the tokenizer's bytes and the template's tool shapes."""
    source = click.get_current_context().get_parameter_source
    given = source("prompt_cache_mb") not in (None, click.core.ParameterSource.DEFAULT)
    return [flag for flag, refused in (
        ("--format openai", options["fmt"] == "openai"),
        ("--batch-size", options["batch_size"] is not None),
        ("--prompt-cache-mb", given),
    ) if refused]  # fmt: skip


@contextlib.contextmanager
def record_writer(output: Path | None) -> Iterator[Callable[[dict[str, Any]], None]]:
    """Where a batch run's records go, in-process or on an engine alike: ``output`` through an
    :class:`Appender`, else stdout a flushed line each. Ctrl-C exits 130 and an interruption
    with its own code, the records written so far kept (a rerun with ``-o`` resumes after them)."""
    from llmsample.batch.result_lines import dumps
    from llmsample.batch.resume import Appender

    appender = Appender(output) if output is not None else None

    def write(record: dict[str, Any]) -> None:
        if appender is not None:
            appender.write(record)
        else:
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


def run_on(
    target: Target, parsed: list[Any], done: frozenset[str], settings: BatchSettings, options: dict[str, Any],
    output: Path | None,
) -> Outcome:  # fmt: skip
    """Decode every request not in ``done`` on the engine into ``output`` (None: stdout). The
    engine gone mid-run: the records written so far (in input order) stay, then one line, exit
    1; Ctrl-C: the same, exit 130, and the engine cancels the rows in flight (a rerun with ``-o``
    resumes after the records written)."""
    with record_writer(output) as write:  # as the in-process run writes them
        return _run(target, parsed, done, settings, options, write)


def _run(
    target: Target, parsed: list[Any], done: frozenset[str], settings: BatchSettings, options: dict[str, Any],
    write: Callable[[Record], None],
) -> Outcome:  # fmt: skip
    from llmsample.commands.options import keeps_log

    outcome = Outcome()
    asked: dict[int, tuple[Request, Any]] = {}
    jobs: list[tuple[int, Job]] = []
    ready: dict[int, Record] = {}  # records known before anything is sent (lines that cannot run)
    for position, item in enumerate(parsed):
        if isinstance(item, Request) and item.custom_id in done:
            continue
        try:
            if isinstance(item, RequestError):
                raise UserError(item.message)
            preset, cfg = request_config(item, settings)
        except UserError as exc:
            ready[position] = _error(item, str(exc))
            continue
        asked[position] = (item, cfg)
        jobs.append((position, _job(item, preset, cfg, settings, options, target)))
    answers = _answers(target, jobs, _rows(target, options))
    log = keeps_log(options)
    try:
        for position in sorted([*ready, *asked]):
            if position in ready:
                record = ready[position]
            else:
                request, cfg = asked[position]
                record = _record(target, request, cfg, next(answers), settings, outcome, log)
            outcome.failed += "error" in record
            write(record)
    finally:
        answers.close()
    if not options["quiet"]:
        click.echo(f"{outcome.succeeded} done, {outcome.failed} failed, {outcome.tokens} tokens, on the engine at "
                   f"{target.where}", err=True)  # fmt: skip
    return outcome


def _rows(target: Target, options: dict[str, Any]) -> tuple[int, int]:
    """The engine's rows and queue places, asked before anything is sent: a server of another
    model or version is one line here, not an error record on every line."""
    from llmsample.client.connection import engine_status

    status = engine_status(target)
    if not target.where.startswith("unix:") and options["model"] and status.get("model") != options["model"]:
        raise UserError(f"model {options['model']!r} is not served at {target.where}; it runs {status.get('model')!r}")
    return status.get("batch_size") or WINDOW_FALLBACK, status.get("max_queue") or 0


def _job(
    request: Request, preset: str, cfg: Any, settings: BatchSettings, options: dict[str, Any], target: Target
) -> Job:
    """The request's row as the in-process run builds it: its messages (its own system message
    rendered with its prompt, as the chat template does in-process), else its prompt and system."""
    raw = request.raw or (settings.raw and request.messages is None)
    ngram = (options["ngram_min"], options["ngram_max"]) if options["draft"] == "ngram" else None
    model = None if target.where.startswith("unix:") else options["model"]
    return Job(request.prompt or "", cfg, preset, request.system or settings.system, raw, settings.truncate,
               settings.top_n, model=model, ngram=ngram, draft_tokens=settings.draft_tokens if ngram else None,
               messages=request.messages, ignore_eos=settings.ignore_eos)  # fmt: skip


def _record(
    target: Target, request: Request, cfg: Any, answer: list[Any] | UserError, settings: BatchSettings,
    outcome: Outcome, log: bool,
) -> Record:  # fmt: skip
    """A request's output record from its row's records (an error record for a refused or failed row)."""
    from llmsample.batch.result_lines import result_record
    from llmsample.sampling.constraint import incomplete_message

    if isinstance(answer, UserError):
        return _error(request, str(answer))
    *tokens, end = answer
    if isinstance(end, Failed):
        return _error(request, end.message, "decoding_failed")
    if end.stop_reason == "cancelled":
        raise RuntimeFailure(f"the engine at {target.where} stopped before the batch was done")
    if log:
        request_recorder("batch", request, settings.system, cfg, tokens).summary(end)
    incomplete = incomplete_message(end)
    if incomplete is not None:
        return _error(request, incomplete, "incomplete_output")
    outcome.succeeded += 1
    outcome.tokens += end.tokens
    return result_record(request, end, tokens, settings.tokens)


def _error(item: Request | RequestError, message: str, code: str = "invalid_request") -> Record:
    from llmsample.batch.result_lines import error_record

    error = item if isinstance(item, RequestError) else RequestError(item.line, item.custom_id, message, code)
    return error_record(error)


def _answers(target: Target, jobs: list[tuple[int, Job]], room: tuple[int, int]) -> Iterator[list[Any] | UserError]:
    """Each job's records (or the engine's refusal of it), in order, while a window of them runs
    on the engine: daemon threads each send a job and read its answer whole, so the rows decode
    together and a run that stops leaves nothing waiting (the engine cancels the open rows)."""
    from llmsample.client.connection import EngineGone, job_records, say

    if not jobs:
        return
    rows, queued = room
    width = min(len(jobs), rows + min(rows, queued))
    todo: queue.Queue[int] = queue.Queue()
    for index in range(len(jobs)):
        todo.put(index)
    slots: list[Any] = [None] * len(jobs)
    ended = [threading.Event() for _ in jobs]
    told = threading.Event()

    def waiting(line: str) -> None:  # one notice for the run, not one per job
        if not told.is_set():
            told.set()
            say(line)

    def work() -> None:
        while True:
            try:
                index = todo.get_nowait()
            except queue.Empty:
                return
            try:
                slots[index] = list(job_records(target, jobs[index][1], waiting))
            except (UserError, RuntimeFailure) as exc:
                slots[index] = exc
            ended[index].set()

    for _ in range(width):
        threading.Thread(target=work, name="llmsample-batch-job", daemon=True).start()
    for index in range(len(jobs)):
        ended[index].wait()
        if isinstance(slots[index], EngineGone):  # one line, whichever row's connection saw it first
            raise RuntimeFailure(f"the engine at {target.where} went away mid-run") from None
        if isinstance(slots[index], RuntimeFailure):
            raise slots[index]
        yield slots[index]
