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

import dataclasses
import itertools
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from llmsample.engine.decode import DecodeOptions, decode
from llmsample.engine.feed import QueueFeed
from llmsample.engine.prompt_cache import PromptCache
from llmsample.engine.row_state import BatchItem, RowFailed
from llmsample.errors import first_line
from llmsample.events import Summary
from llmsample.models.loading import LoadedModel
from llmsample.serve.mailbox import Mailbox, post
from llmsample.serve.prometheus import ServeMetrics

if TYPE_CHECKING:
    from llmsample.serve.journal import ServeLog


class Busy(Exception):
    """Every row and every queue place is taken (the server answers 503 with ``Retry-After``:
    ``retry_after`` seconds, about how long an answer takes, when a row may be free again)."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"busy, retry after {retry_after} s")
        self.retry_after = retry_after


class Closing(Exception):
    """The server is shutting down and takes no new requests."""


ANSWER_WEIGHT = 0.2
"""How much the newest answer moves :meth:`Engine.retry_after`'s average of how long one takes."""

GATHER_S = 0.005
"""An idle loop woken by one request waits this long for others arriving with it, so requests
sent together start together (one prefill) instead of one per step."""


class _TrackedFeed:
    """The queue, remembering which requests the loop has taken (they have rows, and leave
    ``waiting``). The loop looks at it once a step's records are out (``cancelled`` every step,
    ``take`` when a row is free or nothing runs): that is where the step's records are handed over."""

    def __init__(
        self,
        feed: QueueFeed,
        started: set[Any],
        waiting: dict[Any, BatchItem],
        lock: threading.Lock,
        flush: Callable[[], None],
    ) -> None:
        self.feed, self.started, self.waiting, self.lock, self.flush = feed, started, waiting, lock, flush

    def take(self, n: int, wait: bool) -> list[BatchItem]:
        self.flush()
        items = self.feed.take(n, wait)
        if wait and 0 < len(items) < n:
            time.sleep(GATHER_S)
            items += self.feed.take(n - len(items), False)
        with self.lock:
            for item in items:
                self.waiting.pop(item.key, None)
                self.started.add(item.key)
        return items

    def cancelled(self) -> frozenset[Any]:
        self.flush()
        return self.feed.cancelled()


