"""The stages that carry per-row state from draw to draw, as llama.cpp defines them
(``src/llama-sampler.cpp``): mirostat v1 and v2 (Basu et al. 2021), whose mu moves with the
surprise of each drawn token, and adaptive-p (llama.cpp PR #17927), whose target moves with a
running average of the drawn tokens' probabilities. Each is the chain's last stage (it samples).

The state is data, not a hidden attribute: a ``[rows, 2]`` float32 tensor in the row's
:class:`~llmsample.sampling.history.TokenHistory` (mirostat: ``mu, 0``; adaptive-p: the
weighted sum and the total weight), replaced by :func:`observe` after each draw. So a row's
state is a function of its accepted tokens: a speculative verifier evaluates a row's positions
in order, each with the state after the drafts before it (:func:`apply_carried`), and rejected
drafts never reach the row's history. In float32, as llama.cpp's."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from llmsample.sampling.config import SamplingConfig

CARRIED = ("mirostat", "adaptive_p")
"""The stages :func:`apply_carried` runs."""

MIROSTAT_M = 100
"""llama.cpp's ``m`` for mirostat v1 (common/sampling.cpp): s-hat from the 100 most likely tokens."""

# adaptive-p's transform (llama.cpp's DISTRIBUTION_WIDTH, PEAK_LOGIT_VALUE, SHARPNESS).
_INV_WIDTH = float(torch.tensor(1.0) / torch.tensor(0.3))  # 1.0f / 0.3f
_PEAK, _SHARPNESS = 5.0, 10.0


def _remove(logits: Tensor, mask: Tensor) -> Tensor:
    """``-inf`` where ``mask`` (:func:`llmsample.sampling.filters.remove`'s, which this module,
    read by the history, cannot import: filters read the history)."""
    return torch.where(mask, torch.full((), -math.inf, device=logits.device), logits)


def initial_state(cfg: SamplingConfig, rows: int, device: torch.device) -> Tensor:
    """The state before a row's first draw: mirostat's mu = 2 tau; adaptive-p's average primed
    as if the target had been met (sum = target / (1 - decay), weight = 1 / (1 - decay))."""
    one = torch.ones(rows, 1, device=device)
    if cfg.mirostat:
        tau = torch.tensor(cfg.mirostat_tau, dtype=torch.float32)
        return torch.cat([one * float(2 * tau), one * 0], -1)
    decay = 1 - torch.tensor(cfg.adaptive_decay, dtype=torch.float32)
    return torch.cat([one * float(torch.tensor(cfg.adaptive_target, dtype=torch.float32) / decay), one / decay], -1)


def keep_mirostat(logits: Tensor, mu: Tensor, cfg: SamplingConfig, vocab: int) -> Tensor:
    """Mirostat's truncation with each row's ``mu`` ``[rows, 1]``. v2: remove the tokens whose
    surprise ``-log2 p`` is above mu (the most likely stays). v1: estimate the Zipf exponent s
    from the m = 100 most likely tokens and keep the top ``k = (e 2^mu / (1 - N^-e))^(1/s)``,
    e = s - 1, N the vocabulary (ties at the k-th kept; a k that is not a number: 1)."""
    probs = logits.float().softmax(-1)
    if cfg.mirostat == 2:
        top = probs.amax(-1, keepdim=True)
        return _remove(logits, (-torch.log2(probs) > mu) & (probs < top))
    width = min(MIROSTAT_M, logits.shape[-1])
    top, order = logits.float().topk(width, dim=-1)
    p = probs.gather(-1, order)
    i = torch.arange(width - 1, device=logits.device, dtype=torch.float32)
    t = torch.log((i + 2) / (i + 1))
    finite = (logits > -math.inf).sum(-1, keepdim=True)
    used = i < finite - 1  # llama.cpp's pairs among the tokens still in the row
    b = torch.where(used, torch.log(p[..., :-1] / p[..., 1:]), 0.0)
    s_hat = (t * b).sum(-1, keepdim=True) / (t * t * used).sum(-1, keepdim=True)
    e = s_hat - 1
    k = torch.pow(e * torch.pow(2.0, mu) / (1 - torch.pow(float(vocab), -e)), 1 / s_hat)
    n = logits.shape[-1]
    k = torch.where(k.isfinite() & (k >= 1), k.clamp(max=n), 1.0).long()
    if int(k.max()) <= width:  # the k-th largest among the 100 already ranked
        threshold = top.gather(-1, k - 1)
    else:  # a selection, not a sort: a 49k CPU row's topk(49k) costs ~20 ms, kthvalue ~1 ms
        rows = [logits[r].float().kthvalue(n - int(k[r]) + 1).values for r in range(logits.shape[0])]
        threshold = torch.stack(rows).view(-1, 1)
    return _remove(logits, logits < threshold)


