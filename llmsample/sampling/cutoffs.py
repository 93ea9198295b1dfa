"""The stages people still tune beside top-k/top-p: dynamic temperature and quadratic smoothing
(which reshape the logits) and the probability cutoffs epsilon, eta, top-h, top-a and p-less
(which remove tokens). Pure functions over ``[batch, vocab]`` logits, as in
:mod:`llmsample.sampling.filters`: no input edited in place, a removed token ``-inf``, every
row keeps at least its most likely token.

Each reads only the distribution of the finite logits, so each gives the same answer on the
chain's candidates (a narrowed row) as on the whole row with every other token ``-inf``: all
may run on the candidates' path. Where peers differ, the definition followed is named."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from llmsample.sampling.config import GREEDY_TEMPERATURE
from llmsample.sampling.filters import apply_temperature, float32, keep_finite, kept_count, remove

TOP_H_CANDIDATES = 100
"""transformers' ``TopHLogitsWarper.top_n``: top-h looks at the 100 most likely tokens only."""


def _probs(logits: Tensor) -> Tensor:
    return float32(logits).softmax(-1)


def _entropy(probs: Tensor) -> Tensor:
    """Shannon entropy in nats per row ``[batch, 1]``, with 0 log 0 = 0 (a removed token)."""
    return torch.special.entr(probs).sum(-1, keepdim=True)


def _entropy_of_logits(logits: Tensor) -> Tensor:
    """:func:`_entropy` of their softmax, from the log-softmax: a third of ``entr``'s time on a
    49k CPU row (a removed token's ``-inf`` clamped so that 0 x it is 0)."""
    logprobs = float32(logits).log_softmax(-1)
    return -(logprobs.exp() * logprobs.clamp_min(torch.finfo(torch.float32).min)).sum(-1, keepdim=True)


def _keep_top(logits: Tensor, remove_mask: Tensor) -> Tensor:
    """Remove ``remove_mask`` but never a row's most likely token (nor its ties): the cutoffs'
    ``min_tokens_to_keep = 1``."""
    top = logits.amax(-1, keepdim=True)
    return remove(logits, remove_mask & (logits < top))


def apply_dynamic_temperature(logits: Tensor, temperature: float, spread: float, exponent: float) -> Tensor:
    """Dynamic temperature (llama.cpp's ``llama_sampler_temp_ext``, ``--dynatemp-range``): the
        temperature of each row moves in ``[max(0, t - spread), t + spread]`` with its entropy, as
        ``low + (high - low) * (H / log n) ** exponent``, n the tokens still in the row (llama.cpp's
        candidates). A temperature that comes to 0 is taken as the greedy threshold (1e-4), which removes
    nothing (llama.cpp keeps the argmax alone; the temperature stage removes nothing here)."""
    if spread <= 0:
        return apply_temperature(logits, temperature)
    low, high = max(0.0, temperature - spread), temperature + spread
    count = kept_count(logits).unsqueeze(-1)
    most = count.clamp_min(2).float().log()  # a row of one token: its temperature does not matter
    normalised = (_entropy_of_logits(logits) / most).clamp(0.0, 1.0)
    dynamic = low + (high - low) * normalised.pow(exponent)
    return apply_temperature(logits, dynamic.clamp_min(GREEDY_TEMPERATURE))


def apply_smoothing(logits: Tensor, factor: float, curve: float) -> Tensor:
    """Quadratic (and cubic) smoothing, text-generation-webui's ``QuadraticSamplingLogitsWarper``
    (``smoothing_factor``, ``smoothing_curve``): with d = logit - max, the logit becomes
    ``max - k f d^2 + s f d^3``, k = (3 - curve) / 2, s = (curve - 1) / 2. The top token keeps
    its logit; the row's maximum is its own (the peer's is the batch's, the same for one row)."""
    if factor <= 0:
        return logits
    top = logits.amax(-1, keepdim=True)
    d = logits - top
    k, s = (3 - curve) / 2, (curve - 1) / 2
    # In float32 as the peer's, Horner's form: an overflow is -inf (d^2 is +inf, the bracket is
    # never 0 then), clamped back to the largest float as the temperature's is.
    shaped = top + d * d * (s * factor * d - k * factor)
    return keep_finite(torch.where(logits > -math.inf, shaped, logits), logits)


def keep_epsilon(logits: Tensor, epsilon: float) -> Tensor:
    """Epsilon sampling (Hewitt et al. 2022, transformers' ``EpsilonLogitsWarper``): remove the
    tokens with probability below ``epsilon`` (a plain probability, as transformers' and vLLM's;
    text-generation-webui's ``epsilon_cutoff`` counts in units of 1e-4)."""
    if epsilon <= 0:
        return logits
    return _keep_top(logits, _probs(logits) < epsilon)


def keep_eta(logits: Tensor, eta: float) -> Tensor:
    """Eta sampling (Hewitt et al. 2022, transformers' ``EtaLogitsWarper``): remove the tokens
    below ``min(eta, sqrt(eta) * exp(-H))``, H the row's entropy in nats."""
    if eta <= 0:
        return logits
    probs = _probs(logits)
    threshold = (math.sqrt(eta) * torch.exp(-_entropy(probs))).clamp(max=eta)
    return _keep_top(logits, probs < threshold)


def keep_top_a(logits: Tensor, a: float) -> Tensor:
    """Top-a (text-generation-webui's ``TopALogitsWarper``): remove tokens below ``a * p_max^2``."""
    if a <= 0:
        return logits
    probs = _probs(logits)
    top = probs.amax(-1, keepdim=True)
    return _keep_top(logits, probs < a * top * top)


def keep_p_less(logits: Tensor) -> Tensor:
    """p-less sampling (Tan et al. 2025): keep the tokens whose probability is at least the
    probability that two draws agree, ``sum p^2``; no setting to tune."""
    probs = _probs(logits)
    return _keep_top(logits, probs < (probs * probs).sum(-1, keepdim=True))


def keep_top_h(logits: Tensor, h: float) -> Tensor:
    """Top-h (Potraghloo et al. 2025, transformers' ``TopHLogitsWarper``): among the 100 most
    likely tokens, renormalised, keep them in descending order while their summed entropy terms
    ``-p log p`` stay within ``h`` times that distribution's entropy (the first always)."""
    if h <= 0:
        return logits
    count = min(TOP_H_CANDIDATES, logits.shape[-1])
    top, ids = logits.float().topk(count, dim=-1)
    probs = top.softmax(-1)
    terms = torch.special.entr(probs)
    keep = terms.cumsum(-1) <= h * terms.sum(-1, keepdim=True)
    keep[..., 0] = True
    keep &= top > -math.inf
    kept = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, ids, keep)
    return remove(logits, ~kept)
