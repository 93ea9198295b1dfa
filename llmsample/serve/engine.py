"""The server's one decoding loop: a background thread runs :func:`llmsample.engine.decode.decode`
over a :class:`QueueFeed` for as long as the server lives, so every in-flight HTTP request is a
row of one continuous batch (requests that arrive join at the next step). Each row's records
go back to the request that owns its key, on that request's event loop."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from llmsample.engine.decode import DecodeOptions, decode
from llmsample.engine.feed import QueueFeed
from llmsample.engine.rows import BatchItem, RowFailed
from llmsample.errors import first_line
from llmsample.models.loading import LoadedModel

Deliver = Callable[[Any, Any], None]  # (key, record); called on the engine thread


class Busy(Exception):
    """The queue is full (the server answers 503 with ``Retry-After``)."""


class Closing(Exception):
    """The server is shutting down and takes no new requests."""


GATHER_S = 0.005
"""An idle loop woken by one request waits this long for others arriving with it, so requests
sent together start together (one prefill) instead of one per step."""


class _TrackedFeed:
    """The queue, remembering which requests the loop has taken (they have rows)."""

    def __init__(self, feed: QueueFeed, started: set[Any], lock: threading.Lock) -> None:
        self.feed, self.started, self.lock = feed, started, lock

    def take(self, n: int, wait: bool) -> list[BatchItem]:
        items = self.feed.take(n, wait)
        if wait and 0 < len(items) < n:
            time.sleep(GATHER_S)
            items += self.feed.take(n - len(items), False)
        with self.lock:
            self.started.update(item.key for item in items)
        return items

    def cancelled(self) -> frozenset[Any]:
        return self.feed.cancelled()


class Engine:
    """Owns the loop's thread; ``submit`` puts rows on the queue, ``cancel`` drops them."""

    def __init__(self, lm: LoadedModel, batch_size: int, max_queue: int, top_n: int = 20) -> None:
        self.lm = lm
        self.batch_size = batch_size
        self.max_queue = max_queue
        self.options = DecodeOptions(top_n=top_n)
        self.feed = QueueFeed()
        self.lock = threading.Lock()
        self.routes: dict[Any, Deliver] = {}
        self.started: set[Any] = set()
        self.closing = False
        self.counts = {"finished": 0, "cancelled": 0, "failed": 0}  # rows, since the start
        self.keys = itertools.count()
        self.thread = threading.Thread(target=self._run, name="llmsample-engine", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def new_key(self) -> int:
        with self.lock:
            return next(self.keys)

    def submit(self, items: list[BatchItem], deliver: Deliver) -> None:
        """Queue the rows of one request (all or none); raises :class:`Busy` or :class:`Closing`."""
        with self.lock:
            if self.closing:
                raise Closing
            if len(self.feed) + len(items) > self.max_queue:
                raise Busy
            for item in items:
                self.routes[item.key] = deliver
        for item in items:
            self.feed.put(item)

    def cancel(self, keys: list[Any]) -> None:
        """The client went away: rows still queued never start, decoding ones leave after the step."""
        with self.lock:
            live = [key for key in keys if key in self.routes]
        for key in live:
            self.feed.cancel(key)
        if live:
            # A queued row that never starts has no summary from the loop: end it here.
            with self.lock:
                never = [(key, self.routes.pop(key)) for key in live if key not in self.started]
                self.counts["cancelled"] += len(never)
            for key, deliver in never:
                deliver(key, RowFailed(key, "cancelled"))

    def shutdown(self) -> None:
        """No new requests; every row in flight ends now (its stream gets a final chunk)."""
        with self.lock:
            self.closing = True
            keys = list(self.routes)
        self.cancel(keys)
        self.feed.close()

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)

    def _run(self) -> None:
        while True:
            try:
                for key, record in decode(
                    self.lm, _TrackedFeed(self.feed, self.started, self.lock), self.batch_size, self.options
                ):
                    self._route(key, record)
                return  # the feed was closed
            except Exception as exc:  # a failed step fails the rows in it, not the server
                self._fail_started(first_line(exc))
                with self.lock:
                    if self.closing:
                        return

    def _route(self, key: Any, record: Any) -> None:
        ends = not hasattr(record, "token_id")
        with self.lock:
            deliver = self.routes.pop(key, None) if ends else self.routes.get(key)
            if ends:
                self.started.discard(key)
                self._count(record)
        if deliver is not None:
            deliver(key, record)

    def _count(self, record: Any) -> None:
        if isinstance(record, RowFailed):
            self.counts["failed"] += 1
        else:
            self.counts["cancelled" if record.stop_reason == "cancelled" else "finished"] += 1

    def figures(self) -> dict[str, int]:
        """What ``/health`` reports: rows in flight (running or queued), queued, and totals."""
        with self.lock:
            return {"in_flight": len(self.routes), "queued": len(self.feed), **self.counts}

    def _fail_started(self, message: str) -> None:
        with self.lock:
            failed = [(key, self.routes.pop(key)) for key in self.started if key in self.routes]
            self.counts["failed"] += len(failed)
            self.started.clear()
        for key, deliver in failed:
            deliver(key, RowFailed(key, message))