class Engine:
    """``run`` decodes until ``shutdown``; ``submit`` puts rows on the queue, ``cancel`` drops
    them (from any thread). It holds ``batch_size`` rows decoding and ``max_queue`` more waiting
    for one: a request is admitted while its rows fit in both together, and always when nothing
    is in flight (a request of more rows than that runs in waves rather than never)."""

    def __init__(
        self,
        lm: LoadedModel,
        batch_size: int,
        max_queue: int,
        top_n: int = 20,
        prompt_cache_mb: int = 0,
        deterministic: bool = False,
        reference: LoadedModel | None = None,
    ) -> None:
        """``prompt_cache_mb``: the prompt cache's budget across requests (0: none);
        ``deterministic``: every row computed alone (``--deterministic``); ``reference``: every
        row decodes beside it, and a job that asks (``--reference``) has its tokens scored (the
        prompt cache then stays off: a prefix kept for one model is not the other's)."""
        self.lm = lm
        self.batch_size = batch_size
        self.max_queue = max_queue
        self.metrics = ServeMetrics()
        cache = PromptCache(prompt_cache_mb * 2**20) if prompt_cache_mb else None
        self.options = DecodeOptions(top_n=top_n, reference=reference, deterministic=deterministic,
                                     on_forward=self.metrics.forward_pass, prompt_cache=cache)  # fmt: skip
        self.feed = QueueFeed()
        self.lock = threading.Lock()
        self.routes: dict[Any, Mailbox] = {}
        self.pending: dict[Mailbox, list[tuple[Any, Any]]] = {}  # this step's records (the loop's thread only)
        self.started: set[Any] = set()
        self.waiting: dict[Any, BatchItem] = {}  # submitted, not yet taken by the loop
        self.answer_s: float | None = None  # how long an answer takes, on average of late
        self.closing = False
        self.counts = {"finished": 0, "cancelled": 0, "failed": 0}  # rows, since the start
        self.keys = itertools.count()
        self.log: ServeLog | None = None  # sees every row's records, for the run log

    def new_key(self) -> int:
        with self.lock:
            return next(self.keys)

    def submit(self, items: list[BatchItem], mailbox: Mailbox) -> None:
        """Queue the rows of one request (all or none); raises :class:`Busy` or :class:`Closing`."""
        with self.lock:
            if self.closing or (self.routes and len(self.routes) + len(items) > self.batch_size + self.max_queue):
                if self.log is not None:
                    self.log.forget(items)
                raise Closing if self.closing else Busy(self.retry_after())
            for item in items:  # under the lock: a shutdown lands before these rows or after them
                self.routes[item.key] = mailbox
                self.waiting[item.key] = item
                self.feed.put(item)

    def call(self, work: Callable[[], Any]) -> Future[Any]:
        """``work()`` on the loop's thread, between two steps of the batch (at once when idle):
        a pass of its own on the engine's model (``explain``), never beside the loop on another
        thread (see the module's note on OpenMP teams). Raises :class:`Closing` once stopping."""
        with self.lock:
            if self.closing:
                raise Closing
        try:
            return self.feed.call(work)
        except RuntimeError:  # closed between the two looks
            raise Closing from None

    def retry_after(self) -> int:
        """Whole seconds until a row is likely free: about how long an answer has taken of late."""
        return max(1, math.ceil(self.answer_s or 0))

    def cancel(self, keys: list[Any]) -> None:
        """The client went away (or the server stops): rows still queued never start and end
        here with a summary that says ``cancelled``, as decoding ones do after the step."""
        with self.lock:
            live = [key for key in keys if key in self.routes]
        for key in live:
            self.feed.cancel(key)
        if live:
            # A queued row that never starts has no summary from the loop: end it here.
            with self.lock:
                never = [(self.waiting.pop(key), self.routes.pop(key)) for key in live if key in self.waiting]
                self.counts["cancelled"] += len(never)
            for item, _ in never:
                self.metrics.row_ended("cancelled", _unstarted(item))
            self._post([(box, [(item.key, _unstarted(item))]) for item, box in never])

    def shutdown(self) -> None:
        """No new requests; every row in flight ends now (its stream gets a final chunk)."""
        with self.lock:
            self.closing = True
            keys = list(self.routes)
        self.cancel(keys)
        self.feed.close()

    def run(self) -> None:
        """Decode every request that comes until :meth:`shutdown`; on the thread that loaded the model."""
        feed = _TrackedFeed(self.feed, self.started, self.waiting, self.lock, self._flush)
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
        if self.log is not None:
            self.log.see(key, record)
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
            self.metrics.row_ended("failed", None)
            return
        how = "cancelled" if record.stop_reason == "cancelled" else "finished"
        self.metrics.row_ended(how, record)
        if how == "cancelled":
            self.counts["cancelled"] += 1
        else:
            self.counts["finished"] += 1
            last = record.elapsed_s
            self.answer_s = last if self.answer_s is None else self.answer_s + ANSWER_WEIGHT * (last - self.answer_s)

    def figures(self) -> dict[str, int]:
        """What ``/health`` reports: rows in flight (running or queued), queued, and totals."""
        with self.lock:
            return {"in_flight": len(self.routes), "queued": len(self.feed), **self.counts}

    def _fail_started(self, message: str) -> None:
        with self.lock:
            failed = [(key, self.routes.pop(key)) for key in self.started if key in self.routes]
            self.counts["failed"] += len(failed)
            self.started.clear()
        for _ in failed:
            self.metrics.row_ended("failed", None)
        self._post([(box, [(key, RowFailed(key, message))]) for key, box in failed])

    def _post(self, ended: list[tuple[Mailbox, list[tuple[Any, Any]]]]) -> None:
        """Ends of rows the loop did not route (never started, failed): to their requests and the log."""
        if self.log is not None:
            for _, records in ended:
                for key, record in records:
                    self.log.see(key, record)
        post(ended)


def _unstarted(item: BatchItem) -> Summary:
    """A queued row's end before it ever ran: no tokens, its prompt counted as a started row's is."""
    return dataclasses.replace(item.stats.summary("cancelled"), prompt_tokens=len(item.prompt_ids))
