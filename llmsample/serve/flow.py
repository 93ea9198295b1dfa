"""The engine path every completion endpoint shares (chat and text completions, the Responses
and Messages APIs): the body read, the request's rows made off the event loop and submitted to
the engine's one batch (:mod:`llmsample.serve.engine`), and their records taken back, whole or
as they come. Each endpoint only shapes the answer."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest

from llmsample.batch.tool_requests import ChatShape
from llmsample.engine.row_state import BatchItem, RowFailed
from llmsample.events import Summary, TokenEvent
from llmsample.serve.access import TOKENS
from llmsample.serve.api_errors import ApiError, bad_request
from llmsample.serve.engine import Busy, Closing
from llmsample.serve.mailbox import Mailbox
from llmsample.serve.parsing import ServeRequest, load_json
from llmsample.serve.prompt_scoring import ended_at_once, scores_prompt, with_prompt_logprobs
from llmsample.serve.request_rows import build_items, prompt_texts
from llmsample.serve.state import READ_TIMEOUT_S, ServeState

_TOKENIZING = ThreadPoolExecutor(1, thread_name_prefix="llmsample-tokenize")
"""Prompts are tokenized here, off the event loop (a 4 MiB prompt takes seconds, and ``/health``
and every stream must go on meanwhile); one at a time, as the loop did them, so two requests
never use the tokenizer at once. Its work starts no OpenMP team: tests/serve/test_threads.py."""


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


async def submit(
    state: ServeState, serve: ServeRequest, chat: bool, scope: MutableMapping[str, Any] | None = None
) -> tuple[ServeRequest, dict[Any, int], Mailbox, ChatShape]:
    """The request's rows in the engine's batch: the request (token prompts given their text,
    echoed prompts their log probabilities), each row's key to its choice index, the mailbox its
    records come to (``max_tokens: 0``: every row's end already), and how a chat answer's text is
    read back (tool calls, reasoning). ``scope``: the access log counts the prompts' tokens from
    here on (each prompt once, as usage counts them), and :func:`records` the tokens."""
    if serve.model is not None and serve.model != state.lm.name:
        raise ApiError(
            404,
            f"model: {serve.model!r} is not served here; this server runs {state.lm.name!r}",
            "model",
            "model_not_found",
        )
    serve = await off_loop(prompt_texts, state.lm, serve)
    items, shape = await off_loop(build_items, state, serve, chat)
    if scores_prompt(serve, chat):
        serve = await with_prompt_logprobs(state, serve, items)
    queue = ended_at_once(state, items) if serve.request.prompt_only else enqueue(state, items)
    if scope is not None:
        scope[TOKENS] = [sum(len(item.prompt_ids) for item in items[:: serve.n]), 0]
    return serve, {item.key: i for i, item in enumerate(items)}, queue, shape


def enqueue(state: ServeState, items: list[BatchItem]) -> Mailbox:
    """``items`` into the engine's batch; the mailbox their records come to. A full batch and
    queue is a 503 with ``Retry-After``, as is a server shutting down."""
    queue = Mailbox(asyncio.get_running_loop())
    try:
        state.engine.submit(items, queue)
    except Busy as busy:
        raise ApiError(503, "the server is busy: every row and the queue are full; retry shortly", None, "server_busy",
                       {"Retry-After": str(busy.retry_after)}) from None  # fmt: skip
    except Closing:
        raise ApiError(503, "the server is shutting down", None, "shutting_down") from None
    return queue


async def _watch_disconnect(request: HttpRequest) -> None:
    """Returns when the client has gone away."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def records(
    state: ServeState, request: HttpRequest, keys: dict[Any, int], queue: Mailbox
) -> AsyncIterator[list[tuple[int, Any]]]:
    """``(choice index, record)`` lists (a step's at a time) until every row has ended; a client
    that goes away closes the mailbox and cancels its rows. Each token is counted for the access
    log as it is handed over (where :func:`submit` began the count): a stream cancelled midway
    has no summary to count from."""
    watch = asyncio.ensure_future(_watch_disconnect(request))
    watch.add_done_callback(lambda _: queue.close())
    open_rows = set(keys)
    counted = request.scope.get(TOKENS)
    try:
        while open_rows:
            taken = await queue.take()
            if taken is None:
                return
            batch = []
            for key, record in taken:
                if not isinstance(record, TokenEvent):
                    open_rows.discard(key)
                elif counted is not None:
                    counted[1] += 1
                batch.append((keys[key], record))
            yield batch
    finally:
        watch.cancel()
        if open_rows:
            state.engine.cancel(list(open_rows))


async def gather(
    state: ServeState, request: HttpRequest, keys: dict[Any, int], queue: Mailbox
) -> tuple[list[Summary], list[list[TokenEvent]]] | None:
    """Every choice's summary and token events once all have ended; None when the client went
    away (nobody reads an answer); a failed row is its error."""
    events: list[list[TokenEvent]] = [[] for _ in keys]
    summaries: list[Summary | None] = [None] * len(keys)
    async for batch in records(state, request, keys, queue):
        for index, record in batch:
            if isinstance(record, TokenEvent):
                events[index].append(record)
            elif isinstance(record, RowFailed):
                if record.message != "cancelled":  # cancelled: the client went away (or the server stops)
                    raise failure(record)
            else:
                summaries[index] = record
    if any(summary is None or _unanswered(summary) for summary in summaries):
        if state.engine.closing:  # still waiting for a row when the server began to stop
            raise ApiError(503, "the server is shutting down", None, "shutting_down")
        return None
    return summaries, events  # type: ignore[return-value]


def _unanswered(summary: Summary) -> bool:
    """A row the server stopped before it gave a token (a stream still ends it with a final chunk)."""
    return summary.stop_reason == "cancelled" and not summary.tokens


def failure(record: RowFailed) -> ApiError:
    """A row that failed: the request's own fault (a constraint it cannot complete) is a 400."""
    if record.user_error:
        return bad_request(record.message)
    return ApiError(500, f"decoding failed: {record.message}", None, "decoding_failed")
