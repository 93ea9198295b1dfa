"""Uvicorn's HTTP/1.1 protocol (h11) with a deadline for a request's headers: uvicorn waits for
them forever, so half-sent requests could hold sockets open for good (slowloris). A connection
that has not sent a whole request head within the deadline, once it opens or once an answer has
gone out on it, is closed. The body has a deadline of its own, where the app reads it
(:func:`llmsample.serve.flow.read_json`)."""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def with_header_deadline(seconds: float) -> type[H11Protocol]:
    """The protocol class uvicorn's ``Config(http=...)`` takes, its deadline ``seconds``."""

    class HeaderDeadline(H11Protocol):
        deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # a whole request head has come
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm()  # the next request on this connection has its own deadline

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self.deadline = self.loop.call_later(seconds, self._late)

        def _disarm(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None

        def _late(self) -> None:
            self.deadline = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return HeaderDeadline
