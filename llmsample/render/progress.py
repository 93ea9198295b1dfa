"""The progress bar of a run of many requests (``batch``, ``sweep``) on stderr, a terminal only:
it moves with every token (a bar that moved only when a request ended sat still for minutes
while one row rambled on), says how many rows are in flight and the tokens per second, and
its time left is reckoned in tokens: the budget is every row's max tokens, less what rows that
ended early did not use."""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn


class TokenProgress:
    """A :class:`~llmsample.batch.run.BatchProgress` drawn with rich; a context manager."""

    def __init__(self, console: Console, label: str, disabled: bool) -> None:
        columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[rows]}"),
                   TextColumn("{task.fields[rate]}"), TimeRemainingColumn())  # fmt: skip
        self.bar = Progress(*columns, console=console, transient=True, disable=disabled)
        self.task = self.bar.add_task(label, total=None, rows="", rate="")
        self.rows = self.done = self.tokens = 0
        self.writing: set[int] = set()
        self.started = time.monotonic()

    def __enter__(self) -> TokenProgress:
        self.bar.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.bar.__exit__(kind, error, trace)

    def planned(self, rows: int, tokens: int) -> None:
        self.rows, self.started = rows, time.monotonic()
        self.bar.update(self.task, total=tokens)
        self._show()

    def token(self, row: int) -> None:
        self.tokens += 1
        self.writing.add(row)
        self.bar.advance(self.task)
        self._show()

    def finished(self, row: int, tokens: int, max_tokens: int) -> None:
        self.done += 1
        self.writing.discard(row)
        total = self.bar.tasks[0].total or 0
        self.bar.update(self.task, total=max(total - (max_tokens - tokens), self.tokens))
        self._show()

    def _show(self) -> None:
        elapsed = time.monotonic() - self.started
        rate = f"{self.tokens / elapsed:.1f} tok/s" if elapsed > 0 and self.tokens else ""
        rows = f"{self.done}/{self.rows} done, {len(self.writing)} in flight"
        self.bar.update(self.task, rows=rows, rate=rate)
