"""The one interface every command runs on: an :class:`EngineClient` takes jobs
(:class:`~llmsample.jobs.Job`) and answers with the loop's own records, whether the model is
loaded in this process (:class:`~llmsample.api.local.LocalEngine`) or warm in another
(:class:`RemoteEngine`, over its socket or a server's URL). A command builds its jobs and
renders what comes back; what an engine cannot do, it refuses in one line naming ``--local``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from llmsample.client.connection import Target, engine_status, post_json, say, stream_job, stream_rows
from llmsample.client.wire import EXPLAIN_PATH, Failed
from llmsample.events import Summary, TokenEvent
from llmsample.jobs import Explanation, Job

if TYPE_CHECKING:
    from llmsample.analysis.explain_records import Answer

Record = TokenEvent | Summary

IN_PROCESS = "in-process"
"""The ``where`` of the engine in this process."""


class EngineClient(Protocol):
    """What a command asks of an engine. ``run`` and ``run_many`` return their records lazily
    but fail early: a prompt the engine cannot run raises before the first record. Closing a
    run's iterator cancels its row."""

    where: str  # where it decodes: IN_PROCESS, or the engine's address

    def model_name(self) -> str | None:
        """The model's name where known without asking (a warm engine's from its record)."""
        ...

    def status(self) -> dict[str, Any]:
        """The model, its backend and weight type, the context length, whether it has a chat
        template, and ``capabilities``: what it honours beyond a row of the batch (``reference``,
        ``drafter``)."""
        ...

    def run(self, job: Job) -> Iterator[Record]:
        """One job's token records, then its summary; a row that fails raises as in-process."""
        ...

    def run_many(self, jobs: Sequence[Job]) -> Iterator[tuple[int, Record | Failed]]:
        """Several jobs as rows decoded together: ``(index, record)``, a failed row ending with
        its :class:`~llmsample.client.wire.Failed` while the others go on."""
        ...

    def explain(self, asked: Explanation) -> Answer:
        """``explain``'s answer: the next token's :class:`ChainReport`, or the continuation's
        tokens scored (a warm engine's read back from JSON to the last bit)."""
        ...

    def close(self) -> None: ...


class RemoteEngine:
    """An engine in another process: one of this user's (``unix:PATH``) or a server (a URL)."""

    def __init__(self, target: Target, waiting: Callable[[str], None] = say) -> None:
        self.target, self.waiting = target, waiting
        self.where = target.where
        self._status: dict[str, Any] | None = None

    def model_name(self) -> str | None:
        return self.target.name

    def status(self) -> dict[str, Any]:
        if self._status is None:
            self._status = engine_status(self.target)
        return self._status

    def _addressed(self, job: Job) -> Job:
        """This user's engine was found by its model options: whatever it serves is the model
        asked for; a server checks the name it is given."""
        return dataclasses.replace(job, model=None) if self.where.startswith("unix:") else job

    def run(self, job: Job) -> Iterator[Record]:
        return stream_job(self.target, self._addressed(job), self.waiting)

    def run_many(self, jobs: Sequence[Job]) -> Iterator[tuple[int, Record | Failed]]:
        return stream_rows(self.target, [self._addressed(job) for job in jobs], self.waiting)

    def explain(self, asked: Explanation) -> Answer:
        from llmsample.analysis.explain_records import answer_from_json

        asked = dataclasses.replace(asked, job=self._addressed(asked.job))
        return answer_from_json(post_json(self.target, EXPLAIN_PATH, asked.to_json()))

    def close(self) -> None:
        """Nothing is held between requests: each opens its own connection."""
