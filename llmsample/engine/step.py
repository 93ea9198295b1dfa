"""One step of the loop for every row at once, plain and speculative alike: the chain over the
logits of every position fed, the draws (or the rejection step over a row's drafts), the step
figures in one transfer per group of rows that share sampler settings, then the records.

Rows group by their sampler settings alone (not the seed, the length or the stop strings), so a
batch of requests with fresh seeds still makes one chain call per setting. Each row draws from
its own generator, so in float32 it samples what it samples alone."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from llmsample.engine.reference import reference_figures
from llmsample.engine.row_state import Row, RowFailed
from llmsample.engine.speculative import accept_by_draws, accept_drafts
from llmsample.errors import RuntimeFailure
from llmsample.events import ConstraintOutcome, StepFigures, Summary, TokenEvent
from llmsample.sampling import filters
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.constraint import batch_masks
from llmsample.sampling.figures import WatchIndex, step_figures
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import Chain, sampler_chain
from llmsample.sampling.row_values import RowValues

Record = tuple[Any, TokenEvent | Summary | RowFailed]

ONE_THREAD_ELEMENTS = 1 << 18
"""Up to this many logits a step (five rows of a 49k vocabulary) the chain and the figures run
on one torch thread: their ops are small, and a second OpenMP thread waits at every op's barrier
for a core that llama.cpp's threads or the neighbours hold (on two busy cores a step took
~10x as long on two threads as on one)."""


@dataclass(frozen=True)
class StepInput:
    """The logits of every position fed in the last pass, ``[positions, vocab]``, and where each
    row's positions start (a row has ``1 + row.drafts.count``); ``reference``: the reference
    model's logits at the same positions (``--reference``)."""

    logits: Tensor
    starts: list[int]
    reference: Tensor | None = None


@dataclass
class StepResult:
    """Per row: the tokens it emitted (host ids), whether it finished, its carried stage's state
    after them (None: it has none); and the newest token of every row as a tensor, ready to be fed."""

    emitted: list[list[int]]
    finished: list[bool]
    newest: Tensor
    states: list[Tensor | None]


