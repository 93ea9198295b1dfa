"""The engine in this process: an :class:`~llmsample.client.engine_client.EngineClient` that
loads its model when first asked and runs every job through the one loop
(:func:`~llmsample.engine.decode.decode`), its rows built by the same function as a warm
engine's (:func:`~llmsample.engine.job_row.job_row`). What a row of a warm engine's batch
cannot carry runs here: ``--reference`` and a drafter of the engine's own (a suffix pool
across its jobs, or a draft model), each loaded once, when a job first asks."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from llmsample.client.engine_client import IN_PROCESS, Answered
from llmsample.client.wire import Failed
from llmsample.engine.decode import DecodeOptions, decode
from llmsample.engine.job_row import job_row
from llmsample.engine.prompt import has_chat_template
from llmsample.engine.row_state import RowFailed
from llmsample.errors import RuntimeFailure, UserError
from llmsample.events import Summary, TokenEvent
from llmsample.jobs import AUTO, Explanation, Job
from llmsample.models.loading import LoadedModel

if TYPE_CHECKING:
    from llmsample.analysis.explain_records import Answer

Record = TokenEvent | Summary


class LocalEngine:
    """``load`` makes the model (once, lazily); ``drafter`` makes the engine's drafter for a
    job's ``drafter`` (given the model: a maker of one drafter per row), ``reference`` its
    float32 reference model; either None: this engine has no such capability. ``auto``: the
    drafter of a job that asks for ``auto`` (the default), which may be None for the model."""

    where = IN_PROCESS

    def __init__(
        self,
        load: Callable[[], LoadedModel],
        *,
        drafter: Callable[[LoadedModel], Callable[[], Any]] | None = None,
        auto: Callable[[LoadedModel], Callable[[], Any] | None] | None = None,
        reference: Callable[[LoadedModel], LoadedModel] | None = None,
        prompt_cache_mb: int = 0,
        deterministic: bool = False,
    ) -> None:
        self._load, self._make_drafter, self._load_reference = load, drafter, reference
        self._deterministic = deterministic  # every row computed alone (--deterministic)
        self._prompt_cache_mb = prompt_cache_mb  # each run_many's prompt cache (0: none)
        self._lm: LoadedModel | None = None
        self._load_s: float | None = None  # the load's seconds, until a run's summary reports them
        self._drafter: Callable[[], Any] | None = None
        self._make_auto, self._auto = auto, {}  # the auto drafter, made once (it may be None)
        self._reference: LoadedModel | None = None
        self._session: Any = None  # a chat's one row, its cache kept between turns

    def model(self) -> LoadedModel:
        """The model, loaded on first use (a load's progress and errors come from here)."""
        if self._lm is None:
            started = time.perf_counter()
            self._lm = self._load()
            self._load_s = time.perf_counter() - started
        return self._lm

    def local_model(self) -> LoadedModel:
        return self.model()

    def model_name(self) -> str:
        return self.model().name

    def status(self) -> dict[str, Any]:
        lm = self.model()
        capabilities = ["drafter"] * (self._make_drafter is not None)
        capabilities += ["reference"] * (self._load_reference is not None)
        return {"model": lm.name, "backend": lm.backend, "dtype": lm.weights, "device": str(lm.device),
                "context_length": lm.context_length, "chat_template": has_chat_template(lm),
                "deterministic": self._deterministic, "capabilities": capabilities,
                "cached_positions": len(self._session.cached) if self._session is not None else 0}  # fmt: skip

    def run(self, job: Job) -> Iterator[Record]:
        """Loads, encodes and makes the drafter now (a bad prompt or draft fails before any
        record); the records come as the loop yields them, the summary of the run that waited for
        the load saying how long it took (``load_s``)."""
        lm = self.model()
        options = self._options(lm, [job])
        item, _ = job_row(lm, job, 0, self._drafter_for(lm, job))
        load_s, self._load_s = self._load_s, None
        return raised_failures(decode(lm, [item], 1, options, one_prompt=True), load_s)

    def converse(self, job: Job) -> Answered:
        """The turn on the chat's one row, whose cache holds the conversation so far."""
        from llmsample.engine.session import Session

        lm = self.model()
        item, dropped = job_row(lm, job, 0, self._drafter_for(lm, job))
        if self._session is None:
            self._session = Session(lm, (lm.context_length or 4096) + 65, DecodeOptions(deterministic=self._deterministic))
        prompt = item.prompt_ids[: len(item.prompt_ids) - len(job.prefix)]
        return Answered(raised_failures(self._session.turn(item)), dropped, prompt)

    def run_many(self, jobs: Sequence[Job], rows: int | None = None) -> Iterator[tuple[int, Record | Failed]]:
        """Every job a row of one batch, as a warm engine's rows share its passes: at most
        ``rows`` at a time (None: as many as a quarter of the free memory holds), the next
        joining as one ends; one prompt for every row that fits at once (``compare-presets``)
        prefilled once. A job that cannot run (a prompt too long) is its :class:`Failed` first."""
        from llmsample.engine.continuous_batch import default_batch_size
        from llmsample.engine.prompt_cache import PromptCache

        if not jobs:
            return iter(())
        lm = self.model()
        options = self._options(lm, jobs)
        refused: list[tuple[int, Failed]] = []
        items = []
        for index, job in enumerate(jobs):
            try:
                items.append(job_row(lm, job, index, self._drafter_for(lm, job))[0])
            except (UserError, RuntimeFailure) as exc:
                refused.append((index, Failed(str(exc), isinstance(exc, UserError))))
        longest = max((len(item.prompt_ids) + item.cfg.max_tokens for item in items), default=1)
        rows = min(len(items), rows or default_batch_size(lm, longest)) or 1
        one_prompt = len(items) <= rows and len({tuple(item.prompt_ids) for item in items}) == 1
        if self._prompt_cache_mb:
            options = dataclasses.replace(options, prompt_cache=PromptCache(self._prompt_cache_mb * 2**20))
        return _failures(refused, decode(lm, items, rows, options, one_prompt=one_prompt) if items else iter(()))

    def explain(self, asked: Explanation) -> Answer:
        from llmsample.analysis.explain import explain_job

        return explain_job(self.model(), asked)

    def close(self) -> None:
        """A chat's cache is let go; the model stays loaded as long as this engine is referenced."""
        if self._session is not None:
            self._session.close()
            self._session = None

    def _options(self, lm: LoadedModel, jobs: Sequence[Job]) -> DecodeOptions:
        """The run's options: the reference, loaded once (each row carries its own ``--watch``)."""
        reference = None
        if any(job.reference for job in jobs):
            if self._load_reference is None:
                raise UserError("--reference needs a reference model, which this engine was not given")
            if self._reference is None:
                self._reference = self._load_reference(lm)
            reference = self._reference
        return DecodeOptions(max(job.top_n for job in jobs), reference=reference, deterministic=self._deterministic)

    def _drafter_for(self, lm: LoadedModel, job: Job) -> Callable[[], Any] | None:
        """The engine's drafter for ``job`` (made once); ``auto``'s may be none."""
        if job.drafter is None or (job.drafter == AUTO and self._make_auto is None):
            return None
        if job.drafter == AUTO:
            if not self._auto:
                self._auto[AUTO] = self._make_auto(lm)
            return self._auto[AUTO]
        if self._make_drafter is None:
            raise UserError(f"--draft {job.drafter} needs a drafter, which this engine was not given")
        if self._drafter is None:
            self._drafter = self._make_drafter(lm)
        return self._drafter


def raised_failures(records: Iterator[tuple[Any, Any]], load_s: float | None = None) -> Iterator[Record]:
    """One row's records; a row that failed raises as the command's error. Closing this closes
    the loop's (a chat's interrupted turn: its session starts its cache afresh). ``load_s``: the
    model's load the row waited for, in its summary."""
    try:
        for _, record in records:
            if isinstance(record, RowFailed):
                raise (UserError if record.user_error else RuntimeFailure)(record.message)
            if load_s is not None and isinstance(record, Summary):
                record = dataclasses.replace(record, facts=dataclasses.replace(record.facts, load_s=load_s))
            yield record
    finally:
        records.close()  # type: ignore[attr-defined]


def _failures(
    refused: list[tuple[int, Failed]], records: Iterator[tuple[Any, Any]]
) -> Iterator[tuple[int, Record | Failed]]:
    """The refused jobs, then the rows' records, a failed row as the wire's :class:`Failed`
    (as a warm engine's)."""
    yield from refused
    for key, record in records:
        yield key, Failed(record.message, record.user_error) if isinstance(record, RowFailed) else record
