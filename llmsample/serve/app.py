"""The HTTP side: a Starlette app whose completion endpoints turn each request into rows of the
engine's one batch (:mod:`llmsample.serve.engine`) and answer in OpenAI's shapes, whole or as
server-sent events; plus ``/v1/models``, ``/health``, ``/tokenize``, ``/detokenize`` and the
page at ``/`` (:mod:`llmsample.serve.page`)."""

from __future__ import annotations

import asyncio
import functools
import hmac
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from llmsample.batch.requests import CHAT_URL, COMPLETIONS_URL
from llmsample.batch.responses import dumps
from llmsample.engine.rows import RowFailed
from llmsample.errors import first_line
from llmsample.events import Summary, TokenEvent
from llmsample.serve.access import TOKENS
from llmsample.serve.compat import log_ignored
from llmsample.serve.engine import Busy, Closing
from llmsample.serve.errors import ApiError, bad_request
from llmsample.serve.mailbox import Mailbox
from llmsample.serve.parsing import load_json, parse_body
from llmsample.serve.responses import DONE, Answer
from llmsample.serve.rows import build_items, prompt_texts
from llmsample.serve.state import READ_TIMEOUT_S, ServeState

_TOKENIZING = ThreadPoolExecutor(1, thread_name_prefix="llmsample-tokenize")
"""Prompts are tokenized here, off the event loop (a 4 MiB prompt takes seconds, and ``/health``
and every stream must go on meanwhile); one at a time, as the loop did them, so two requests
never use the tokenizer at once. Its work starts no OpenMP team: tests/serve/test_threads.py."""


Handler = Callable[[HttpRequest], Awaitable[Response]]


def _endpoint(
    state: ServeState, handler: Callable[[ServeState, HttpRequest], Awaitable[Response]], auth: bool = True
) -> Handler:
    """Every failure a client caused is an OpenAI error object; the key is checked first. A
    failure of ours is one too (a 500), and one line on stderr rather than a traceback."""

    async def run(request: HttpRequest) -> Response:
        try:
            if auth and state.api_key is not None:
                _check_key(request, state.api_key)
            return await handler(state, request)
        except ApiError as exc:
            return exc.response()
        except Exception as exc:  # the server goes on; the client gets an error object
            message = f"{type(exc).__name__}: {first_line(exc)}"
            print(f"llmsample serve: {request.method} {request.url.path} failed: {message}", file=sys.stderr)
            return ApiError(500, f"the server failed: {message}", None, "internal_error").response()

    return run


def _check_key(request: HttpRequest, key: str) -> None:
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        message = "missing API key: send Authorization: Bearer KEY" if not given else "incorrect API key"
        raise ApiError(401, message, None, "invalid_api_key")


