"""The HTTP side: a Starlette app whose completion endpoints turn each request into rows of the
engine's one batch (:mod:`llmsample.serve.engine`) and answer in OpenAI's shapes, whole or as
server-sent events, and the Responses and Messages APIs on the same path
(:mod:`llmsample.serve.responses_api`, :mod:`llmsample.serve.messages_api`); plus
``/v1/models``, ``/health``, ``/tokenize``, ``/detokenize`` and the page at ``/``."""

from __future__ import annotations

import hmac
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request as HttpRequest
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from llmsample.batch.requests import CHAT_URL, COMPLETIONS_URL
from llmsample.batch.result_lines import dumps
from llmsample.engine.row_state import RowFailed
from llmsample.errors import first_line
from llmsample.events import TokenEvent
from llmsample.serve import messages_api, responses_api
from llmsample.serve.access import TOKENS
from llmsample.serve.api_errors import ApiError
from llmsample.serve.compat import warned
from llmsample.serve.completion_bodies import DONE, Answer
from llmsample.serve.flow import failure, gather, off_loop, read_json, records, submit
from llmsample.serve.mailbox import Mailbox
from llmsample.serve.parsing import parse_body
from llmsample.serve.prometheus import CountStatuses
from llmsample.serve.state import ServeState

Handler = Callable[[HttpRequest], Awaitable[Response]]


def _endpoint(
    state: ServeState,
    handler: Callable[[ServeState, HttpRequest], Awaitable[Response]],
    auth: bool = True,
    answer: Callable[[ApiError], Response] = ApiError.response,
) -> Handler:
    """Every failure a client caused is an error object (``answer``: OpenAI's, or another API's
    shape); the key is checked first. A failure of ours is one too (a 500), and one line on
    stderr rather than a traceback."""

    async def run(request: HttpRequest) -> Response:
        try:
            if auth and state.api_key is not None:
                _check_key(request, state.api_key)
            return await handler(state, request)
        except ApiError as exc:
            return answer(exc)
        except Exception as exc:  # the server goes on; the client gets an error object
            message = f"{type(exc).__name__}: {first_line(exc)}"
            print(f"llmsample serve: {request.method} {request.url.path} failed: {message}", file=sys.stderr)
            return answer(ApiError(500, f"the server failed: {message}", None, "internal_error"))

    return run


def _check_key(request: HttpRequest, key: str) -> None:
    """``Authorization: Bearer KEY`` (OpenAI's clients) or ``x-api-key: KEY`` (Anthropic's)."""
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    if "x-api-key" in request.headers and not given:
        scheme, token = "bearer", request.headers["x-api-key"]
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        missing = not given and "x-api-key" not in request.headers
        message = (
            "missing API key: send Authorization: Bearer KEY (or x-api-key: KEY)" if missing else "incorrect API key"
        )
        raise ApiError(401, message, None, "invalid_api_key")


async def completions(state: ServeState, request: HttpRequest, url: str) -> Response:
    chat = url == CHAT_URL
    serve = parse_body(
        await read_json(request, state.max_body, state.read_timeout), url, state.presets, state.strict_api
    )
    headers = warned(request.scope, serve.warnings)
    serve, keys, queue, shape = await submit(state, serve, chat, request.scope)
    answer = Answer(serve, state.lm.name, state.fingerprint, chat, state.lm.token_bytes, shape=shape)
    if serve.stream:
        stream = _stream(state, request, answer, keys, queue)
        return StreamingResponse(
            stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache", **headers}
        )
    gathered = await gather(state, request, keys, queue)
    if gathered is None:
        return Response(status_code=499)  # the client went away; nobody reads this
    summaries, events = gathered
    prompts = sum(summary.prompt_tokens for summary in summaries[:: serve.n])  # each prompt's, as usage counts
    request.scope[TOKENS] = [prompts, sum(summary.tokens for summary in summaries)]
    return JSONResponse(answer.body(summaries, events), headers=headers)


async def _stream(
    state: ServeState, request: HttpRequest, answer: Answer, keys: dict[Any, int], queue: Mailbox
) -> AsyncIterator[str]:
    """Server-sent events: the chunks of every record that has arrived go out in one write."""
    opening = answer.opening(len(keys))
    if opening:
        yield opening
    usage = [0, 0]  # prompt tokens, completion tokens: the log counts its own until every row has ended
    async for batch in records(state, request, keys, queue):
        chunks = [_chunk(answer, index, record, usage) for index, record in batch]
        yield "".join(chunk for chunk in chunks if chunk)
    request.scope[TOKENS] = usage
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
        return f"data: {dumps(failure(record).body())}\n\n"
    first = index % answer.serve.n == 0  # each prompt's tokens counted once, by its first choice
    usage[0], usage[1] = usage[0] + (record.prompt_tokens if first else 0), usage[1] + record.tokens
    if first:
        answer.count_cached(record)
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


async def metrics(state: ServeState, request: HttpRequest) -> Response:
    """Prometheus' text format (:mod:`llmsample.serve.prometheus`); behind the key, as vLLM's is."""
    figures = state.engine.figures()
    text = state.engine.metrics.render(figures["in_flight"] - figures["queued"], figures["queued"])
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


async def home(state: ServeState, request: HttpRequest) -> Response:
    """The page (no key needed to load it: its requests send the key the user types)."""
    import secrets

    from llmsample.serve import page

    nonce = secrets.token_urlsafe(16)
    config = page.page_config(state.lm, state.settings, state.presets)
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
    anthropic = messages_api.error_response

    async def chat(state: ServeState, request: HttpRequest) -> Response:
        return await completions(state, request, CHAT_URL)

    async def complete(state: ServeState, request: HttpRequest) -> Response:
        return await completions(state, request, COMPLETIONS_URL)

    routes = [
        Route(CHAT_URL, _endpoint(state, chat), methods=["POST"]),
        Route(COMPLETIONS_URL, _endpoint(state, complete), methods=["POST"]),
        Route("/v1/responses", _endpoint(state, responses_api.responses), methods=["POST"]),
        Route("/v1/messages", _endpoint(state, messages_api.messages, answer=anthropic), methods=["POST"]),
        Route(
            "/v1/messages/count_tokens", _endpoint(state, messages_api.count_tokens, answer=anthropic), methods=["POST"]
        ),
        Route("/v1/models", _endpoint(state, models), methods=["GET"]),
        Route("/v1/models/{name:path}", _endpoint(state, model), methods=["GET"]),
        Route("/health", _endpoint(state, health, auth=False), methods=["GET"]),
        Route("/metrics", _endpoint(state, metrics), methods=["GET"]),
        Route("/", _endpoint(state, home, auth=False), methods=["GET"]),
        Route("/tokenize", _endpoint(state, tokenize), methods=["POST"]),
        Route("/detokenize", _endpoint(state, detokenize), methods=["POST"]),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(CountStatuses, metrics=state.engine.metrics)])

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