def adapt_p(logits: Tensor, average: Tensor, cfg: SamplingConfig) -> Tensor:
    """Adaptive-p's logits: with p the row's probabilities and t' = clamp(2 target - average),
    ``5 - 10 d^2 / (1 + d)``, d = |p - t'| / 0.3, so tokens near t' are the most likely (a
    removed token stays removed). ``average``: ``[rows, 2]``, the weighted sum and weight."""
    probs = logits.float().softmax(-1)
    target = min(max(cfg.adaptive_target, 0.0), 1.0)
    adapted = (2 * target - average[:, :1] / average[:, 1:]).clamp(0.0, 1.0)
    d = ((probs - adapted) * _INV_WIDTH).abs()
    return torch.where(logits > -math.inf, _PEAK - _SHARPNESS * d * d / (1 + d), logits)


def _shape(name: str, logits: Tensor, state: Tensor, cfg: SamplingConfig, vocab: int) -> Tensor:
    if name == "mirostat":
        return keep_mirostat(logits, state[:, :1], cfg, vocab)
    return adapt_p(logits, state, cfg)


def _step(name: str, state: Tensor, before: Tensor, after: Tensor, column: Tensor, cfg: SamplingConfig) -> Tensor:
    """The state after drawing the token at ``column`` ``[rows, 1]`` (-1: not a candidate, p = 0)
    of rows whose stage input and output were ``before`` and ``after``: mirostat moves mu by eta
    times the surprise's error (the drawn token's probability in the truncated distribution);
    adaptive-p adds the drawn token's probability before its transform to the average."""
    source = after if name == "mirostat" else before
    p = source.float().softmax(-1).gather(-1, column.clamp_min(0))
    p = torch.where(column >= 0, p, 0.0)
    if name == "mirostat":
        mu = state[:, :1] - cfg.mirostat_eta * (-torch.log2(p) - cfg.mirostat_tau)
        return torch.cat([mu, state[:, 1:]], -1)
    decay = cfg.adaptive_decay
    return torch.cat([p + decay * state[:, :1], 1 + decay * state[:, 1:]], -1)


def _columns(tokens: Tensor, ids: Tensor | None) -> Tensor:
    """Where ``tokens`` ``[rows, 1]`` sit in rows whose candidates are ``ids`` (ascending; None:
    the whole row), -1 where they are not among them."""
    if ids is None:
        return tokens
    at = torch.searchsorted(ids, tokens.contiguous()).clamp_(max=ids.shape[-1] - 1)
    return torch.where(ids.gather(-1, at) == tokens, at, -1)


def apply_carried(
    name: str,
    logits: Tensor,
    ids: Tensor | None,
    vocab: int,
    state: Tensor,
    carried: Sequence[int] | None,
    cfg: SamplingConfig,
) -> tuple[Tensor, Tensor]:
    """Stage ``name`` over ``logits`` (candidates at ``ids`` when narrowed), and the state each
    row was shaped with. ``carried[r] >= 0``: row r is row r - 1 with that token drawn (a
    speculative row's next position), so its state is row r - 1's after that draw: the rows
    are evaluated in order of that depth, each depth at once."""
    if not carried or max(carried) < 0:
        return _shape(name, logits, state, cfg, vocab), state
    depth: list[int] = []
    for r, token in enumerate(carried):
        depth.append(depth[r - 1] + 1 if token >= 0 and r > 0 else 0)
    states, out = state.clone(), torch.empty_like(logits)
    tokens = torch.tensor(carried, device=logits.device).unsqueeze(-1)
    for d in range(max(depth) + 1):
        rows = torch.tensor([r for r, at in enumerate(depth) if at == d], device=logits.device)
        if d > 0:
            prev = rows - 1
            column = _columns(tokens[rows], None if ids is None else ids[prev])
            states[rows] = _step(name, states[prev], logits[prev], out[prev], column, cfg)
        out[rows] = _shape(name, logits[rows], states[rows], cfg, vocab)
    return out, states


def observe(
    name: str, states: Tensor, before: Tensor, after: Tensor, ids: Tensor | None, tokens: Tensor, cfg: SamplingConfig
) -> Tensor:
    """Every chain row's state after drawing ``tokens`` ``[rows]`` (the loop keeps each row's
    at the position its emitted token came from)."""
    column = _columns(tokens.view(-1, 1), ids)
    return _step(name, states, before, after, column, cfg)
