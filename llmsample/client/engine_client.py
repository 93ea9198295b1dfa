"""The one interface every command runs on: an :class:`EngineClient` takes jobs
(:class:`~llmsample.jobs.Job`) and answers with the loop's own records, whether the model is
loaded in this process (:class:`~llmsample.api.local.LocalEngine`) or warm in another
(:class:`RemoteEngine`, over its socket or a server's URL). A command builds its jobs and
renders what comes back; what an engine cannot do, it refuses in one line naming ``--local``."""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from llmsample.client.connection import (
    EngineGone,
    Target,
    chat_job,
    engine_status,
    job_records,
    post_json,
    say,
    stream_job,
)
from llmsample.client.wire import EXPLAIN_PATH, Failed
from llmsample.errors import RuntimeFailure, UserError
from llmsample.events import Summary, TokenEvent
from llmsample.jobs import Explanation, Job

if TYPE_CHECKING:
    from llmsample.analysis.explain_records import Answer

Record = TokenEvent | Summary

IN_PROCESS = "in-process"
"""The ``where`` of the engine in this process."""
WINDOW_FALLBACK = 8
"""Jobs in flight at once on a server whose status does not say its rows."""


@dataclasses.dataclass
class Answered:
    """A chat turn's answer, its row admitted: its records (as :meth:`EngineClient.run`'s), how
    many of the conversation's oldest exchanges were dropped to fit the context, and the
    rendered prompt's ids where the engine is in this process (None elsewhere)."""

    records: Iterator[Record]
    dropped: int
    prompt_ids: list[int] | None = None


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

    def converse(self, job: Job) -> Answered:
        """A chat's turn (``job.messages`` with ``fit_room``): the engine keeps the
        conversation's cache between turns (this process: its one row's; elsewhere: its prompt
        cache), so only what changed is prefilled."""
        ...

    def run_many(self, jobs: Sequence[Job], rows: int | None = None) -> Iterator[tuple[int, Record | Failed]]:
        """Several jobs as rows decoded together, at most ``rows`` at a time (None: as many as
        the engine holds), the next starting as one ends: ``(index, record)``, a job refused or
        a row failed ending with its :class:`~llmsample.client.wire.Failed` (``user_error``: the
        job's own fault) while the others go on."""
        ...

    def local_model(self) -> Any:
        """The model (a ``LoadedModel``) when it runs in this process (what reads its tokenizer here: OpenAI
        records' bytes and tool calls), None for an engine elsewhere."""
        ...

    def explain(self, asked: Explanation) -> Answer:
        """``explain``'s answer: the next token's :class:`ChainReport`, or the continuation's
        tokens scored (a warm engine's read back from JSON to the last bit)."""
        ...

    def close(self) -> None: ...


class RemoteEngine:
    """An engine in another process: one of this user's (``unix:PATH``) or a server (a URL)."""

    def __init__(
        self, target: Target, waiting: Callable[[str], None] = say, restart: Callable[[Target], Target] | None = None
    ) -> None:
        """``restart``: this user's engine, gone between a chat's turns (its keep-alive ran
        out), started again (its new target), saying so; None: gone is gone."""
        self.target, self.waiting, self.restart = target, waiting, restart
        self.where = target.where
        self._status: dict[str, Any] | None = None

    def model_name(self) -> str | None:
        return self.target.name

    def status(self) -> dict[str, Any]:
        """The engine's status; a server of another model than the one asked for (``-m`` with
        ``--host``) is one line here, before any job is sent."""
        if self._status is None:
            status = engine_status(self.target)
            asked = self.target.name
            if not self.where.startswith("unix:") and asked and status.get("model") != asked:
                raise UserError(f"model {asked!r} is not served at {self.where}; it runs {status.get('model')!r}")
            self._status = status
        return self._status

    def _addressed(self, job: Job) -> Job:
        """This user's engine was found by its model options: whatever it serves is the model
        asked for; a server checks the name it is given."""
        return dataclasses.replace(job, model=None) if self.where.startswith("unix:") else job

    def run(self, job: Job) -> Iterator[Record]:
        return stream_job(self.target, self._addressed(job), self.waiting)

    def converse(self, job: Job) -> Answered:
        try:
            return Answered(*chat_job(self.target, self._addressed(job), self.waiting))
        except EngineGone:
            if self.restart is None:
                raise
        self.target = self.restart(self.target)
        self.where, self._status = self.target.where, None
        return Answered(*chat_job(self.target, self._addressed(job), self.waiting))

    def run_many(self, jobs: Sequence[Job], rows: int | None = None) -> Iterator[tuple[int, Record | Failed]]:
        """A window of the jobs in flight (the engine's rows and as many queued, unless
        ``rows``), each read by a daemon thread as it comes: the rows decode together, and a
        run that stops leaves nothing waiting (the engine cancels the open rows). The engine
        gone raises ``RuntimeFailure`` in one line."""
        if not jobs:
            return iter(())
        if rows is None:
            status = self.status()
            engine_rows = status.get("batch_size") or WINDOW_FALLBACK
            rows = engine_rows + min(engine_rows, status.get("max_queue") or 0)
        return self._window([self._addressed(job) for job in jobs], min(rows, len(jobs)))

    def _window(self, jobs: list[Job], width: int) -> Iterator[tuple[int, Record | Failed]]:
        todo: queue.Queue[int] = queue.Queue()
        for index in range(len(jobs)):
            todo.put(index)
        answers: list[queue.Queue[Any]] = [queue.Queue() for _ in jobs]
        told = threading.Event()

        def waiting(line: str) -> None:  # one notice for the run, not one per job
            if not told.is_set():
                told.set()
                self.waiting(line)

        def work() -> None:
            while True:
                try:
                    index = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    for record in job_records(self.target, jobs[index], waiting):
                        answers[index].put(record)
                except UserError as exc:  # the job refused: its own fault, the others go on
                    answers[index].put(Failed(str(exc), user_error=True))
                except RuntimeFailure as exc:
                    answers[index].put(exc)
                answers[index].put(None)

        for _ in range(width):
            threading.Thread(target=work, name="llmsample-job", daemon=True).start()
        for index, answer in enumerate(answers):
            while (record := answer.get()) is not None:
                if isinstance(record, EngineGone):  # one line, whichever row's connection saw it first
                    raise RuntimeFailure(f"the engine at {self.where} went away mid-run") from None
                if isinstance(record, RuntimeFailure):
                    raise record
                yield index, record

    def local_model(self) -> None:
        return None

    def explain(self, asked: Explanation) -> Answer:
        from llmsample.analysis.explain_records import answer_from_json

        asked = dataclasses.replace(asked, job=self._addressed(asked.job))
        return answer_from_json(post_json(self.target, EXPLAIN_PATH, asked.to_json()))

    def close(self) -> None:
        """Nothing is held between requests: each opens its own connection."""
