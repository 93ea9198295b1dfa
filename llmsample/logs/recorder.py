"""The log as one more renderer: it reads the run's events like the others and keeps the run when
its summary comes. A log that cannot be written (a read-only or full disk, a locked database) costs
one warning line, never the run; a process that keeps many runs (a batch, a server) warns once."""

from __future__ import annotations

import queue
import sqlite3
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from llmsample.events import Summary, TokenEvent
from llmsample.logs.store import DAMAGED, LoggedRun, add_all, database_path, way_out

_warned = False


class LogRecorder:
    """Collects a run's token records; writes the run at its summary (interrupted runs too)."""

    def __init__(
        self,
        command: str,
        prompt: str,
        settings: dict[str, Any],
        system: str | None,
        conversation: str | None = None,
        parent: int | None = None,
        flags: dict[str, Any] | None = None,
    ) -> None:
        self.asked = (command, prompt, system, settings)
        self.thread = (conversation, parent, flags)
        self.records: list[dict[str, Any]] = []
        self.run_id: int | None = None

    def token(self, event: TokenEvent) -> None:
        self.records.append(event.to_dict())

    def summary(self, summary: Summary) -> None:
        ids = keep([self.run(summary)])
        self.run_id = ids[0] if ids else None

    def run(self, summary: Summary) -> LoggedRun:
        """The run as the log keeps it."""
        command, prompt, system, settings = self.asked
        return LoggedRun(
            command, summary.model, summary.facts.backend, summary.preset, summary.seed, prompt, system, settings,
            summary.text, summary.stop_reason, summary.tokens, asdict(summary), self.records, *self.thread,
        )  # fmt: skip


def keep(runs: list[LoggedRun]) -> list[int] | None:
    """``runs`` into the log, their ids; None (and the process's one warning) when it cannot be written."""
    try:
        return add_all(runs)
    except OSError as exc:
        warn(f"{exc.strerror or exc}: {exc.filename or database_path()}")
    except (sqlite3.Error, ValueError) as exc:  # not a database, read-only, locked past the wait, a NaN
        damaged = getattr(exc, "sqlite_errorname", None) in DAMAGED
        warn(f"{exc}: {database_path()}" + (f"; {way_out(database_path())}" if damaged else ""))
    return None


def warn(reason: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        print(f"Warning: the run was not logged ({reason}); `llmsample logs off` stops logging", file=sys.stderr)


class BackgroundLog:
    """Runs kept by a thread of their own, so that a writer that waits (another's transaction, a
    slow disk) never holds up the loop that decodes (``serve``); ``close`` waits for the last.
    What is put is a maker of the run: its records are made on this thread too."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[Callable[[], LoggedRun] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._write, name="llmsample-log", daemon=True)
        self.thread.start()

    def put(self, make: Callable[[], LoggedRun]) -> None:
        self.queue.put(make)

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()

    def _write(self) -> None:
        ended = False
        while not ended:
            runs, item = [], self.queue.get()
            while item is not None:
                runs.append(item())  # and what came meanwhile: one transaction for them all
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
            ended = item is None
            if runs:
                keep(runs)
