"""The server as a warm engine for the CLI (``llmsample start``): a job endpoint that takes a
command's prompt and resolved settings and streams the loop's own records as JSON lines
(:mod:`llmsample.client.wire`), a status endpoint for ``llmsample ps``, and, when started as a
user's engine, its Unix socket (0600, in the user's 0700 directory), its registry record and its
keep-alive (idle that long, it stops itself as SIGTERM would stop it)."""

from __future__ import annotations

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

from llmsample import __version__
from llmsample.client import registry
from llmsample.client.wire import ENGINE_PATH, JOB_PATH, VERSION_HEADER, Job, encode, job_from_json
from llmsample.engine.prompt import has_chat_template, message_id_list, prompt_id_list
from llmsample.engine.rows import BatchItem
from llmsample.errors import UserError
from llmsample.events import RunStats
from llmsample.models.device import dtype_name
from llmsample.serve.app import _endpoint
from llmsample.serve.errors import ApiError
from llmsample.serve.flow import enqueue, off_loop, read_json, records
from llmsample.serve.state import ServeState


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
        lm = state.lm
        return JSONResponse({"version": __version__, "model": lm.name, "backend": lm.backend,
                             "dtype": dtype_name(lm.dtype), "device": str(lm.device), "pid": os.getpid(),
                             "idle_s": idle.seconds(), "batch_size": state.engine.batch_size,
                             "max_queue": state.engine.max_queue, "chat_template": has_chat_template(lm),
                             **state.engine.figures()})  # fmt: skip

    app.router.routes.append(Route(JOB_PATH, _endpoint(state, job), methods=["POST"]))
    app.router.routes.append(Route(ENGINE_PATH, _endpoint(state, status), methods=["GET"]))


def _check_version(request: HttpRequest) -> None:
    given = request.headers.get(VERSION_HEADER)
    if given is not None and given != __version__:
        raise ApiError(409, f"this engine runs llmsample {__version__} and the client is {given}: restart the engine "
                       "(llmsample stop --all; llmsample start) or pass --local", None, "version_mismatch")  # fmt: skip


async def run_job(state: ServeState, request: HttpRequest) -> Response:
    """One command's prompt as a row of the batch; its records stream back as JSON lines."""
    _check_version(request)
    try:
        job = job_from_json(await read_json(request, state.max_body, state.read_timeout))
    except (ValueError, TypeError) as exc:
        raise ApiError(400, f"not a job: {exc}") from None
    if job.model is not None and job.model != state.lm.name:
        raise ApiError(404, f"model {job.model!r} is not served at this engine; it runs {state.lm.name!r}", "model",
                       "model_not_found")  # fmt: skip
    items = await off_loop(job_items, state, job)
    queue = enqueue(state, items)

    async def lines() -> Any:
        async for batch in records(state, request, {items[0].key: 0}, queue):
            yield "".join(encode(record) + "\n" for _, record in batch)

    return StreamingResponse(lines(), media_type="application/x-ndjson", headers={"Cache-Control": "no-cache"})


def job_items(state: ServeState, job: Job) -> list[BatchItem]:
    """The job's row, built as ``generate`` builds its own in-process (tokenizer alone: no torch here)."""
    lm = state.lm
    try:
        if job.messages is not None:
            ids = message_id_list(lm, job.messages, job.truncate, job.cfg.max_tokens)
        else:
            ids = prompt_id_list(lm, job.prompt, job.system, job.raw, job.truncate, job.cfg.max_tokens)
    except UserError as exc:
        raise ApiError(400, str(exc)) from None
    stats = RunStats(model=lm.name, preset=job.preset, seed=job.cfg.seed)
    if lm.quantization:
        stats.note(quantization=lm.quantization)
    if lm.placed_on:
        stats.note(device_map=tuple(lm.placed_on))
    drafter = None
    if job.ngram is not None:
        drafter = _ngram_drafter(lm, *job.ngram)
    return [BatchItem(state.engine.new_key(), ids, job.cfg, stats, drafter, job.draft_tokens, top_n=job.top_n)]


def _ngram_drafter(lm: Any, ngram_min: int, ngram_max: int) -> Any:
    """``--draft ngram``'s drafter, made when the row starts (on the engine's thread, as the
    in-process run makes its own before the loop)."""

    def make() -> Any:
        from llmsample.engine.speculative import NgramDrafter

        return NgramDrafter(lm.model.config.vocab_size, lm.sample_device, ngram_min, ngram_max)

    return make


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
    record = registry.EngineRecord(ident, os.getpid(), spec, lm.name, lm.backend, dtype_name(lm.dtype), str(lm.device),
                                   str(sock_path), __version__, keep_s, time.time())  # fmt: skip
    registry.write_record(directory, record)
    return ident
