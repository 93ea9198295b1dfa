"""Where the loop's requests come from: a list or iterator (``generate``, ``batch``), or a queue
that requests join while others decode and leave when their client goes away (a server). The
queue also takes work that must run on the loop's own thread (the thread that owns the model's
OpenMP team): ``explain`` on a warm engine runs between two steps, or at once when idle."""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any, Protocol

from llmsample.engine.row_state import BatchItem


class Feed(Protocol):
    def take(self, n: int, wait: bool) -> list[BatchItem]:
        """Up to ``n`` new requests. ``wait`` (no row is decoding): block until one arrives; an
        empty list then means the feed is closed and the loop ends."""
        ...

    def cancelled(self) -> frozenset[Any]:
        """Keys of requests to drop now (their rows leave at the end of the step)."""
        ...


class IterableFeed:
    """Requests from an iterable, taken as rows free up; nothing is ever cancelled."""

    def __init__(self, items: Iterable[BatchItem]) -> None:
        self._items = iter(items)

    def take(self, n: int, wait: bool) -> list[BatchItem]:
        return list(itertools.islice(self._items, n))

    def cancelled(self) -> frozenset[Any]:
        return frozenset()


class QueueFeed:
    """A thread-safe queue of requests for a loop running in its own thread: ``put`` from any
    thread, ``cancel`` a key (a disconnected client), ``close`` to let the loop end once idle;
    ``call`` runs work on the loop's thread the next time it looks here (every step)."""

    def __init__(self) -> None:
        self._items: deque[BatchItem] = deque()
        self._cancelled: set[Any] = set()
        self._closed = False
        self._ready = threading.Condition()
        self._calls: list[tuple[Callable[[], Any], Future[Any]]] = []

    def call(self, work: Callable[[], Any]) -> Future[Any]:
        """``work()`` on the loop's thread, between two steps (at once when the loop is idle);
        its result or exception comes in the future. A closed feed raises ``RuntimeError``."""
        future: Future[Any] = Future()
        with self._ready:
            if self._closed:
                raise RuntimeError("the feed is closed")
            self._calls.append((work, future))
            self._ready.notify()
        return future

    def _run_calls(self) -> None:
        with self._ready:
            calls, self._calls = self._calls, []
        for work, future in calls:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(work())
                except BaseException as exc:  # the caller's to raise, on its own thread
                    future.set_exception(exc)

    def put(self, item: BatchItem) -> None:
        with self._ready:
            if self._closed:
                raise RuntimeError("the feed is closed")
            self._items.append(item)
            self._ready.notify()

    def cancel(self, key: Any) -> None:
        """Drop a request: still queued, it never starts; decoding, its row leaves after the step."""
        with self._ready:
            self._cancelled.add(key)
            self._items = deque(item for item in self._items if item.key != key)

    def close(self) -> None:
        with self._ready:
            self._closed = True
            calls, self._calls = self._calls, []
            self._ready.notify_all()
        for _, future in calls:
            future.set_exception(RuntimeError("the feed is closed"))

    def __len__(self) -> int:
        with self._ready:
            return len(self._items)

    def take(self, n: int, wait: bool) -> list[BatchItem]:
        while True:
            self._run_calls()
            with self._ready:
                while wait and not self._items and not self._closed and not self._calls:
                    self._ready.wait()
                if not (wait and self._calls and not self._items and not self._closed):
                    return [self._items.popleft() for _ in range(min(n, len(self._items)))]

    def cancelled(self) -> frozenset[Any]:
        self._run_calls()
        with self._ready:
            keys, self._cancelled = frozenset(self._cancelled), set()
            return keys
