"""The numbers every token event reports, computed on the device and fetched in one transfer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from llmsample.events import StepFigures, Watched
from llmsample.sampling import blocks
from llmsample.sampling.filters import host_syncs_are_free, kept_count
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
    """Everything a token event reports, for every row, with one host sync.

    The top list is ranked by the penalised logits: for kept tokens that is the order of the
    sampling distribution, and it still ranks the alternatives a greedy step discarded.
    ``watch``: token ids whose probabilities and raw rank ride along
    in the same transfer; so does ``accepted`` (per position, its row's accepted drafts)."""
    raw, ranked, sampled = chain.raw, chain.penalised, chain.sampled  # sampled: over chain.support
    raw_logprobs = raw.log_softmax(-1)  # one fused pass: faster on a CPU than logsumexp alone
    index = tokens.view(-1, 1)
    # The raw row's block maxima, where blocks pay, serve its top list, its rank and its maximum.
    maxima = blocks.block_maxima(raw) if blocks.blocks_pay(raw, max(top_n, 1)) else None
    shared = maxima if ranked is raw else None
    top_ids = blocks.top(ranked, min(top_n, ranked.shape[-1]), shared)[1] if top_n > 0 else index[:, :0]
    # The raw row's minimum for its kept count, its maximum for finiteness.
    if host_syncs_are_free(raw):  # a CPU's aminmax is one scalar pass, ten times amin and amax
        low, high = raw.amin(-1), (raw if maxima is None else maxima).amax(-1)
    else:  # an accelerator's is one kernel
        low, high = raw.aminmax(dim=-1)
    kept: list[Tensor] = []
    for position, stage in enumerate(chain.stages):
        # Only a filter removes tokens: the other stages keep -inf where it was and clamp what they
        # change to finite values (``keep_finite``), so they keep what came in. Logits are finite
        # until a filter sets -inf, so that is all there is to count.
        same = position > 0 and (stage.name not in FILTER_STAGES or stage.values is chain.stages[position - 1].values)
        if same:  # (or a filter that was off: top-k 0, top-p 1, min-p 0 hand on their input)
            kept.append(kept[-1])
        else:  # a support's -inf are its removed
            kept.append(kept_count(stage.values, low if position == 0 else None))
    columns = [
        index.float(),
        chain.prob_of(index),
        raw_logprobs.gather(1, index).exp(),
        blocks.count_above(raw, raw.gather(1, index), maxima).unsqueeze(-1).float() + 1,
        # A greedy distribution is one token: its entropy is 0 (a broken row is told by the check below).
        sampled.new_zeros(sampled.shape[0], 1) if chain.is_greedy else entropy_bits(sampled).unsqueeze(-1),
        sampled.sum(-1, keepdim=True),
        # Checked here, in the step's one transfer, rather than with a host sync of its own: the
        # maximum is finite exactly when no logit is NaN or +inf and one at least is finite.
        high.isfinite().float().unsqueeze(-1),
        torch.stack(kept, -1).float(),
        top_ids.float(),
        chain.prob_of(top_ids),
        raw_logprobs.gather(1, top_ids).exp(),
    ]
    n_watch = 0 if watch is None else len(watch.ids)
    if watch is not None:
        watched = watch.tensor.expand(index.shape[0], -1)
        watched_raw = raw.gather(1, watched)
        columns += [
            chain.prob_of(watched),
            raw_logprobs.gather(1, watched).exp(),
            (raw.unsqueeze(1) > watched_raw.unsqueeze(-1)).sum(-1).float() + 1,
        ]
    if accepted is not None:
        columns.append(accepted.view(-1, 1).to(sampled.dtype))
    rows = torch.cat(columns, -1).tolist()
    names = chain.names
    n_stages, n_top = len(names), top_ids.shape[-1]
    figures = []
    for row in rows:
        kept_counts = row[7 : 7 + n_stages]
        removed = {
            name: int(kept_counts[i - 1] - kept_counts[i]) for i, name in enumerate(names) if name in FILTER_STAGES
        }
        top = row[7 + n_stages : 7 + n_stages + 3 * n_top]
        tail = row[7 + n_stages + 3 * n_top :]
        ids = () if watch is None else watch.ids
        watched_rows = tuple(
            Watched(token_id=t, prob=tail[i], model_prob=tail[n_watch + i], model_rank=int(tail[2 * n_watch + i]))
            for i, t in enumerate(ids)
        )
        figures.append(
            StepFigures(
                token_id=int(row[0]),
                prob=row[1],
                model_prob=row[2],
                model_rank=int(row[3]),
                entropy=max(row[4], 0.0) + 0.0,  # no -0.0 in the output
                top_ids=[int(t) for t in top[:n_top]],
                top_probs=top[n_top : 2 * n_top],
                top_model_probs=top[2 * n_top :],
                removed=removed,
                mass=row[5],
                finite_logits=row[6] == 1.0,
                candidates=int(kept_counts[-1]),
                watch=watched_rows,
                accepted=int(row[-1]) if accepted is not None else 0,
            )
        )
    return figures
