"""The server as a warm engine for the CLI (``llmsample start``): a job endpoint that takes a
command's prompt and resolved settings and streams the loop's own records as JSON lines
(:mod:`llmsample.client.wire`), an explain endpoint that runs ``explain``'s own function on the
engine's model (between two steps of the batch, on the loop's thread), a status endpoint for
``llmsample ps``, and, when started as a
user's engine, its Unix socket (0600, in the user's 0700 directory), its registry record and its
keep-alive (idle that long, it stops itself as SIGTERM would stop it)."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from llmsample.analysis.explain import explain_job
from llmsample.analysis.explain_records import answer_to_json
from llmsample.client import registry
from llmsample.client.wire import (
    DETERMINISTIC_HEADER,
    DROPPED_HEADER,
    ENGINE_PATH,
    EXPLAIN_PATH,
    JOB_PATH,
    VERSION_HEADER,
    encode,
    explanation_from_json,
    job_from_json,
)
from llmsample.engine.job_row import job_row
from llmsample.engine.prompt import has_chat_template
from llmsample.engine.row_state import BatchItem
from llmsample.errors import RuntimeFailure, UserError
from llmsample.jobs import AUTO, Capabilities, Job
from llmsample.serve.api_errors import ApiError
from llmsample.serve.app import _endpoint
from llmsample.serve.engine import Closing
from llmsample.serve.flow import enqueue, off_loop, read_json, records
from llmsample.serve.state import ServeState
from llmsample.version import __version__


class Idle:
    """How long the engine has had nothing to do: rows in flight, or rows ended since the last
    look, count as work."""

    def __init__(self, state: ServeState) -> None:
        self.state = state
        self.since = time.monotonic()
        self.seen = -1

    def seconds(self) -> float:
        figures = self.state.engine.figures()
        ended = figures["finished"] + figures["cancelled"] + figures["failed"]
        if figures["in_flight"] or ended != self.seen:
            self.seen, self.since = ended, time.monotonic()
        return time.monotonic() - self.since


def add_routes(app: Starlette, state: ServeState, idle: Idle) -> None:
    """The job and status endpoints, behind the server's key like every other."""

    async def job(state: ServeState, request: HttpRequest) -> Response:
        return await run_job(state, request)

    async def status(state: ServeState, request: HttpRequest) -> Response:
        _check_version(request)
        _check_mode(state, request)
        lm = state.lm
        return JSONResponse({"version": __version__, "model": lm.name, "backend": lm.backend,
                             "dtype": lm.weights, "device": str(lm.device), "pid": os.getpid(),
                             "idle_s": idle.seconds(), "batch_size": state.engine.batch_size,
                             "max_queue": state.engine.max_queue, "chat_template": has_chat_template(lm),
                             "deterministic": state.engine.options.deterministic, "context_length": lm.context_length,
                             "capabilities": state.capabilities.names(),
                             **state.engine.figures()})  # fmt: skip

    async def explain(state: ServeState, request: HttpRequest) -> Response:
        return await run_explain(state, request)

    app.router.routes.append(Route(JOB_PATH, _endpoint(state, job), methods=["POST"]))
    app.router.routes.append(Route(EXPLAIN_PATH, _endpoint(state, explain), methods=["POST"]))
    app.router.routes.append(Route(ENGINE_PATH, _endpoint(state, status), methods=["GET"]))


def _check_version(request: HttpRequest) -> None:
    given = request.headers.get(VERSION_HEADER)
    if given is not None and given != __version__:
        raise ApiError(409, f"this engine runs llmsample {__version__} and the client is {given}: restart the engine "
                       "(llmsample stop --all; llmsample start) or pass --local", None, "version_mismatch")  # fmt: skip


def _check_mode(state: ServeState, request: HttpRequest) -> None:
    """A ``--deterministic`` command's rows must be computed alone; a plain engine's share passes."""
    if request.headers.get(DETERMINISTIC_HEADER) == "1" and not state.engine.options.deterministic:
        raise ApiError(400, "--deterministic needs an engine started with --deterministic (llmsample start "
                       "--deterministic, llmsample serve --deterministic); this one batches its rows, or pass --local",
                       None, "not_deterministic")  # fmt: skip