def sample_step(
    rows: list[Row],
    step: StepInput,
    top_n: int,
    watched: WatchIndex | None,
    agree: Callable[[Tensor], Tensor],
    alone: bool = False,
) -> Iterator[Record]:
    """Yields the step's records; returns a :class:`StepResult`. ``alone`` (``--deterministic``): every row
    is a group of its own, its chain on its own positions and threads, so its figures are those
    it gets alone to the last bit (a group's softmax over candidates rounds with its widest row)."""
    emitted: list[list[int]] = [[] for _ in rows]
    finished = [False] * len(rows)
    states: list[Tensor | None] = [None] * len(rows)
    newest: Tensor | None = None  # assembled group by group when the rows are not one group
    groups: dict[SamplingConfig | int, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(i if alone else row.sampler, []).append(i)
    for members in groups.values():
        with step_compute(step.logits[_positions(rows, members, step)] if alone else step.logits):
            chain, tokens, counts, starts = _draw_group(rows, members, step, agree)
            figures = step_figures(chain, tokens, top_n, watched, counts)
            scored = None
            if step.reference is not None:
                scored = reference_figures(chain.raw, step.reference[_positions(rows, members, step)], tokens)
            accepted = {i: figures[start].accepted for i, start in zip(members, starts, strict=True)}
            # A carried stage's state after each position's token; a row keeps its last emitted one's.
            after = chain.state_after(tokens, rows[members[0]].item.cfg)
        if after is not None:
            for i, start in zip(members, starts, strict=True):
                states[i] = after[start + accepted[i] : start + accepted[i] + 1]
        for i, start in zip(members, starts, strict=True):
            count = accepted[i] + 1
            finished[i] = yield from _emit(rows[i], figures[start : start + count], scored, start, accepted[i])
            emitted[i] = [f.token_id for f in figures[start : start + count]]
        last = (
            tokens
            if len(starts) == len(tokens)
            else tokens[[s + accepted[i] for i, s in zip(members, starts, strict=True)]]
        )
        if len(members) == len(rows):
            newest = last.clone()  # an ordinary tensor: a compiled step warmed up on them takes it as one
        else:
            newest = last.new_zeros(len(rows)) if newest is None else newest
            newest[torch.tensor(members, device=newest.device)] = last
    assert newest is not None  # every row is in a group
    return StepResult(emitted, finished, newest, states)


@contextlib.contextmanager
def step_compute(logits: Tensor) -> Iterator[None]:
    """What a step computes in: inference mode (no autograd bookkeeping: about a tenth of a CPU
    step's ~60 small torch calls), on one torch thread while a small CPU step computes
    (:data:`ONE_THREAD_ELEMENTS`), the caller's count again after it. Both are set back before
    the step yields to its consumer."""
    threads = torch.get_num_threads()
    one = logits.is_cpu and threads > 1 and logits.numel() <= ONE_THREAD_ELEMENTS
    if one:
        torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            yield
    finally:
        if one:
            torch.set_num_threads(threads)


def _positions(rows: list[Row], members: list[int], step: StepInput) -> Tensor | slice:
    """Where the group's positions sit in the step's logits (a slice when that is all of them)."""
    if len(members) == len(rows):
        return slice(None)
    index = [p for i in members for p in range(step.starts[i], step.starts[i] + 1 + rows[i].drafts.count)]
    return torch.tensor(index, device=step.logits.device)


def _draw_group(
    rows: list[Row], members: list[int], step: StepInput, agree: Callable[[Tensor], Tensor]
) -> tuple[Chain, Tensor, Tensor | None, list[int]]:
    """The group's chain, its token at every position, at every position its row's accepted
    drafts (None when nobody drafted), and where each row's positions start within the group."""
    group = [rows[i] for i in members]
    logits = step.logits[_positions(rows, members, step)]
    speculative = any(row.drafts.count for row in group)
    histories = [
        row.text.history.prefixes(row.drafts.tokens, row.drafts.ids) if row.drafts.count else row.text.history
        for row in group
    ]
    history = TokenHistory.stack(histories)
    if group[0].matcher is not None:  # every row's masks, after each of its drafts, in one call
        masks = batch_masks([row.matcher for row in group if row.matcher], [row.drafts.ids for row in group])
        history = dataclasses.replace(history, allowed=masks)
    cfg = group[0].item.cfg
    if group[0].matcher is None and cfg.constraint is not None:  # it could not start: it fails in _emit
        cfg = dataclasses.replace(cfg, constraint=None)
    per_position = [row.item.cfg for row in group for _ in range(row.drafts.count + 1)]
    chain = sampler_chain(logits, history, cfg, RowValues.of(per_position, logits.device))
    if not speculative:
        tokens = agree(chain.draw([row.text.generator for row in group]))
        return chain, tokens, None, list(range(len(members)))
    parts, counts, starts, at = [], [], [], 0
    for row in group:
        k = row.drafts.count
        starts.append(at)
        if k == 0:
            after = chain.rows(at).draw([row.text.generator])
            count = torch.zeros((), dtype=torch.long, device=after.device)
        elif fixed_drafts(row, logits):
            count, after = accept_by_draws(chain.rows(slice(at, at + k + 1)), row.drafts.tokens, row.text.generator)
        else:
            probs = chain.probs[at : at + k + 1]
            count, after = accept_drafts(probs[None], row.drafts.q[None], row.drafts.tokens[None], row.text.generator)
            count = count[0]
        # Position j carries the emitted token: the draft while accepted, then the correction.
        drafts = torch.cat([row.drafts.tokens, after])
        parts.append(torch.where(torch.arange(k + 1, device=drafts.device) < count, drafts, after))
        counts.append(count.expand(k + 1))
        at += k + 1
    tokens = agree(torch.cat(parts))
    return chain, tokens, torch.cat(counts), starts


def fixed_drafts(row: Row, logits: Tensor) -> bool:
    """Whether the row's drafts are checked against its own draws (:func:`accept_by_draws`):
    fixed drafts, on the CPU. On an accelerator the check's rewind of the generator would wait
    for the device, so rejection sampling keeps the step's one transfer there, and a seed's
    draws differ from the plain run's."""
    return row.drafting is not None and not row.drafting.drafter.drawn and filters.host_syncs_are_free(logits)


def _emit(
    row: Row, figures: list[StepFigures], scored: list[Any] | None, start: int, accepted: int
) -> Iterator[Record]:
    """The row's records for this step; returns whether the row finished."""
    if row.failed is not None:  # its constraint could not start (start_row): this row alone ends
        yield row.key, RowFailed(row.key, str(row.failed), user_error=True)
        return True
    failure = row.matcher.failure() if row.matcher is not None else None
    if failure is not None:  # its grammar failed computing this step's mask: this row alone ends
        yield row.key, RowFailed(row.key, failure)
        return True
    speculative = row.drafting is not None
    if speculative:
        row.record_pass(accepted)
    for j, figure in enumerate(figures):
        try:
            event = row.text.emitter.emit(figure, source="draft" if j < accepted else "target")
        except RuntimeFailure as exc:  # this request's numbers broke, not the run
            yield row.key, RowFailed(row.key, str(exc))
            return True
        if scored is not None and row.reference is not None:
            event = dataclasses.replace(event, reference=scored[start + j])
            row.reference.add(scored[start + j])
            row.item.stats.note(reference=row.reference.summary())
        if speculative:
            row.item.stats.note(speculation=row.speculation())
        yield row.key, event
        if row.text.emitter.reason:
            if row.matcher is not None:
                emitted = [f.token_id for f in figures[: j + 1]]
                complete = row.text.emitter.reason == "eos" or row.matcher.accepts_after(emitted)
                constraint = row.matcher.constraint
                row.item.stats.note(constraint=ConstraintOutcome(constraint.flag, complete, constraint.ignored))
            yield row.key, row.item.stats.summary(row.text.emitter.reason)
            return True
    return False
