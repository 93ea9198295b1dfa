"""The numbers every token event reports, computed on the device and fetched in one transfer
(on a CPU, where reading a value waits on nothing, column by column, the small ones read there)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from llmsample.events import StepFigures, Watched
from llmsample.sampling import blocks, filters
from llmsample.sampling.filters import kept_count
from llmsample.sampling.pipeline import Chain, entropy_bits
from llmsample.sampling.stages import FILTER_STAGES


@dataclass(frozen=True)
class WatchIndex:
    """The ``--watch`` ids on the host and on the device, made once per run: a step then copies
    nothing to the device for them, and reads their ids without a transfer."""

    ids: tuple[int, ...]
    tensor: Tensor

    @classmethod
    def of(cls, watch_ids: Sequence[int], device: torch.device) -> WatchIndex | None:
        """None when nothing is watched."""
        ids = tuple(int(i) for i in watch_ids)
        return cls(ids, torch.tensor(ids, dtype=torch.long, device=device)) if ids else None


def step_figures(
    chain: Chain, tokens: Tensor, top_n: int, watch: WatchIndex | None = None, accepted: Tensor | None = None
) -> list[StepFigures]:
    """Everything a token event reports, for every row, with one host sync off the CPU.

    The top list is ranked by the penalised logits: for kept tokens that is the order of the
    sampling distribution, and it still ranks the alternatives a greedy step discarded.
    ``watch``: token ids whose probabilities and raw rank ride along
    in the same transfer; so does ``accepted`` (per position, its row's accepted drafts)."""
    raw, ranked, sampled = chain.raw, chain.penalised, chain.sampled  # sampled: over chain.support
    raw_logprobs = raw.log_softmax(-1)  # one fused pass: faster on a CPU than logsumexp alone
    index = tokens.view(-1, 1)
    # The raw row's block maxima, where blocks pay, serve its top list, its rank and its maximum.
    maxima = chain.stages[0].maxima if blocks.blocks_pay(raw, max(top_n, 1)) else None
    listed = None  # the raw row's top values, descending: the top list's, or more (the chain's top-k)
    if top_n <= 0:
        top_ids = index[:, :0]
    elif ranked.logits is raw:
        listed, top_ids = shared_top(chain, min(top_n, raw.shape[-1]), maxima)
    else:  # its stage's block maxima: made once for greedy too, or mended from the raw row's
        n = min(top_n, raw.shape[-1])
        top_ids = blocks.top(ranked.logits, n, ranked.maxima if blocks.blocks_pay(ranked.logits, n) else None)[1]
    # The raw row's minimum for its kept count, its maximum for finiteness.
    if filters.host_syncs_are_free(raw):  # a CPU's aminmax is one scalar pass, ten times amin and amax
        low, high = raw.amin(-1), (raw if maxima is None else maxima).amax(-1)
    else:  # an accelerator's is one kernel
        low, high = raw.aminmax(dim=-1)
    asked = [index, top_ids]  # the drawn token, the top list, the watched: their probabilities in one lookup
    if watch is not None:
        asked.append(watch.tensor.expand(index.shape[0], -1))
    ids = torch.cat(asked, -1)
    host = filters.host_syncs_are_free(raw)  # a CPU's: small numbers are read off on the host
    kept, source = kept_counts(chain, low)
    columns: list[Tensor | float | list[Any]] = [
        ids,
        sampled_probs(chain, ids) if host else chain.prob_of(ids),
        raw_logprobs.gather(1, ids).exp(),
        count_above(raw, raw.gather(1, index), maxima, listed),  # the rank - 1
        # A greedy distribution is one token: its entropy is 0 (a broken row is told by the check below).
        0.0 if chain.is_greedy else entropy_bits(sampled),
        sampled_mass(chain, host),
        # Told by the host from the step's one transfer, rather than with a host sync of its own:
        # the maximum is finite exactly when no logit is NaN or +inf and one at least is finite.
        high,
        *kept,
    ]
    if watch is not None:
        watched_raw = raw.gather(1, asked[-1])
        columns.append(blocks.count_true(raw.unsqueeze(1) > watched_raw.unsqueeze(-1)))  # their ranks - 1
    if accepted is not None:
        columns.append(accepted.view(-1))
    rows = fetch_rows(columns, index.shape[0])
    layout = Layout(chain.names, top_ids.shape[-1], () if watch is None else watch.ids, source, accepted is not None)
    return [_figures_of(row, layout) for row in rows]


def shared_top(chain: Chain, n: int, maxima: Tensor | None) -> tuple[Tensor, Tensor]:
    """The raw row's top list of ``n`` ids and the values it was ranked among (descending; the
    drawn token's rank reads them): the first n of the chain's wider ranking (its top-k's) when
    no two of its first n + 1 values tie, the list of n then having one order, the one a ranking
    of n gives; else the row ranked for n (the ids among tied tokens are that ranking's)."""
    values, ids = chain.stages[0].top(n)
    if values.shape[-1] == n:
        return values, ids
    if all(all(a > b for a, b in itertools.pairwise(row)) for row in values[:, : n + 1].tolist()):  # NaN: ranked
        return values, ids[:, :n]
    return blocks.top(chain.raw, n, maxima)


def sampled_probs(chain: Chain, ids: Tensor) -> Tensor | list[list[float]]:
    """:meth:`Chain.prob_of` ``ids``, on a CPU read off the host copy of the chain's few
    candidates (one lookup a row, for the seven torch calls of the search; the draw read them too)."""
    if chain.support is None:
        return chain.prob_of(ids)
    rows = []
    for support, sampled, asked in zip(chain.host_support, chain.host_sampled, ids.tolist(), strict=True):
        lookup = dict(zip(support, sampled, strict=True))
        rows.append([lookup.get(token, 0.0) for token in asked])
    return rows


def sampled_mass(chain: Chain, host: bool) -> Tensor | list[float]:
    """The sampled distribution's total per row: on a CPU a chain of one candidate a row (greedy's)
    reads it off the host copy the draw made (the sum of one float32 is that float)."""
    if host and chain.support is not None and chain.support.shape[-1] == 1:
        return [row[0] for row in chain.host_sampled]
    return chain.sampled.sum(-1)


def fetch_rows(columns: Sequence[Tensor | float | list[Any]], batch: int) -> list[list[float]]:
    """Per row, its values of every column side by side on the host: a column is a ``[batch]``
    or ``[batch, n]`` tensor, a float (the same for every row) or rows already on the host (a
    CPU's only). Off the CPU in one transfer (a host sync waits on the device); on it each
    tensor's own ``tolist``, which costs less than the float copies and the concatenation that
    one transfer needs (a dozen torch calls a step)."""
    tensors = [c for c in columns if isinstance(c, Tensor)]
    if not filters.host_syncs_are_free(tensors[0]):
        wide = [
            c.float().view(batch, -1) if isinstance(c, Tensor) else tensors[0].new_full((batch, 1), c)
            for c in columns
            if not isinstance(c, list)
        ]
        assert len(wide) == len(columns)  # host rows are a CPU's
        return torch.cat(wide, -1).tolist()
    parts = [c.tolist() if isinstance(c, Tensor) else c if isinstance(c, list) else [c] * batch for c in columns]
    rows: list[list[float]] = []
    for values in zip(*parts, strict=True):
        row: list[float] = []
        for value in values:
            if isinstance(value, list):
                row.extend(value)
            else:
                row.append(value)
        rows.append(row)
    return rows


@dataclass(frozen=True)
class Layout:
    """Where a fetched row keeps what: its stages' names, the top list's length, the watched ids,
    per stage the column of its kept count (stages that keep what came in share one), whether
    the drafts accepted close the row."""

    names: tuple[str, ...]
    n_top: int
    watched_ids: tuple[int, ...]
    source: tuple[int, ...]
    drafted: bool


def _figures_of(row: list[float], layout: Layout) -> StepFigures:
    """One row of the step's transfer: the asked ids, their sampled and raw probabilities, then
    the rank minus one, entropy, mass, finiteness, the kept counts, the watched ranks minus one,
    the drafts accepted."""
    names, n_top, watched_ids = layout.names, layout.n_top, layout.watched_ids
    m, n_counts = 1 + n_top + len(watched_ids), max(layout.source) + 1
    ids, probs, model = row[:m], row[m : 2 * m], row[2 * m : 3 * m]
    rank, entropy, mass, finite = row[3 * m : 3 * m + 4]  # finite: the raw row's maximum
    counts = row[3 * m + 4 : 3 * m + 4 + n_counts]
    kept = [counts[j] for j in layout.source]
    watch_ranks = row[3 * m + 4 + n_counts :]
    at = 1 + n_top  # the watched ids follow the top list
    return StepFigures(
        token_id=int(ids[0]),
        prob=probs[0],
        model_prob=model[0],
        model_rank=int(rank) + 1,
        entropy=max(entropy, 0.0) + 0.0,  # no -0.0 in the output
        top_ids=[int(t) for t in ids[1:at]],
        top_probs=probs[1:at],
        top_model_probs=model[1:at],
        removed={name: int(kept[i - 1] - kept[i]) for i, name in enumerate(names) if name in FILTER_STAGES},
        mass=mass,
        finite_logits=math.isfinite(finite),
        candidates=int(kept[-1]),
        watch=tuple(
            Watched(token_id=t, prob=probs[at + i], model_prob=model[at + i], model_rank=int(watch_ranks[i]) + 1)
            for i, t in enumerate(watched_ids)
        ),
        accepted=int(row[-1]) if layout.drafted else 0,
    )


def count_above(raw: Tensor, value: Tensor, maxima: Tensor | None, top: Tensor | None) -> Tensor | list[int]:
    """:func:`blocks.count_above` (the drawn token's rank minus one), read off the raw row's top
    list ``top`` (descending) when the row's token is at least its last value: every token above
    it is then in the list. Nearly every drawn token is; the blocks' search costs a dozen calls.
    A CPU's (where the top list is asked): per row on the host, the search for a row that needs it,
    and host numbers, which :func:`fetch_rows` takes as they are."""
    if top is None or not filters.host_syncs_are_free(raw):
        return blocks.count_above(raw, value, maxima)
    counts = []
    for r, (v, listed) in enumerate(zip(value.view(-1).tolist(), top.tolist(), strict=True)):
        if listed and v >= listed[-1]:  # (a NaN token or list fails the test: the search)
            counts.append(sum(t > v for t in listed))
        else:
            row = slice(r, r + 1)
            counts.append(int(blocks.count_above(raw[row], value[row], None if maxima is None else maxima[row])))
    return counts


def kept_counts(chain: Chain, low: Tensor) -> tuple[list[Tensor | float | list[Any]], tuple[int, ...]]:
    """The tokens the stages keep: count columns (``[batch]`` or ``[batch, n]``, int32; a float
    when every row keeps the whole vocabulary), and per stage the column of its count among
    them, in order; ``low``: the raw row's minimum. Only a filter removes tokens: the other
    stages keep -inf where it was and clamp what they change to finite values
    (``keep_finite``), so they keep what came in; so does a filter that was off (top-k 0, top-p
    1, min-p 0 hand on their input) on the support its count was taken on (after a temperature
    computed on top-k's candidates, top-k hands on the same values, and they are counted).
    Logits are finite until a filter sets -inf, so that is all there is to count. The stages on
    the chain's candidates are counted together, in one pass over their stacked values (a CPU's
    on the host: a few dozen values a stage, rows already on the host for :func:`fetch_rows`)."""
    stages = chain.stages
    source: list[int] = []  # per stage, the stage whose count it has
    for position, stage in enumerate(stages):
        same = position > 0 and (
            stage.name not in FILTER_STAGES
            or (stage.values is stages[position - 1].values and stage.ids is stages[source[-1]].ids)
        )
        source.append(source[-1] if same else position)
    counted = sorted(set(source))
    narrow = [p for p in counted if stages[p].ids is not None]
    whole = [p for p in counted if p not in narrow]
    columns: list[Tensor | float | list[Any]] = []
    for p in whole:
        masking = stages[p].masking
        if p == 0 and filters.host_syncs_are_free(low) and all(v > -math.inf for v in low.tolist()):
            columns.append(float(stages[0].values.shape[-1]))  # kept_count's answer, without a tensor
        elif masking is not None:  # a mask's few tokens off the count before it (whole too: a count's stage)
            before = columns[whole.index(source[p - 1])]
            assert not isinstance(before, list)
            columns.append(masking.kept(before))
        else:
            columns.append(kept_count(stages[p].values, low if p == 0 else None))
    if narrow and filters.host_syncs_are_free(low):  # a few candidates a stage: counted on the host
        per_stage = [stages[p].values.tolist() for p in narrow]
        # (``list.count`` finds -inf alone: a NaN is not it, and counts as kept, as ``!=`` counts it)
        columns.append([[len(stage[r]) - stage[r].count(-math.inf) for stage in per_stage] for r in range(len(low))])
    elif narrow:
        values = torch.stack([stages[p].values for p in narrow], 1)  # [batch, stages, candidates]
        columns.append(values.shape[-1] - blocks.count_true(values.isneginf()))
    order = {p: i for i, p in enumerate(whole + narrow)}
    return columns, tuple(order[p] for p in source)
