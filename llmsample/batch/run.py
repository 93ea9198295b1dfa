"""A batch run, in this process or on a warm engine alike: parsed requests to jobs (each with
its own settings), the engine's records back to output records, written in input order as soon
as every earlier one is out. Torch-free: what reads the model's tokenizer here (OpenAI records,
a line's tools) asks the engine for its model, which only the engine in this process has."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from llmsample.batch.requests import Request, RequestError
from llmsample.batch.result_lines import (
    error_record,
    openai_error_record,
    openai_result_record,
    result_record,
)
from llmsample.batch.settings import BatchSettings, request_config, request_recorder
from llmsample.batch.tool_requests import PLAIN, ChatShape, calls_tools, chat_shape, tool_prompt, with_tools
from llmsample.client.engine_client import EngineClient
from llmsample.client.wire import Failed
from llmsample.errors import RuntimeFailure, UserError
from llmsample.events import RunStats, Summary, TokenEvent
from llmsample.jobs import Job
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.constraint import incomplete_message

if TYPE_CHECKING:
    from llmsample.events import PromptLogprobs
    from llmsample.models.loading import LoadedModel

Record = dict[str, Any]


@dataclass
class BatchOutcome:
    succeeded: int = 0
    failed: int = 0
    tokens: int = 0


class OrderedWriter:
    """Records go out in input order: each is written once every earlier position is out; or,
    not ``ordered``, each as its request ends (a file put back in order when the run ends)."""

    def __init__(self, write: Callable[[Record], None], positions: Iterable[int], ordered: bool = True) -> None:
        self.write, self.ordered = write, ordered
        self.waiting = sorted(positions)  # positions still to come, in order
        self.ready: dict[int, Record] = {}

    def put(self, position: int, record: Record) -> None:
        if not self.ordered:
            self.write(record)
            return
        self.ready[position] = record
        while self.waiting and self.waiting[0] in self.ready:
            self.write(self.ready.pop(self.waiting.pop(0)))

    def flush_finished(self) -> None:
        """On an interrupt: what finished is written even after a gap (a resumed run fills it)."""
        for position in sorted(self.ready):
            self.write(self.ready.pop(position))


def prompt_ids(lm: LoadedModel, request: Request, settings: BatchSettings, room: int) -> list[int]:
    from llmsample.engine.prompt import has_chat_template, message_id_list, prompt_id_list

    raw = request.raw or (settings.raw and request.messages is None)
    if request.messages is not None or (request.system and not raw and has_chat_template(lm)):
        messages, tools = tool_prompt(lm.tokenizer, request)
        return message_id_list(lm, messages, settings.truncate, room, tools)
    return prompt_id_list(lm, request.prompt or "", request.system or settings.system, raw, settings.truncate, room)


def shaped(lm: LoadedModel, request: Request, cfg: SamplingConfig, ids: list[int]) -> tuple[SamplingConfig, ChatShape]:
    """A chat request's answer shape (tools, thinking block) and its row's settings with the
    call grammar; an OpenAI line's only (our lines' answers are text)."""
    if not request.openai:
        return cfg, PLAIN
    shape = chat_shape(lm.tokenizer, request, lm.tokenizer.decode(ids[-8:]) if ids else "")
    return with_tools(cfg, request, shape), shape


def run_batch(
    engine: EngineClient,
    parsed: list[Request | RequestError],
    done: frozenset[str],
    settings: BatchSettings,
    write: Callable[[Record], None],
    progress: BatchProgress | None = None,
    *,
    log: bool = False,
    ordered: bool = True,
) -> BatchOutcome:
    """Decode every request not in ``done`` on ``engine`` (here or warm, one program); bad lines
    and failed requests become error records. ``progress`` hears of every token as it comes.
    ``log``: each decoded request goes to the run log. ``ordered``: records are written in input
    order (else as each request ends). Raises what interrupts it after writing every record
    that finished."""
    progress = progress or _Unwatched()
    outcome = BatchOutcome()
    todo = [(i, item) for i, item in enumerate(parsed) if not (isinstance(item, Request) and item.custom_id in done)]
    writer = OrderedWriter(write, [i for i, _ in todo], ordered)
    top_n = max([settings.top_n, *(item.top_logprobs for _, item in todo if isinstance(item, Request))])
    jobs, asked = _admit(engine, todo, settings, top_n, writer, outcome)
    progress.planned(len(jobs), sum(this.cfg.max_tokens for this in asked.values()))
    events: dict[int, list[TokenEvent]] = {position: [] for position in asked}
    positions = list(asked)
    try:
        for index, record in engine.run_many(jobs, settings.batch_size):
            position = positions[index]
            if isinstance(record, TokenEvent):
                events[position].append(record)
                progress.token(position)
                continue
            this, tokens = asked[position], events.pop(position)
            writer.put(position, _ended(engine, settings, this, record, tokens, outcome, log))
            progress.finished(position, len(tokens), this.cfg.max_tokens)
    finally:
        writer.flush_finished()
    return outcome


class BatchProgress(Protocol):
    """What a run tells whoever shows its progress, token by token (a bar that only moved when
    a request ended sat still for minutes while one row rambled on)."""

    def planned(self, rows: int, tokens: int) -> None:
        """The rows to decode and the most tokens they may write (their max tokens summed)."""

    def token(self, row: int) -> None:
        """Row ``row`` wrote a token."""

    def finished(self, row: int, tokens: int, max_tokens: int) -> None:
        """Row ``row`` ended after ``tokens`` of its ``max_tokens``."""


class _Unwatched:
    def planned(self, rows: int, tokens: int) -> None:
        pass

    def token(self, row: int) -> None:
        pass

    def finished(self, row: int, tokens: int, max_tokens: int) -> None:
        pass


def _ended(
    engine: EngineClient, settings: BatchSettings, this: _Asked, record: Summary | Failed, tokens: list[TokenEvent],
    outcome: BatchOutcome, log: bool,
) -> Record:  # fmt: skip
    """A request's output record from its row's end: its result, or an error record."""
    if isinstance(record, Failed):
        outcome.failed += 1
        code = "invalid_request" if record.user_error else "decoding_failed"
        return _error(settings, _as_error(this.request, record.message, code))
    if record.stop_reason == "cancelled":
        raise RuntimeFailure(f"the engine at {engine.where} stopped before the batch was done")
    if log:
        request_recorder("batch", this.request, settings.system, this.cfg, tokens).summary(record)
    incomplete = incomplete_message(record)
    if incomplete is not None:
        outcome.failed += 1
        return _error(settings, _as_error(this.request, incomplete, "incomplete_output"))
    outcome.succeeded += 1
    outcome.tokens += record.tokens
    return _result(settings, this, record, tokens, engine)


@dataclass(frozen=True)
class _Asked:
    """A request that decodes: its settings, how its answer's text is read back, and its prompt
    scored (``echo`` with ``logprobs``)."""

    request: Request
    cfg: SamplingConfig
    shape: ChatShape = PLAIN
    scored: PromptLogprobs | None = None


def _admit(
    engine: EngineClient,
    todo: list[tuple[int, Request | RequestError]],
    settings: BatchSettings,
    top_n: int,
    writer: OrderedWriter,
    outcome: BatchOutcome,
) -> tuple[list[Job], dict[int, _Asked]]:
    """Each request's job, or its record at once: an error for a line that cannot run, the
    whole answer for one that generates nothing (``max_tokens: 0``)."""
    jobs: list[Job] = []
    asked: dict[int, _Asked] = {}
    for position, item in todo:
        try:
            if isinstance(item, RequestError):
                raise UserError(item.message)
            preset, cfg = request_config(item, settings)
            job = _job(item, preset, cfg, settings, top_n)
            this = _Asked(item, cfg)
            if _shaped_here(item, settings):
                job, this = _shaped_job(engine.local_model(), job, this, settings)
        except (UserError, RuntimeFailure) as exc:
            outcome.failed += 1
            code = "invalid_request" if isinstance(exc, UserError) else "decoding_failed"
            writer.put(position, _error(settings, _as_error(item, str(exc), code)))
            continue
        if item.prompt_only:  # max_tokens 0: nothing to decode, the record now
            outcome.succeeded += 1
            stats = RunStats(engine.model_name() or "", preset, cfg.seed)
            summary = dataclasses.replace(stats.summary("length"), prompt_tokens=len(job.prompt_ids or ()))
            writer.put(position, _result(settings, this, summary, [], engine))
            continue
        asked[position] = this
        jobs.append(job)
    return jobs, asked


def _job(request: Request, preset: str, cfg: SamplingConfig, settings: BatchSettings, top_n: int) -> Job:
    """The request's job: its messages (its own system message rendered with its prompt, as the
    chat template does), else its prompt and system, the engine encoding it."""
    raw = request.raw or (settings.raw and request.messages is None)
    drafts = settings.ngram or settings.drafter
    return Job(request.prompt or "", cfg, preset, request.system or settings.system, raw, settings.truncate, top_n,
               ngram=settings.ngram, draft_tokens=settings.draft_tokens if drafts else None,
               messages=request.messages, ignore_eos=settings.ignore_eos, reference=settings.reference,
               drafter=settings.drafter)  # fmt: skip


def _shaped_here(request: Request, settings: BatchSettings) -> bool:
    """Whether the request is encoded with the model's tokenizer in this process: OpenAI
    records (each token's bytes), a chat line's tools and thinking block, a prompt scored."""
    return settings.fmt == "openai" or (request.openai and (calls_tools(request) or request.prompt_only))


def _shaped_job(lm: LoadedModel | None, job: Job, this: _Asked, settings: BatchSettings) -> tuple[Job, _Asked]:
    if lm is None:
        raise UserError("this line needs the model's tokenizer in this process (OpenAI records, tools, or "
                        "max_tokens 0); run the batch with --local")  # fmt: skip
    request = this.request
    ids = prompt_ids(lm, request, settings, this.cfg.max_tokens)
    cfg, shape = shaped(lm, request, this.cfg, ids)
    return (dataclasses.replace(job, cfg=cfg, prompt_ids=tuple(ids)),
            _Asked(request, cfg, shape, _scored(lm, request, ids, settings)))  # fmt: skip


def _scored(lm: LoadedModel, request: Request, ids: list[int], settings: BatchSettings) -> PromptLogprobs | None:
    """An OpenAI completion line's prompt scored when it asks for ``echo`` with ``logprobs``
    (only OpenAI's records carry it), teacher-forced through the seam before the batch decodes."""
    if settings.fmt != "openai" or not (request.echo and request.logprobs):
        return None
    from llmsample.engine.prompt_logprobs import prompt_logprobs

    return prompt_logprobs(lm, ids, request.top_logprobs)


def _as_error(item: Request | RequestError, message: str, code: str = "invalid_request") -> RequestError:
    if isinstance(item, RequestError):
        return item
    return RequestError(item.line, item.custom_id, message, code)


def _error(settings: BatchSettings, error: RequestError) -> Record:
    return openai_error_record(error) if settings.fmt == "openai" else error_record(error)


def _result(
    settings: BatchSettings, asked: _Asked, summary: Summary, events: list[TokenEvent], engine: EngineClient
) -> Record:
    if settings.fmt == "openai":
        lm = engine.local_model()
        assert lm is not None  # an OpenAI record's job was shaped here (_shaped_job)
        return openai_result_record(asked.request, summary, events, token_bytes=lm.token_bytes, shape=asked.shape,
                                    prompt=asked.scored)  # fmt: skip
    return result_record(asked.request, summary, events, settings.tokens)
