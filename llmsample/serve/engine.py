"""The server's one decoding loop: :meth:`Engine.run` runs :func:`llmsample.engine.decode.decode`
over a :class:`QueueFeed` for as long as the server lives, so every in-flight HTTP request is a
row of one continuous batch (requests that arrive join at the next step). It runs on the thread
that loaded the model (the main thread; the HTTP side has a thread of its own): an OpenMP team
belongs to the thread that starts it, and a second thread's team made libgomp count more threads
than cores and stop spinning between parallel regions, each forward pass then ~35 % slower on a
2-core CPU. Each row's records go back to the request that owns its key, on that request's event
loop, a step at a time: the loop gathers a step's records and hands them over in one call when
the step ends (when it looks at its feed), so the HTTP side wakes once per step, whatever the rows."""

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
from llmsample.serve.mailbox import Mailbox, post


class Busy(Exception):
    """The queue is full (the server answers 503 with ``Retry-After``)."""


class Closing(Exception):
    """The server is shutting down and takes no new requests."""


GATHER_S = 0.005
"""An idle loop woken by one request waits this long for others arriving with it, so requests
sent together start together (one prefill) instead of one per step."""


class _TrackedFeed:
    """The queue, remembering which requests the loop has taken (they have rows). The loop
    looks at it once a step's records are out (``cancelled`` every step, ``take`` when a row is
    free or nothing runs): that is where the step's records are handed over."""

    def __init__(self, feed: QueueFeed, started: set[Any], lock: threading.Lock, flush: Callable[[], None]) -> None:
        self.feed, self.started, self.lock, self.flush = feed, started, lock, flush

    def take(self, n: int, wait: bool) -> list[BatchItem]:
        self.flush()
        items = self.feed.take(n, wait)
        if wait and 0 < len(items) < n:
            time.sleep(GATHER_S)
            items += self.feed.take(n - len(items), False)
        with self.lock:
            self.started.update(item.key for item in items)
        return items

    def cancelled(self) -> frozenset[Any]:
        self.flush()
        return self.feed.cancelled()


class Engine:
    """``run`` decodes until ``shutdown``; ``submit`` puts rows on the queue, ``cancel`` drops
    them (from any thread)."""

    def __init__(self, lm: LoadedModel, batch_size: int, max_queue: int, top_n: int = 20) -> None:
        self.lm = lm
        self.batch_size = batch_size
        self.max_queue = max_queue
        self.options = DecodeOptions(top_n=top_n)
        self.feed = QueueFeed()
        self.lock = threading.Lock()
        self.routes: dict[Any, Mailbox] = {}
        self.pending: dict[Mailbox, list[tuple[Any, Any]]] = {}  # this step's records (the loop's thread only)
        self.started: set[Any] = set()
        self.closing = False
        self.counts = {"finished": 0, "cancelled": 0, "failed": 0}  # rows, since the start
        self.keys = itertools.count()

    def new_key(self) -> int:
        with self.lock:
            return next(self.keys)

    def submit(self, items: list[BatchItem], mailbox: Mailbox) -> None:
        """Queue the rows of one request (all or none); raises :class:`Busy` or :class:`Closing`."""
        with self.lock:
            if self.closing:
                raise Closing
            if len(self.feed) + len(items) > self.max_queue:
                raise Busy
            for item in items:  # under the lock: a shutdown lands before these rows or after them
                self.routes[item.key] = mailbox
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
            post((box, [(key, RowFailed(key, "cancelled"))]) for key, box in never)

    def shutdown(self) -> None:
        """No new requests; every row in flight ends now (its stream gets a final chunk)."""
        with self.lock:
            self.closing = True
            keys = list(self.routes)
        self.cancel(keys)
        self.feed.close()

    def run(self) -> None:
        """Decode every request that comes until :meth:`shutdown`; on the thread that loaded the model."""
        feed = _TrackedFeed(self.feed, self.started, self.lock, self._flush)
        while True:
            try:
                for key, record in decode(self.lm, feed, self.batch_size, self.options):
                    self._route(key, record)
                self._flush()
                return  # the feed was closed
            except Exception as exc:  # a failed step fails the rows in it, not the server
                self._flush()
                self._fail_started(first_line(exc))
                with self.lock:
                    if self.closing:
                        return

    def _route(self, key: Any, record: Any) -> None:
        ends = not hasattr(record, "token_id")
        with self.lock:
            box = self.routes.pop(key, None) if ends else self.routes.get(key)
            if ends:
                self.started.discard(key)
                self._count(record)
        if box is not None:
            self.pending.setdefault(box, []).append((key, record))

    def _flush(self) -> None:
        """The step's records to their requests, one hand-over for all of them."""
        if self.pending:
            batches, self.pending = self.pending, {}
            post(batches.items())

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
        post((box, [(key, RowFailed(key, message))]) for key, box in failed)
