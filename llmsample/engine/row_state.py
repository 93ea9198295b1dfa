"""A row: one request's decoding state in the loop (:mod:`llmsample.engine.decode`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from llmsample.engine.emitter import Emitter
from llmsample.engine.reference import ReferenceTotals
from llmsample.engine.speculative import Drafter, DraftLength
from llmsample.errors import RuntimeFailure, UserError
from llmsample.events import RunStats, Speculation
from llmsample.models.loading import LoadedModel
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.constraint import ANY, Matcher, tokenizer_table
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import make_generator
from llmsample.sampling.reachable import dead_end


@dataclass(frozen=True)
class BatchItem:
    """One request as the engine sees it: ``key`` is the caller's, handed back with each record.
    ``drafter``: makes this row's drafter when it starts (speculation; ``draft_tokens`` a fixed K,
    None adaptive), so a draft model's per-row cache lives only as long as the row. ``top_n``: a
    step lists as many alternatives as its rows need at most (a server's request that shows
    none costs no alternatives when no row in the step asks for them). ``stop_ids``,
    ``keep_stop``: a server request's own ends (vLLM's ``stop_token_ids`` and
    ``include_stop_str_in_output``). ``cache_prompt``: False, the prompt is prefilled whole,
    never after a prefix the prompt cache holds (:attr:`llmsample.client.wire.Job.cache_prompt`)."""

    key: Any
    prompt_ids: list[int]
    cfg: SamplingConfig  # with its seed set
    stats: RunStats
    drafter: Callable[[], Drafter] | None = None
    draft_tokens: int | None = None
    top_n: int | None = None  # alternatives its records need; None: the run's (DecodeOptions.top_n)
    stop_ids: frozenset[int] = frozenset()
    keep_stop: bool = False
    cache_prompt: bool = True
    ignore_eos: bool = False  # this row runs to its length past EOS (DecodeOptions.ignore_eos: every row)
    watch: tuple[tuple[str, int], ...] = ()  # this row's own --watch (name, id) pairs, beside the run's
    reference: bool = False  # scored under the run's reference model (--reference; a server's other rows are not)


@dataclass(frozen=True)
class RowFailed:
    """A request that failed while decoding (e.g. NaN logits): the others go on. ``user_error``:
    the request asked for what cannot be done (a constraint this model's tokenizer cannot take)."""

    key: Any
    message: str
    user_error: bool = False


@dataclass
class RowText:
    """What a row has decoded and how it draws on: its ``emitter`` (events, stops), its random
    ``generator``, the token ``history`` its chain reads, and ``seq``, the prompt and output ids."""

    emitter: Emitter
    generator: torch.Generator
    history: TokenHistory
    seq: list[int]


@dataclass
class Drafts:
    """The drafts fed in the last pass (none for a plain row): their ids on the device
    (``tokens``) and on the host (``ids``, the drafter's one transfer), and their draft
    distributions ``q``."""

    tokens: Tensor
    q: Tensor
    ids: list[int] = field(default_factory=list)

    @property
    def count(self) -> int:
        return self.tokens.shape[0]


@dataclass
class SpeculationCounts:
    """A speculative row's counts so far: drafts proposed, drafts accepted, target passes."""

    drafted: int = 0
    accepted: int = 0
    passes: int = 0


@dataclass
class Drafting:
    """What a speculative row drafts with: its ``drafter``, the draft ``length`` it adapts, and
    its ``counts``."""

    drafter: Drafter
    length: DraftLength
    counts: SpeculationCounts = field(default_factory=SpeculationCounts)


@dataclass
class Row:
    """What the loop keeps per request between steps.

    The cache holds ``text.seq`` but its newest token (``cached`` positions, which a
    verification pass may have run past); ``drafts`` are those fed in the last pass."""

    item: BatchItem
    text: RowText
    cached: int
    drafts: Drafts
    drafting: Drafting | None = None  # None: a plain row
    reference: ReferenceTotals | None = None
    matcher: Matcher | None = None  # the constraint's grammar state after ``seq`` (--json-schema, ...)
    failed: UserError | None = None  # its constraint could not start: the row fails at its first step

    @property
    def key(self) -> Any:
        return self.item.key

    @cached_property
    def sampler(self) -> SamplingConfig:
        """What the chain reads of the row's config (not its seed, length, stops, its own
        grammar's state, nor the values :class:`RowValues` carries per row, only whether its top-p
        and min-p are on): rows that share it are sampled by one chain call. A row that truncates
        nothing would make the call's candidates the whole vocabulary for every row."""
        cfg = self.item.cfg
        constraint = ANY if self.matcher is not None else None  # each row's grammar gives its mask
        own = {} if cfg.is_greedy else {
            "temperature": 1.0, "top_p": 1.0 if cfg.top_p >= 1 else 0.5, "min_p": 0.5 if cfg.min_p > 0 else 0.0
        }  # fmt: skip
        if cfg.has_dynatemp:  # the chain's dynamic temperature reads the config's (not RowValues)
            own.pop("temperature", None)
        return dataclasses.replace(cfg, seed=None, max_tokens=1, description="", constraint=constraint, **own)

    def propose(self, rows: int, allowed: bool = True) -> list[int]:
        """Drafts for the next pass of ``rows`` rows (none for a plain row, nor, where ``allowed``
        is False, for a row whose text does not follow its draft lengths), kept for
        verification; their ids."""
        if self.drafting is None:
            return []
        cfg, text, drafts, drafter = self.item.cfg, self.text, self.drafts, self.drafting.drafter
        # Rejection sampling's random draws follow the draft lengths: such a row drafts as it would
        # alone, so its seed gives the same text in any batch. Greedy rows and fixed drafts checked
        # against the row's own draws (on the CPU: step.fixed_drafts) give the plain run's tokens
        # whatever the lengths.
        checked = not drafter.drawn and text.generator.device.type == "cpu"
        shared = rows if cfg.is_greedy or checked else 1
        # A row whose text does not follow its lengths skips drafting where the backend asks.
        k = min(self.drafting.length.fit(shared), text.emitter.room() - 1) if allowed or not checked else 0
        # A drafter whose cut depends on the pass's rows (the suffix pool, whose drafts depend on
        # the other requests already: a sampled row's seed gives its text with the same requests).
        sharing = getattr(drafter, "sharing", None)
        if sharing is not None:
            sharing(rows)
        if k > 0 and self.matcher is not None:
            # q masked like p at every position (a model draft); a draft the grammar rejects is cut.
            try:
                drafted, q = drafter.propose(text.seq, k, text.history, cfg, text.generator, matcher=self.matcher)
                keep = self.matcher.valid_prefix(drafted.tolist())
            except RuntimeFailure:  # the grammar failed (Matcher.failure): the step fails this row
                drafted, q, keep = drafts.tokens, drafts.q, 0
            drafts.tokens, drafts.q = drafted[:keep], q[:keep]
        elif k > 0:
            drafts.tokens, drafts.q = drafter.propose(text.seq, k, text.history, cfg, text.generator)
        else:
            drafts.tokens, drafts.q = drafts.tokens[:0], drafts.q[:0]
        drafts.ids = drafts.tokens.tolist() if drafts.count else []  # the drafter's transfer
        return drafts.ids

    def advance(self, emitted: list[int], newest: Tensor, state: Tensor | None = None) -> None:
        """The step's tokens join the history and the sequence; ``newest``: the last, on the device;
        ``state``: the carried stage's after them (rejected drafts never reach the history, so
        nothing rolls back). The grammar first: a :class:`RuntimeFailure` there leaves the row as
        it was, to be failed."""
        if self.matcher is not None:
            self.matcher.advance(emitted)
        text = self.text
        if len(emitted) == 1:
            text.history = text.history.advanced(newest, emitted, state)
        elif emitted:
            device = newest.device
            for token in emitted[:-1]:
                text.history = text.history.advanced(torch.tensor([token], device=device), [token])
            text.history = text.history.advanced(torch.tensor(emitted[-1:], device=device), emitted[-1:], state)
        text.seq += emitted

    def record_pass(self, accepted: int) -> None:
        """Speculation counts, current at every token so an interrupted run's summary has them."""
        assert self.drafting is not None
        counts, k = self.drafting.counts, self.drafts.count
        counts.drafted += k
        counts.accepted += accepted
        counts.passes += 1
        self.drafting.length.update(accepted, k)
        verified = getattr(self.drafting.drafter, "verified", None)  # a drafter that learns from it
        if verified is not None and k:
            verified(k, accepted)

    def end(self, emitted: list[int]) -> None:
        """The row ends with the step's ``emitted`` tokens: its sequence is complete, for whoever
        continues it (a session's next turn) and for a drafter that keeps it (the suffix pool)."""
        self.text.seq += emitted
        finished = getattr(self.drafting.drafter, "finished", None) if self.drafting is not None else None
        if finished is not None:
            finished(self.text.seq)

    def speculation(self) -> Speculation:
        assert self.drafting is not None
        counts = self.drafting.counts
        tokens_per_pass = self.item.stats.tokens / max(counts.passes, 1)
        return Speculation(counts.drafted, counts.accepted, counts.passes, tokens_per_pass)


def start_row(
    lm: LoadedModel,
    item: BatchItem,
    vocab: int,
    ignore_eos: bool,
    watch: Sequence[tuple[str, int]],
    reference_dtype: str | None,
    *,
    deterministic: bool = False,
) -> Row:
    """A row whose cache holds its whole prompt; it draws its first token from the prefill's
    logits, a speculative row too (it drafts after that token: drafting from the prompt's end
    would feed the prompt's last token again, one pass more for the same tokens)."""
    prompt = torch.tensor([item.prompt_ids], device=lm.sample_device)
    generator = make_generator(item.cfg.seed, lm.sample_device)
    history = TokenHistory.for_config(prompt, vocab, item.cfg, lm.tokenizer, lm.eos_ids)
    matcher, failed = None, None
    try:
        matcher = start_matcher(lm, item.cfg, vocab, history)
    except UserError as exc:  # this request's constraint, not the rows beside it
        failed = exc
    emitter = Emitter(lm, item.cfg, item.stats, item.prompt_ids, ignore_eos, watch, item.stop_ids, item.keep_stop,
                      deterministic)
    drafting = None
    if item.drafter is not None:
        length = DraftLength(k=item.draft_tokens or 4, adaptive=item.draft_tokens is None)
        drafting = Drafting(item.drafter(), length)
    return Row(
        item=item,
        text=RowText(emitter, generator, history, list(item.prompt_ids)),
        cached=len(item.prompt_ids),
        drafts=Drafts(
            torch.zeros(0, dtype=torch.long, device=lm.sample_device), torch.zeros(0, vocab, device=lm.sample_device)
        ),
        drafting=drafting,
        reference=ReferenceTotals(reference_dtype) if reference_dtype is not None and item.reference else None,
        matcher=matcher,
        failed=failed,
    )


def start_matcher(
    lm: LoadedModel, cfg: SamplingConfig, vocab: int, history: TokenHistory | None = None
) -> Matcher | None:
    """The row's grammar state at the start of its output (the tokenizer's table built once); a
    constraint its bans or ``--min-tokens`` leave no way to complete (searched with ``history``'s
    vocabulary) is refused here, before the row emits a token: the loop would stop part-way."""
    if cfg.constraint is None:
        return None
    table = tokenizer_table(lm.tokenizer, vocab, sorted(lm.eos_ids), cfg.constraint.flag)
    matcher = Matcher(cfg.constraint, table, vocab)
    if history is not None and history.vocabulary is not None:
        reason = dead_end(matcher, cfg, history.vocabulary)
        if reason is not None:
            raise UserError(reason)
    return matcher