async def read_json(request: HttpRequest, limit: int, timeout: float = READ_TIMEOUT_S) -> Any:
    """The body as JSON, refused (413) as soon as it is over ``limit`` bytes, declared or sent,
    and (408, the connection closed) when it has not all come within ``timeout`` seconds."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body is {declared} bytes; the limit is {limit}", None, "body_too_large")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise ApiError(413, f"the request body is over the limit of {limit} bytes", None, "body_too_large")
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(408, f"the request body did not all come within {timeout:g} s", None, "body_timeout",
                       {"Connection": "close"}) from None  # fmt: skip
    except ClientDisconnect:  # nobody reads this answer; it keeps a traceback out of the log
        raise ApiError(499, "the client went away before sending its whole body") from None
    return load_json(b"".join(chunks))


async def off_loop(work: Callable[..., Any], *args: Any) -> Any:
    """``work(*args)`` on the tokenizing thread (see :data:`_TOKENIZING`)."""
    return await asyncio.get_running_loop().run_in_executor(_TOKENIZING, functools.partial(work, *args))


async def completions(state: ServeState, request: HttpRequest, url: str) -> Response:
    chat = url == CHAT_URL
    serve = parse_body(
        await read_json(request, state.max_body, state.read_timeout), url, state.presets, state.strict_api
    )
    log_ignored(list(serve.warnings))
    if serve.model is not None and serve.model != state.lm.name:
        raise ApiError(
            404,
            f"model: {serve.model!r} is not served here; this server runs {state.lm.name!r}",
            "model",
            "model_not_found",
        )
    serve = await off_loop(prompt_texts, state.lm, serve)
    items, shape = await off_loop(build_items, state, serve, chat)
    queue = Mailbox(asyncio.get_running_loop())
    try:
        state.engine.submit(items, queue)
    except Busy as busy:
        raise ApiError(503, "the server is busy: every row and the queue are full; retry shortly", None, "server_busy",
                       {"Retry-After": str(busy.retry_after)}) from None  # fmt: skip
    except Closing:
        raise ApiError(503, "the server is shutting down", None, "shutting_down") from None
    answer = Answer(serve, state.lm.name, state.fingerprint, chat, state.lm.token_bytes, shape=shape)
    keys = {item.key: i for i, item in enumerate(items)}
    if serve.stream:
        stream = _stream(state, request, answer, keys, queue)
        return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    return await _whole(state, request, answer, keys, queue)


async def _watch_disconnect(request: HttpRequest) -> None:
    """Returns when the client has gone away."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _records(
    state: ServeState, request: HttpRequest, keys: dict[Any, int], queue: Mailbox
) -> AsyncIterator[list[tuple[int, Any]]]:
    """``(choice index, record)`` lists (a step's at a time) until every row has ended; a client
    that goes away closes the mailbox and cancels its rows."""
    watch = asyncio.ensure_future(_watch_disconnect(request))
    watch.add_done_callback(lambda _: queue.close())
    open_rows = set(keys)
    try:
        while open_rows:
            records = await queue.take()
            if records is None:
                return
            batch = []
            for key, record in records:
                if not isinstance(record, TokenEvent):
                    open_rows.discard(key)
                batch.append((keys[key], record))
            yield batch
    finally:
        watch.cancel()
        if open_rows:
            state.engine.cancel(list(open_rows))


async def _whole(
    state: ServeState, request: HttpRequest, answer: Answer, keys: dict[Any, int], queue: Mailbox
) -> Response:
    events: list[list[TokenEvent]] = [[] for _ in keys]
    summaries: list[Summary | None] = [None] * len(keys)
    async for batch in _records(state, request, keys, queue):
        for index, record in batch:
            _collect(index, record, events, summaries)
    if any(summary is None or _unanswered(summary) for summary in summaries):
        if state.engine.closing:  # still waiting for a row when the server began to stop
            raise ApiError(503, "the server is shutting down", None, "shutting_down")
        return Response(status_code=499)  # the client went away; nobody reads this
    request.scope[TOKENS] = [summaries[0].prompt_tokens, sum(summary.tokens for summary in summaries)]  # type: ignore[union-attr]
    return JSONResponse(answer.body(summaries, events))  # type: ignore[arg-type]


def _unanswered(summary: Summary) -> bool:
    """A row the server stopped before it gave a token (a stream still ends it with a final chunk)."""
    return summary.stop_reason == "cancelled" and not summary.tokens


def _collect(index: int, record: Any, events: list[list[TokenEvent]], summaries: list[Summary | None]) -> None:
    if isinstance(record, TokenEvent):
        events[index].append(record)
    elif isinstance(record, RowFailed):
        if record.message != "cancelled":  # cancelled: the client went away (or the server stops)
            raise _failure(record)
    else:
        summaries[index] = record


def _failure(record: RowFailed) -> ApiError:
    """A row that failed: the request's own fault (a constraint it cannot complete) is a 400."""
    if record.user_error:
        return bad_request(record.message)
    return ApiError(500, f"decoding failed: {record.message}", None, "decoding_failed")


async def _stream(
    state: ServeState, request: HttpRequest, answer: Answer, keys: dict[Any, int], queue: Mailbox
) -> AsyncIterator[str]:
    """Server-sent events: the chunks of every record that has arrived go out in one write."""
    opening = answer.opening(len(keys))
    if opening:
        yield opening
    usage = request.scope.setdefault(TOKENS, [0, 0])  # prompt tokens, completion tokens (the log's too)
    async for batch in _records(state, request, keys, queue):
        chunks = [_chunk(answer, index, record, usage) for index, record in batch]
        yield "".join(chunk for chunk in chunks if chunk)
    tail = answer.usage_chunk(*usage) if answer.serve.include_usage else ""
    yield tail + DONE


