"""A batch run: parsed requests to engine items (each with its own settings), the engine's
records back to output records, written in input order as soon as every earlier one is out."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmsample.batch.requests import Request, RequestError
from llmsample.batch.result_lines import (
    error_record,
    openai_error_record,
    openai_result_record,
    result_record,
)
from llmsample.batch.settings import BatchSettings, request_config, request_recorder
from llmsample.batch.tool_requests import PLAIN, ChatShape, chat_shape, tool_prompt, with_tools
from llmsample.engine.continuous_batch import BatchItem, RowFailed, decode_batch, default_batch_size
from llmsample.engine.prompt import encode_messages, encode_prompt, has_chat_template
from llmsample.engine.prompt_cache import PromptCache
from llmsample.engine.speculative import Drafter
from llmsample.errors import RuntimeFailure, UserError
from llmsample.events import RunStats, Summary, TokenEvent
from llmsample.models.loading import LoadedModel
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.constraint import incomplete_message

if TYPE_CHECKING:
    from llmsample.events import PromptLogprobs

Record = dict[str, Any]


@dataclass
class BatchOutcome:
    succeeded: int = 0
    failed: int = 0
    tokens: int = 0
    batch_size: int = 0


class OrderedWriter:
    """Records go out in input order: each is written once every earlier position is out."""

    def __init__(self, write: Callable[[Record], None], positions: Iterable[int]) -> None:
        self.write = write
        self.waiting = sorted(positions)  # positions still to come, in order
        self.ready: dict[int, Record] = {}

    def put(self, position: int, record: Record) -> None:
        self.ready[position] = record
        while self.waiting and self.waiting[0] in self.ready:
            self.write(self.ready.pop(self.waiting.pop(0)))

    def flush_finished(self) -> None:
        """On an interrupt: what finished is written even after a gap (a resumed run fills it)."""
        for position in sorted(self.ready):
            self.write(self.ready.pop(position))


def prompt_ids(lm: LoadedModel, request: Request, settings: BatchSettings, room: int) -> list[int]:
    raw = request.raw or (settings.raw and request.messages is None)
    if request.messages is not None or (request.system and not raw and has_chat_template(lm)):
        messages, tools = tool_prompt(lm.tokenizer, request)
        ids = encode_messages(lm, messages, settings.truncate, room, tools)
    else:
        ids = encode_prompt(lm, request.prompt or "", request.system or settings.system, raw, settings.truncate, room)
    return ids[0].tolist()


def shaped(lm: LoadedModel, request: Request, cfg: SamplingConfig, ids: list[int]) -> tuple[SamplingConfig, ChatShape]:
    """A chat request's answer shape (tools, thinking block) and its row's settings with the
    call grammar; an OpenAI line's only (our lines' answers are text)."""
    if not request.openai:
        return cfg, PLAIN
    shape = chat_shape(lm.tokenizer, request, lm.tokenizer.decode(ids[-8:]) if ids else "")
    return with_tools(cfg, request, shape), shape


def run_batch(
    lm: LoadedModel,
    parsed: list[Request | RequestError],
    done: frozenset[str],
    settings: BatchSettings,
    write: Callable[[Record], None],
    on_finished: Callable[[int], None] = lambda tokens: None,
    *,
    drafter: Callable[[], Drafter] | None = None,
    reference: LoadedModel | None = None,
    log: bool = False,
) -> BatchOutcome:
    """Decode every request not in ``done``; bad lines and failed requests become error records.
    ``drafter`` makes each request's drafter (speculation); ``reference`` scores every token
    (``--reference``); ``log``: each decoded request goes to the run log. Raises what interrupts
    it after writing every record that finished."""
    outcome = BatchOutcome()
    todo = [(i, item) for i, item in enumerate(parsed) if not (isinstance(item, Request) and item.custom_id in done)]
    writer = OrderedWriter(write, [i for i, _ in todo])
    items, asked = _admit(lm, todo, settings, writer, outcome, on_finished, drafter)
    top_n = max([settings.top_n, *(a.request.top_logprobs for a in asked.values())])
    longest = max((len(item.prompt_ids) + item.cfg.max_tokens for item in items), default=1)
    outcome.batch_size = settings.batch_size or default_batch_size(lm, longest)
    events: dict[int, list[TokenEvent]] = {position: [] for position in asked}
    try:
        cache = PromptCache(settings.prompt_cache_mb * 2**20) if settings.prompt_cache_mb else None
        decoded = decode_batch(lm, items, outcome.batch_size, top_n=top_n, ignore_eos=settings.ignore_eos,
                               reference=reference, prompt_cache=cache)  # fmt: skip
        for position, record in decoded:
            if isinstance(record, TokenEvent):
                events[position].append(record)
                continue
            request, tokens = asked[position].request, events.pop(position)
            incomplete = None if isinstance(record, RowFailed) else incomplete_message(record)
            if log and not isinstance(record, RowFailed):
                request_recorder("batch", request, settings.system, asked[position].cfg, tokens).summary(record)
            if isinstance(record, RowFailed):
                outcome.failed += 1
                writer.put(position, _error(settings, _as_error(request, record.message, "decoding_failed")))
            elif incomplete is not None:
                outcome.failed += 1
                writer.put(position, _error(settings, _as_error(request, incomplete, "incomplete_output")))
            else:
                outcome.succeeded += 1
                outcome.tokens += record.tokens
                writer.put(position, _result(settings, asked[position], record, tokens, lm.token_bytes))
            on_finished(len(tokens))
    finally:
        writer.flush_finished()
    return outcome


@dataclass(frozen=True)
class _Asked:
    """A request that decodes: its settings, how its answer's text is read back, and its prompt
    scored (``echo`` with ``logprobs``)."""

    request: Request
    cfg: SamplingConfig
    shape: ChatShape
    scored: PromptLogprobs | None


def _admit(
    lm: LoadedModel,
    todo: list[tuple[int, Request | RequestError]],
    settings: BatchSettings,
    writer: OrderedWriter,
    outcome: BatchOutcome,
    on_finished: Callable[[int], None],
    drafter: Callable[[], Drafter] | None,
) -> tuple[list[BatchItem], dict[int, _Asked]]:
    """Each request's row, or its record at once: an error for a line that cannot run, the
    whole answer for one that generates nothing (``max_tokens: 0``)."""
    items: list[BatchItem] = []
    asked: dict[int, _Asked] = {}
    for position, item in todo:
        try:
            if isinstance(item, RequestError):
                raise UserError(item.message)
            preset, cfg = request_config(item, settings)
            ids = prompt_ids(lm, item, settings, cfg.max_tokens)
            cfg, shape = shaped(lm, item, cfg, ids)
            this = _Asked(item, cfg, shape, _scored(lm, item, ids, settings))
        except (UserError, RuntimeFailure) as exc:
            outcome.failed += 1
            code = "invalid_request" if isinstance(exc, UserError) else "decoding_failed"
            writer.put(position, _error(settings, _as_error(item, str(exc), code)))
            continue
        stats = RunStats(lm.name, preset, cfg.seed)
        if item.prompt_only:  # max_tokens 0: nothing to decode, the record now
            outcome.succeeded += 1
            summary = dataclasses.replace(stats.summary("length"), prompt_tokens=len(ids))
            writer.put(position, _result(settings, this, summary, [], lm.token_bytes))
            on_finished(0)
            continue
        asked[position] = this
        items.append(BatchItem(position, ids, cfg, stats, drafter, settings.draft_tokens))
    return items, asked


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
    settings: BatchSettings,
    asked: _Asked,
    summary: Summary,
    events: list[TokenEvent],
    token_bytes: Callable[[int], bytes | None],
) -> Record:
    if settings.fmt == "openai":
        return openai_result_record(asked.request, summary, events, token_bytes=token_bytes, shape=asked.shape,
                                    prompt=asked.scored)  # fmt: skip
    return result_record(asked.request, summary, events, settings.tokens)