async def run_job(state: ServeState, request: HttpRequest) -> Response:
    """One command's prompt as a row of the batch; its records stream back as JSON lines."""
    _check_version(request)
    _check_mode(state, request)
    try:
        job = job_from_json(await read_json(request, state.max_body, state.read_timeout))
    except (ValueError, TypeError) as exc:
        raise ApiError(400, f"not a job: {exc}") from None
    _check_model(state, job)
    items, dropped = await off_loop(job_items, state, job)
    queue = enqueue(state, items)

    async def lines() -> Any:
        async for batch in records(state, request, {items[0].key: 0}, queue):
            yield "".join(encode(record) + "\n" for _, record in batch)

    headers = {"Cache-Control": "no-cache", DROPPED_HEADER: str(dropped)}
    return StreamingResponse(lines(), media_type="application/x-ndjson", headers=headers)


async def run_explain(state: ServeState, request: HttpRequest) -> Response:
    """``explain``'s answer (the next token's chain, or a continuation scored), computed on the
    loop's thread between two steps: the rows in flight wait for its passes."""
    _check_version(request)
    try:
        asked = explanation_from_json(await read_json(request, state.max_body, state.read_timeout))
    except (ValueError, TypeError) as exc:
        raise ApiError(400, f"not an explanation: {exc}") from None
    _check_model(state, asked.job)
    try:
        future = state.engine.call(functools.partial(explain_job, state.lm, asked))
    except Closing:
        raise ApiError(503, "the server is shutting down", None, "shutting_down") from None
    try:
        answer = await asyncio.wrap_future(future)
    except UserError as exc:
        raise ApiError(400, str(exc)) from None
    except RuntimeFailure as exc:
        raise ApiError(422, str(exc), None, "run_failed") from None
    except RuntimeError:  # the feed closed before the work ran
        raise ApiError(503, "the server is shutting down", None, "shutting_down") from None
    return JSONResponse(answer_to_json(answer))


def _check_model(state: ServeState, job: Job) -> None:
    if job.model is not None and job.model != state.lm.name:
        raise ApiError(404, f"model {job.model!r} is not served at this engine; it runs {state.lm.name!r}", "model",
                       "model_not_found")  # fmt: skip


def job_items(state: ServeState, job: Job) -> tuple[list[BatchItem], int]:
    """The job's row (:func:`~llmsample.engine.job_row.job_row`, as the in-process engine builds
    it) and how many of a chat's oldest exchanges were dropped to fit; what a row of this
    engine's batch cannot carry is refused, naming ``--local``."""
    flag = state.capabilities.lacking(Capabilities.of_job(job))
    if flag:
        raise ApiError(400, f"{flag} does not run on this engine; start (or serve) it with {flag}, leave it out, or pass --local",
                       None, "not_served")  # fmt: skip
    try:
        drafter = state.auto if job.drafter == AUTO else state.drafter if job.drafter else None
        item, dropped = job_row(state.lm, job, state.engine.new_key(), drafter)
    except UserError as exc:
        raise ApiError(400, str(exc)) from None
    return [item], dropped


def bind_unix(path: Path) -> socket.socket:
    """The engine's socket, 0600 from the start; a live engine already there is one line."""
    if registry.answers(str(path)):
        raise UserError(f"an engine already listens on {path}; stop it first (llmsample stop)")
    path.unlink(missing_ok=True)  # nobody there: a stale socket file is replaced
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    previous = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(previous)
    sock.listen(2048)
    return sock


def keep_alive(idle: Idle, seconds: float) -> None:
    """Once idle for ``seconds``, the engine stops itself as SIGTERM stops it (cleanly)."""

    def watch() -> None:
        while idle.seconds() < seconds:
            time.sleep(min(1.0, max(seconds / 4, 0.05)))
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="llmsample-keep-alive", daemon=True).start()


def register(directory: Path, options: dict[str, Any], state: ServeState, sock_path: Path, keep_s: float | None) -> str:
    """This engine's record, for ``ps`` and for commands looking for a warm engine; its id."""
    lm = state.lm
    spec = registry.spec_of(options)
    ident = registry.engine_id(spec)
    record = registry.EngineRecord(ident, os.getpid(), spec, lm.name, lm.backend, lm.weights, str(lm.device),
                                   str(sock_path), __version__, keep_s, time.time(), registry.draft_of(options),
                                   bool(options.get("reference")))  # fmt: skip
    registry.write_record(directory, record)
    return ident