def _chunk(answer: Answer, index: int, record: Any, usage: list[int]) -> str:
    if isinstance(record, TokenEvent):
        if record.text or answer.serve.request.logprobs or answer.serve.tokens != "none":
            return answer.chunk(index, event=record)
        return ""
    if isinstance(record, RowFailed):
        if record.message == "cancelled":
            return ""
        return f"data: {dumps(_failure(record).body())}\n\n"
    first = index % answer.serve.n == 0  # each prompt's tokens counted once, by its first choice
    usage[0], usage[1] = usage[0] + (record.prompt_tokens if first else 0), usage[1] + record.tokens
    return answer.chunk(index, summary=record)


def _model_card(state: ServeState) -> dict[str, Any]:
    model = {"id": state.lm.name, "object": "model", "created": 0, "owned_by": "llmsample"}
    if state.lm.context_length:
        model["max_model_len"] = state.lm.context_length
    return model


async def models(state: ServeState, request: HttpRequest) -> Response:
    return JSONResponse({"object": "list", "data": [_model_card(state)]})


async def model(state: ServeState, request: HttpRequest) -> Response:
    """``GET /v1/models/{id}``: the model, or 404 for any other id (ids may hold slashes)."""
    name = request.path_params["name"]
    if name != state.lm.name:
        message = f"model: {name!r} is not served here; this server runs {state.lm.name!r}"
        raise ApiError(404, message, "model", "model_not_found")
    return JSONResponse(_model_card(state))


async def health(state: ServeState, request: HttpRequest) -> Response:
    if state.engine.closing:
        return JSONResponse({"status": "shutting down"}, status_code=503)
    return JSONResponse({"status": "ok", "model": state.lm.name, **state.engine.figures()})


async def home(state: ServeState, request: HttpRequest) -> Response:
    """The page (no key needed to load it: its requests send the key the user types)."""
    import secrets

    from llmsample.serve import page

    nonce = secrets.token_urlsafe(16)
    config = page.page_config(state.lm.name, state.settings, state.presets)
    headers = {"Content-Security-Policy": page.security_policy(nonce), "Cache-Control": "no-store"}
    return HTMLResponse(page.render(config, nonce), headers=headers)


async def tokenize(state: ServeState, request: HttpRequest) -> Response:
    """vLLM's ``/tokenize``: ``prompt`` (plain text) or ``messages`` (through the chat template)."""
    from llmsample.serve.tokens import tokenize_body

    body = await read_json(request, state.max_body, state.read_timeout)
    return JSONResponse(await off_loop(tokenize_body, state.lm, body))


async def detokenize(state: ServeState, request: HttpRequest) -> Response:
    from llmsample.serve.tokens import detokenize_body

    body = await read_json(request, state.max_body, state.read_timeout)
    return JSONResponse(await off_loop(detokenize_body, state.lm, body))


def create_app(state: ServeState) -> Starlette:
    async def chat(state: ServeState, request: HttpRequest) -> Response:
        return await completions(state, request, CHAT_URL)

    async def complete(state: ServeState, request: HttpRequest) -> Response:
        return await completions(state, request, COMPLETIONS_URL)

    routes = [
        Route(CHAT_URL, _endpoint(state, chat), methods=["POST"]),
        Route(COMPLETIONS_URL, _endpoint(state, complete), methods=["POST"]),
        Route("/v1/models", _endpoint(state, models), methods=["GET"]),
        Route("/v1/models/{name:path}", _endpoint(state, model), methods=["GET"]),
        Route("/health", _endpoint(state, health, auth=False), methods=["GET"]),
        Route("/", _endpoint(state, home, auth=False), methods=["GET"]),
        Route("/tokenize", _endpoint(state, tokenize), methods=["POST"]),
        Route("/detokenize", _endpoint(state, detokenize), methods=["POST"]),
    ]
    app = Starlette(routes=routes)

    async def not_found(request: HttpRequest, exc: Exception) -> Response:
        return ApiError(404, f"{request.method} {request.url.path}: no such endpoint", None, "not_found").response()

    app.add_exception_handler(404, not_found)
    app.add_exception_handler(405, method_not_allowed)
    return app


async def method_not_allowed(request: HttpRequest, exc: Exception) -> Response:
    """A known path asked with another method: 405 saying which methods it takes."""
    allowed = getattr(exc, "headers", None) or {}
    methods = allowed.get("Allow", "")
    message = f"{request.method} {request.url.path}: method not allowed; use {methods or 'another method'}"
    error = ApiError(405, message, None, "method_not_allowed", {"Allow": methods} if methods else None)
    return error.response()
