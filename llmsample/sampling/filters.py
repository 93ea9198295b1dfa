"""The tensor stages of the sampler chain: pure functions over ``[batch, vocab]`` logits that
need no text (penalties over counts, the temperature, greedy, and the truncation filters in
text-generation-webui's default priority: top-n-sigma, top-k, top-p, typical-p, min-p, XTC last).
No function edits its input in place; a removed token has logit ``-inf``."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from llmsample.sampling import blocks
from llmsample.sampling.blocks import count_true
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.history import TokenHistory

NUCLEUS_WIDTH = 256
"""Up to this many tokens top-p ranks with one stable sort (a chain's few candidates); a wider row
first takes this many with ``topk``."""

TOP_P_ULPS = 4 * torch.finfo(torch.float32).eps
"""Cumulative mass within a few float32 ulps of the running total counts as reaching p: the
softmax of log [.1, .2, .3, .4] gives .4 + .3 a hair under .7 in float32, and the article's rule
("equals or exceeds P") must still hold; a wider margin (1e-6 absolute) dropped tokens that exact
arithmetic keeps, e.g. the .3 of [.4999995, .3, .2000005] at p = .5."""


def host_syncs_are_free(tensor: Tensor) -> bool:
    """On the CPU, reading a tensor's value costs nothing; on an accelerator it waits for every
    queued kernel, so the chain there never branches on values. (``is_cpu`` costs a fifth of
    ``device.type``, which builds a device object: every stage asks.)"""
    return tensor.is_cpu


def float32(tensor: Tensor) -> Tensor:
    """``tensor.float()``, without the call when it is float32 already: a call that hands back
    its input still costs a dispatch, 10-30 µs on a CPU after a forward pass."""
    return tensor if tensor.dtype == torch.float32 else tensor.float()


def kept_count(logits: Tensor, minimum: Tensor | None = None) -> Tensor:
    """Per row, the tokens a stage keeps (logit not ``-inf``), as int32. On the CPU a row with no
    ``-inf`` (what the model gives, nearly always) is told by its minimum (``minimum``, when the
    caller has it), with no mask."""
    vocab = logits.shape[-1]
    if host_syncs_are_free(logits) and bool(((logits.amin(-1) if minimum is None else minimum) > -math.inf).all()):
        return torch.full(logits.shape[:-1], vocab, dtype=torch.int32, device=logits.device)
    return vocab - count_true(logits.isneginf())


def first_argmax(logits: Tensor, maxima: Tensor | None = None) -> Tensor:
    """``logits.argmax(-1, keepdim=True)``, the same index (the first maximal one, a NaN counting
    as the largest): on a CPU torch's argmax over a 49k row takes 15 times its ``amax``, so the
    maximum is found block by block and then within its block. ``maxima``: the row's
    :func:`blocks.block_maxima`, when the caller has them (greedy on the raw row, whose maxima
    the step's figures rank too): the search then makes no pass over the row of its own."""
    vocab = logits.shape[-1]
    block = next((b for b in (256, 128, 64) if vocab % b == 0 and vocab >= 8 * b), 0)
    if maxima is not None and host_syncs_are_free(logits):
        block = blocks.BLOCK
    elif not block or not host_syncs_are_free(logits):  # an accelerator's argmax is one fast kernel
        return logits.argmax(-1, keepdim=True)
    rows = logits.reshape(*logits.shape[:-1], vocab // block, block)
    # the first block that holds the maximum
    which = (rows.amax(-1) if maxima is None else maxima).argmax(-1, keepdim=True)
    inside = rows.gather(-2, which.unsqueeze(-1).expand(*which.shape, block)).squeeze(-2)
    return which * block + inside.argmax(-1, keepdim=True)


def remove(logits: Tensor, mask: Tensor) -> Tensor:
    """``-inf`` where ``mask``: what every filter does. ``torch.where`` with a 0-d tensor costs a
    fifth of ``masked_fill`` on a 49k CPU row (0.1 ms against 0.55 ms), with the same result."""
    return torch.where(mask, removed(logits.device), logits)


def removed(device: torch.device) -> Tensor:
    """A 0-d float32 ``-inf`` on ``device``, made once: a removed token's value for ``torch.where``
    (making it each time was half the cost of a filter's ``where`` on a chain's few candidates)."""
    value = _REMOVED.get(device)
    if value is None:
        value = _REMOVED[device] = torch.full((), -math.inf, device=device)
    return value


_REMOVED: dict[torch.device, Tensor] = {}
""":func:`removed`'s tensor per device."""


def keep_finite(logits: Tensor, before: Tensor) -> Tensor:
    """Clamp what a scaling overflowed (a repetition penalty of 1e-40, a temperature of 2e-4 on
    logits of 1e35) to the largest float32, so the order survives and the softmax stays finite;
    a token that was already ``-inf`` (removed) stays removed."""
    limit = torch.finfo(torch.float32).max
    return torch.where(before == -math.inf, before, logits.clamp(-limit, limit))


def apply_penalties(logits: Tensor, history: TokenHistory, cfg: SamplingConfig) -> Tensor:
    """Repetition penalty as in CTRL (over prompt and generated tokens), then OpenAI's
    frequency and presence penalties (over generated tokens only)."""
    if history.counts is None or history.seen is None or not cfg.has_penalties:
        return logits
    raw = logits = float32(logits)
    if cfg.repetition_penalty != 1.0:
        penalised = torch.where(logits > 0, logits / cfg.repetition_penalty, logits * cfg.repetition_penalty)
        logits = torch.where(history.seen, penalised, logits)
    if cfg.frequency_penalty or cfg.presence_penalty:
        counts = history.counts
        logits = logits - counts * cfg.frequency_penalty - (counts > 0).float() * cfg.presence_penalty
    return keep_finite(logits, raw)


def apply_temperature(logits: Tensor, temperature: float | Tensor) -> Tensor:
    """``logits / temperature`` (a float, or one per row ``[batch, 1]``), clamped as
    :func:`keep_finite` clamps. On a CPU one pass over the logits' range tells whether anything
    could overflow (a temperature below 1 on huge logits) or needs clamping (+inf, NaN): nearly
    never, and then the division is all there is. Off the CPU a float is divided as a tensor: a
    CUDA kernel multiplies by a float's reciprocal instead, and a row would then differ in the
    last bit from the same row among rows with their own temperatures."""
    if not isinstance(temperature, Tensor) and temperature == 1.0:
        return logits
    if not host_syncs_are_free(logits):
        divisor = temperature if isinstance(temperature, Tensor) else torch.full((), temperature, device=logits.device)
        return keep_finite(logits / divisor, logits)
    if logits.numel():
        low, high = logits.amin(), logits.amax()  # (``aminmax`` is ten times as long on a CPU)
        coldest = float(temperature.min()) if isinstance(temperature, Tensor) else temperature
        largest = max(-float(low), float(high))  # inf or NaN: then the whole clamp
        if coldest > 0 and largest * max(1.0, 1.0 / coldest) < torch.finfo(torch.float32).max:
            return logits / temperature
    return keep_finite(logits / temperature, logits)


def keep_argmax(logits: Tensor) -> Tensor:
    """Greedy: only the first maximal token survives (``torch.argmax`` picks the first)."""
    index = first_argmax(logits)
    return torch.full_like(logits, -math.inf).scatter(-1, index, logits.gather(-1, index))


def keep_top_n_sigma(logits: Tensor, n: float) -> Tensor:
    """Top-nσ (Tang et al. 2024, as llama.cpp computes it): keep the tokens whose logit is at
    least ``max - n * std``, the standard deviation taken over the finite logits (population,
    divided by their count). Scaling by a temperature scales both sides: the set does not move."""
    if n <= 0:
        return logits
    if host_syncs_are_free(logits) and bool((logits > -math.inf).all()):  # nothing removed yet
        spread = logits - logits.mean(-1, keepdim=True)
        std = (spread * spread).mean(-1, keepdim=True).sqrt()
    else:
        finite = logits > -math.inf
        count = finite.sum(-1, keepdim=True).clamp_min(1)
        zero = logits.new_zeros(())
        mean = torch.where(finite, logits, zero).sum(-1, keepdim=True) / count
        spread = torch.where(finite, logits - mean, zero)
        std = ((spread * spread).sum(-1, keepdim=True) / count).sqrt()
    top = logits.max(-1, keepdim=True).values
    return remove(logits, logits < top - n * std)


def keep_top_k(logits: Tensor, k: int) -> Tensor:
    """Exactly k tokens, ties at the k-th value broken towards the lower id, so top-k 1 is greedy.
    On a CPU, where asking costs nothing, the tie-breaking count runs only when the k-th value is
    tied; on an accelerator always (asking would wait on the device every step)."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = blocks.top(logits, k)[0][..., -1:]
    if host_syncs_are_free(logits):
        at_least = logits >= kth
        if bool((count_true(at_least) == k).all()):  # no tie straddles the k-th place
            return remove(logits, ~at_least)
    above = logits > kth
    at = logits == kth
    room = k - above.sum(-1, keepdim=True)
    keep = above | (at & (at.cumsum(-1) <= room))
    return remove(logits, ~keep)


def top_k_candidates(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The tokens :func:`keep_top_k` keeps, as ``(values, ids)`` in ascending id order (the order
    a draw over the whole row walks): ``[batch, k]`` when no tie straddles the k-th value (nearly
    always: ``topk``'s own candidates), else :func:`keep_top_k`'s tie rule and what it kept, at
    most k a row (a row with NaN keeps fewer: it fails later, alone). A CPU's (the tie check is a
    host sync)."""
    top, order = blocks.top(logits, k + 1)
    # The k-th value strictly above the next one (and no NaN, which topk ranks first): no tie
    # straddles the k-th place, and topk's first k are the set.
    if bool((top[..., k - 1] > top[..., k]).all()) and not bool(top.isnan().any()):
        ids = order[..., :k].sort(-1).values
        return logits.gather(-1, ids), ids
    narrowed = kept_candidates(keep_top_k(logits, k), k)
    assert narrowed is not None  # keep_top_k keeps at most k
    return narrowed


def kept_candidates(logits: Tensor, limit: int) -> tuple[Tensor, Tensor] | None:
    """What a filter kept, as ``(values, ids)`` ``[batch, width]`` in ascending id order, ``width``
    the most any row kept (a row that kept fewer is padded with removed tokens, ``-inf``); None
    when that is over ``limit``. Every kept token is above every removed one, so the ``width``
    largest are all of a row's kept tokens, whatever their ties. A CPU's (a host sync).

    The width depends on the other rows: a row's softmax over its candidates may then differ in
    the last bit with the batch around it, as padding already makes its logits differ."""
    width = int(kept_count(logits).max())
    if width > limit:
        return None
    ids = blocks.top(logits, max(width, 1))[1].sort(-1).values
    return logits.gather(-1, ids), ids


def keep_top_p(logits: Tensor, p: float | Tensor) -> Tensor:
    """The smallest set whose probability reaches p (a float, or one per row ``[batch, 1]`` in
    float64): a token stays when the mass strictly before it (in descending order) has not reached
    p yet, so the crossing token stays. A row whose p is 1 keeps everything."""
    return top_p_kept(logits, p, 0)[0]


def top_p_kept(logits: Tensor, p: float | Tensor, limit: int) -> tuple[Tensor, Tensor | None]:
    """:func:`keep_top_p`'s logits ``(row, None)``, or, when no row keeps more than ``limit``
    tokens, what it keeps as candidates ``(values, ids)`` in ascending id order, taken from the
    tokens it ranked (its kept tokens are a prefix of them, a row that kept fewer padded with
    ``-inf``) without another pass over the vocabulary. Candidates only on a CPU (the width is a
    host sync); there too a row's result does not depend on the rows beside it."""
    per_row, whole, cpu = isinstance(p, Tensor), p >= 1.0, host_syncs_are_free(logits)
    if (cpu and bool(whole.all())) if per_row else whole:  # (off the CPU: no host sync)
        return logits, None
    probs = float32(logits).softmax(-1)
    if cpu and not limit and probs.shape[-1] <= NUCLEUS_WIDTH:  # a chain's few candidates
        return remove(logits, _outside_nucleus(probs, p)), None
    if cpu:
        # A row that keeps everything must not widen the search for the others (its mask is
        # all kept below).
        top, order, keep_sorted = _nucleus_candidates(probs, torch.where(whole, 0.0, p) if per_row else p)
    else:  # ties in id order, as on the CPU
        top, order = probs.sort(dim=-1, descending=True, stable=True)
        keep_sorted = _kept_prefix(top, p)
    some_whole = per_row and (not cpu or bool(whole.any()))
    if cpu and limit and not some_whole:
        width = int(count_true(keep_sorted).max())
        if width <= limit:
            ids, at = order[..., :width].sort(-1)
            kept = keep_sorted[..., :width].gather(-1, at)
            return torch.where(kept, logits.gather(-1, ids), removed(logits.device)), ids
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, keep_sorted)
    return remove(logits, ~(keep | whole) if some_whole else ~keep), None


def _kept_prefix(top: Tensor, p: float | Tensor) -> Tensor:
    """Of probabilities in descending order, the ones top-p keeps: those whose mass before them
    has not reached p (the mass only grows: a prefix), the first always."""
    wide = top.double()
    mass_before = wide.cumsum(-1) - wide
    keep = mass_before * (1 + TOP_P_ULPS) < p
    keep[..., 0] = True
    return keep


def _outside_nucleus(probs: Tensor, p: float | Tensor) -> Tensor:
    """The tokens top-p removes from a few candidates, ranked by one stable sort and walked on the
    host: :func:`_kept_prefix`'s float64 sums and test, token by token (the running total, then
    the mass before a token as that total minus it, as the cumulative sum and the subtraction give
    it), in five torch calls for its eleven. A row whose p is 1 or more keeps everything."""
    top, order = probs.sort(dim=-1, descending=True, stable=True)
    rows = p.view(-1).tolist() if isinstance(p, Tensor) else [p] * probs.shape[0]
    dropped = []
    for values, ids, row_p in zip(top.tolist(), order.tolist(), rows, strict=True):
        drop, total = [False] * len(values), 0.0
        for j, (value, token) in enumerate(zip(values, ids, strict=True)):
            total += value
            drop[token] = j > 0 and row_p < 1.0 and not (total - value) * (1 + TOP_P_ULPS) < row_p
        dropped.append(drop)
    if not dropped:  # no rows: no list to tell the width
        return torch.zeros_like(probs, dtype=torch.bool)
    return torch.tensor(dropped, dtype=torch.bool, device=probs.device)


def _nucleus_candidates(probs: Tensor, p: float | Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The top tokens, descending, ties in id order, enough of them to hold the nucleus and every
    token tied with its last one, and which of them it keeps (:func:`_kept_prefix`). Sorting the whole vocabulary costs milliseconds per token on a
    CPU; the nucleus almost always lies in the top few hundred, so candidates are taken with
    ``topk`` and widened only when they fall short. ``topk`` orders ties by its width, which the
    widest row of a batch decides: with the whole tie at the cut inside the candidates and ties
    put in id order, a row keeps the same tokens in any batch (bf16 logits tie often)."""
    vocab = probs.shape[-1]
    k = min(vocab, NUCLEUS_WIDTH)
    while True:
        if k == vocab:  # every token (a chain's few candidates): one stable sort ranks them
            top, order = probs.sort(dim=-1, descending=True, stable=True)
            return top, order, _kept_prefix(top, p)
        top, order = probs.topk(k, dim=-1)
        ids, at = order.sort(-1)
        top, at = top.gather(-1, at).sort(dim=-1, descending=True, stable=True)
        order = ids.gather(-1, at)
        keep = _kept_prefix(top, p)
        last = top.gather(-1, count_true(keep).long().unsqueeze(-1) - 1)
        reached = top.double().sum(-1, keepdim=True) * (1 + TOP_P_ULPS) >= p
        if bool((reached & ((last > top[..., -1:]) | (p <= 0))).all()):
            return top, order, keep
        k = min(vocab, k * 8)


def keep_typical_p(logits: Tensor, mass: float) -> Tensor:
    """Locally typical sampling (Meister et al. 2023), as transformers' ``TypicalLogitsWarper``:
    order tokens by how far their surprisal is from the entropy, keep the closest ones until their
    probability reaches ``mass`` (the crossing token and its ties included, always one)."""
    if mass >= 1.0:
        return logits
    logprobs = float32(logits).log_softmax(-1)
    probs = logprobs.exp()
    entropy = -(logprobs * probs).nansum(-1, keepdim=True)
    distance = (-logprobs - entropy).abs()
    vocab = logits.shape[-1]
    # Sorting the whole vocabulary costs ~9 ms per token on a CPU; the typical set lies among the
    # tokens nearest the entropy, so on the CPU they are taken with ``topk`` and widened only
    # when their mass falls short (on an accelerator that check would wait on the device).
    k = min(vocab, 256) if host_syncs_are_free(logits) else vocab
    while True:
        ordered, order = distance.topk(k, dim=-1, largest=False) if k < vocab else distance.sort(-1)
        cumulative = probs.gather(-1, order).cumsum(-1)
        if k == vocab or bool((cumulative[..., -1] >= mass).all()):
            break
        k = min(vocab, k * 8)
    last = (cumulative < mass).sum(-1, keepdim=True).clamp_(max=k - 1)
    cutoff = ordered.gather(-1, last)
    # the tokens past the cutoff go; the nearest one always stays
    return remove(logits, (distance > cutoff) & (distance > ordered[..., :1]))


def keep_min_p(logits: Tensor, min_p: float | Tensor) -> Tensor:
    """Drop tokens below ``min_p * p_max`` (a float, or one per row ``[batch, 1]`` in float64);
    compared in log space so tiny probabilities do not underflow to a false tie."""
    if isinstance(min_p, Tensor):
        if host_syncs_are_free(logits) and not bool((min_p > 0.0).any()):
            return logits
        # log(0) is -inf: a row whose min-p is off removes nothing. Rounded to float32 as a float
        # scalar is, so a row gets the threshold it gets alone.
        log_min = min_p.log().float()
    elif min_p <= 0.0:
        return logits
    else:
        log_min = math.log(min_p)
    logprobs = float32(logits).log_softmax(-1)
    threshold = logprobs.max(-1, keepdim=True).values + log_min
    return remove(logits, logprobs < threshold)


def keep_xtc(logits: Tensor, threshold: float) -> Tensor:
    """XTC, "exclude top choices" (p-e-w, text-generation-webui PR #6335; llama.cpp's
    ``llama_sampler_xtc``), the branch where it fires: every token with probability >= threshold
    is removed except the least likely of them, so it changes nothing unless two or more pass
    the threshold. Tokens tied at the least likely probability all stay (no sort order decides)."""
    probs = logits.softmax(-1)
    above = (probs >= threshold) & (probs > 0)
    least = torch.where(above, probs, probs.new_full((), math.inf)).min(-1, keepdim=True).values
    return remove(logits, above & (probs > least))


def xtc_mixture(before: Tensor, after: Tensor, probability: float) -> Tensor:
    """XTC fires with ``probability``: the distribution a token is drawn from is the mixture of
    the filtered and the unfiltered one. Drawing from it is drawing the coin and then the branch
    with the run's generator (one uniform instead of two), and speculative verification compares
    exactly this p and q."""
    fired = after.softmax(-1)
    if probability >= 1.0:
        return fired
    return (1 - probability) * before.softmax(-1) + probability * fired
