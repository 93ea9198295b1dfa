"""A server's requests in the run log (command ``serve``): each row that ends with a summary,
whichever endpoint asked for it, streamed or whole. The engine's loop hands each record over
(a list append); the runs are made and written on the log's own thread."""

from __future__ import annotations

import threading
from typing import Any

from llmsample.batch.requests import Request
from llmsample.batch.run import request_recorder
from llmsample.engine.row_state import BatchItem
from llmsample.events import Summary, TokenEvent
from llmsample.logs.recorder import BackgroundLog


class ServeLog:
    """``expect`` a request's rows (the tokenizing thread), ``see`` their records (the engine's
    thread), ``close`` at shutdown (every ended row written)."""

    def __init__(self, system: str | None) -> None:
        self.system = system
        self.lock = threading.Lock()
        self.rows: dict[Any, tuple[Request, BatchItem, list[TokenEvent]]] = {}
        self.writer = BackgroundLog()

    def expect(self, request: Request, items: list[BatchItem]) -> None:
        with self.lock:
            for item in items:
                self.rows[item.key] = (request, item, [])

    def forget(self, items: list[BatchItem]) -> None:
        """Rows the engine refused (busy, shutting down): nothing of them will come."""
        with self.lock:
            for item in items:
                self.rows.pop(item.key, None)

    def see(self, key: Any, record: Any) -> None:
        """One of a row's records: a token kept, an end written (a failed row: forgotten)."""
        if isinstance(record, TokenEvent):
            row = self.rows.get(key)
            if row is not None:
                row[2].append(record)
            return
        with self.lock:
            row = self.rows.pop(key, None)
        if row is None or not isinstance(record, Summary) or (record.stop_reason == "cancelled" and not record.tokens):
            return
        request, item, events = row
        self.writer.put(lambda: request_recorder("serve", request, self.system, item.cfg, events).run(record))

    def close(self) -> None:
        self.writer.close()
