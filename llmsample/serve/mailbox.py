"""Records from the engine's thread to the requests' event loop, a whole step at a time: the
engine gathers a step's records and hands them over in one call (:func:`post`: one wake-up of
the loop per step, not one per request or per token); on the loop each request's mailbox gets
its share and wakes its one waiting task."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any


class Mailbox:
    """One request's records. Everything but :func:`post` runs on the request's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.items: list[tuple[Any, Any]] = []
        self.waiter: asyncio.Future[None] | None = None
        self.gone = False

    def extend(self, records: list[tuple[Any, Any]]) -> None:
        self.items += records
        self._wake()

    def close(self) -> None:
        """The client went away: :meth:`take` returns None from now on."""
        self.gone = True
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def take(self) -> list[tuple[Any, Any]] | None:
        """Everything that has arrived (waits for at least one); None once the client has gone."""
        while not self.items and not self.gone:
            self.waiter = self.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        if self.gone:
            return None
        items, self.items = self.items, []
        return items


def post(batches: Iterable[tuple[Mailbox, list[tuple[Any, Any]]]]) -> None:
    """From any thread: each mailbox's records, one call per event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Mailbox, list[tuple[Any, Any]]]]] = {}
    for box, records in batches:
        by_loop.setdefault(box.loop, []).append((box, records))
    for loop, pairs in by_loop.items():
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for these any more
            loop.call_soon_threadsafe(_deliver, pairs)


def _deliver(pairs: list[tuple[Mailbox, list[tuple[Any, Any]]]]) -> None:
    for box, records in pairs:
        box.extend(records)
