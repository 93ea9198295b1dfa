"""One line per request on stderr, as llama-server and Ollama log theirs: when (UTC), from
where, the method and path, the status, the tokens (prompt+completion), how long it took and,
where the request had keys the server ignored, their names. ``/health`` is left out, as llama-server leaves it (a load balancer asks every few seconds), and
``llmsample serve --quiet`` leaves the whole log out."""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

TOKENS = "llmsample.tokens"
"""The scope's key for a completion's ``[prompt tokens, completion tokens]``: the prompts' once
they are submitted, each token as the engine hands it over (so a stream its client cancels
counts what it was sent), the usage the answer reports once it is whole."""
WARNINGS = "llmsample.warnings"
"""The scope's key for the request's ``warnings`` (the keys it ignored), as its answer has them."""


UNLOGGED = frozenset({"/health"})


def _stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class AccessLog:
    """ASGI middleware: the line of each HTTP request once its response has gone out."""

    def __init__(self, app: App, write: Callable[[str], None] = _stderr) -> None:
        self.app = app
        self.write = write

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNLOGGED:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [500]  # what uvicorn answers when the app raises before it starts a response

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.write(line(scope, status[0], time.perf_counter() - started))


def line(scope: Scope, status: int, elapsed_s: float) -> str:
    """``2026-12-03 13:40:01 127.0.0.1 POST /v1/completions 200 12+34 tokens 0.517 s``, then
    `` warnings: temprature, store`` when the request's keys were ignored (the answer says why)."""
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
    client = scope.get("client")
    tokens = scope.get(TOKENS)
    counted = f"{tokens[0]}+{tokens[1]} tokens" if tokens else "-"
    who = client[0] if client else "-"
    warned = scope.get(WARNINGS)
    noted = f" warnings: {', '.join(warning.split(':')[0] for warning in warned)}" if warned else ""
    return f"{when} {who} {scope['method']} {scope['path']} {status} {counted} {elapsed_s:.3f} s{noted}"
