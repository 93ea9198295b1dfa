"""The log as one more renderer: it reads the run's events like the others and keeps the run when
its summary comes. A log that cannot be written (a read-only or full disk, a locked database) costs
one warning line, never the run."""

from __future__ import annotations

import sqlite3
import sys
from dataclasses import asdict
from typing import Any

from llmsample.events import Summary, TokenEvent
from llmsample.logs.store import LoggedRun, add, database_path


class LogRecorder:
    """Collects a run's token records; writes the run at its summary (interrupted runs too)."""

    def __init__(self, command: str, prompt: str, settings: dict[str, Any], system: str | None) -> None:
        self.asked = (command, prompt, system, settings)
        self.records: list[dict[str, Any]] = []
        self.run_id: int | None = None

    def token(self, event: TokenEvent) -> None:
        self.records.append(event.to_dict())

    def summary(self, summary: Summary) -> None:
        command, prompt, system, settings = self.asked
        facts = summary.facts
        run = LoggedRun(
            command, summary.model, facts.backend, summary.preset, summary.seed, prompt, system, settings,
            summary.text, summary.stop_reason, summary.tokens, asdict(summary), self.records,
        )  # fmt: skip
        try:
            self.run_id = add(run)
        except OSError as exc:
            warn(f"{exc.strerror or exc}: {exc.filename or database_path()}")
        except (sqlite3.Error, ValueError) as exc:  # not a database, locked past the wait, a NaN
            warn(f"{exc}: {database_path()}")


def warn(reason: str) -> None:
    print(f"Warning: the run was not logged ({reason}); `llmsample logs off` stops logging", file=sys.stderr)
