"""Records from the engine's thread to one request's event loop, many at a time: the engine
appends, and wakes the loop only when it is not already due to look (one wake-up per batch of
records, not per token), so a busy step costs the HTTP side one task switch per request."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any


class Mailbox:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.items: deque[tuple[Any, Any]] = deque()
        self.lock = threading.Lock()
        self.ready = asyncio.Event()
        self.due = False  # a wake-up is scheduled and has not run yet

    def put(self, key: Any, record: Any) -> None:
        """From the engine's thread."""
        with self.lock:
            self.items.append((key, record))
            if self.due:
                return
            self.due = True
        self.loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        with self.lock:
            self.due = False
        self.ready.set()

    async def take(self) -> list[tuple[Any, Any]]:
        """Everything that has arrived (waits for at least one)."""
        while True:
            await self.ready.wait()
            self.ready.clear()
            with self.lock:
                items = list(self.items)
                self.items.clear()
            if items:
                return items
