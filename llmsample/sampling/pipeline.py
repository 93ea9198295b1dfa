"""The sampling pipeline: pure functions over ``[batch, vocab]`` logits.

Order (fixed, as in transformers' logits processors):
penalties -> temperature (or greedy argmax) -> top-k -> top-p -> min-p -> softmax -> draw.
Every command, the speculative drafter and verifier included, goes through
:func:`sampler_chain`, so what is shown, what is drawn and what is verified agree.
No function edits its input in place; a removed token has logit ``-inf``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.history import TokenHistory

TOP_P_ULPS = 4 * torch.finfo(torch.float32).eps
"""Cumulative mass within a few float32 ulps of the running total counts as reaching p: the
softmax of log [.1, .2, .3, .4] gives .4 + .3 a hair under .7 in float32, and the article's rule
("equals or exceeds P") must still hold; a wider margin (1e-6 absolute) dropped tokens that exact
arithmetic keeps, e.g. the .3 of [.4999995, .3, .2000005] at p = .5."""


def apply_penalties(logits: Tensor, history: TokenHistory, cfg: SamplingConfig) -> Tensor:
    """Repetition penalty as in CTRL (over prompt and generated tokens), then OpenAI's
    frequency and presence penalties (over generated tokens only)."""
    if history.counts is None or history.seen is None or not cfg.has_penalties:
        return logits
    raw = logits = logits.float()
    if cfg.repetition_penalty != 1.0:
        penalised = torch.where(logits > 0, logits / cfg.repetition_penalty, logits * cfg.repetition_penalty)
        logits = torch.where(history.seen, penalised, logits)
    if cfg.frequency_penalty or cfg.presence_penalty:
        counts = history.counts
        logits = logits - counts * cfg.frequency_penalty - (counts > 0).float() * cfg.presence_penalty
    return keep_finite(logits, raw)


def apply_temperature(logits: Tensor, temperature: float) -> Tensor:
    return logits if temperature == 1.0 else keep_finite(logits / temperature, logits)


def keep_finite(logits: Tensor, before: Tensor) -> Tensor:
    """Clamp what a scaling overflowed (a repetition penalty of 1e-40, a temperature of 2e-4 on
    logits of 1e35) to the largest float32, so the order survives and the softmax stays finite;
    a token that was already ``-inf`` (removed) stays removed."""
    limit = torch.finfo(torch.float32).max
    return torch.where(before == -math.inf, before, logits.clamp(-limit, limit))


def keep_argmax(logits: Tensor) -> Tensor:
    """Greedy: only the first maximal token survives (``torch.argmax`` picks the first)."""
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, logits.argmax(-1, keepdim=True), True)
    return logits.masked_fill(~keep, -math.inf)


def keep_top_k(logits: Tensor, k: int) -> Tensor:
    """Exactly k tokens, ties at the k-th value broken towards the lower id, so top-k 1 is greedy.
    Always the tie-aware form: asking whether there is a tie would wait on the device (a CUDA
    sync per step), and the cumulative count costs ~0.1 ms on a 49k vocabulary."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = logits.topk(k, dim=-1).values[..., -1:]
    above = logits > kth
    at = logits == kth
    room = k - above.sum(-1, keepdim=True)
    keep = above | (at & (at.cumsum(-1) <= room))
    return logits.masked_fill(~keep, -math.inf)


def keep_top_p(logits: Tensor, p: float) -> Tensor:
    """The smallest set whose probability reaches p: a token stays when the mass strictly
    before it (in descending order) has not reached p yet, so the crossing token stays."""
    if p >= 1.0:
        return logits
    probs = logits.float().softmax(-1)
    top, order = _nucleus_candidates(probs, p) if host_syncs_are_free(probs) else probs.sort(-1, descending=True)
    mass_before = top.double().cumsum(-1) - top.double()
    keep_sorted = mass_before * (1 + TOP_P_ULPS) < p
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, keep_sorted)
    return logits.masked_fill(~keep, -math.inf)


def host_syncs_are_free(tensor: Tensor) -> bool:
    """On the CPU, reading a tensor's value costs nothing; on an accelerator it waits for every
    queued kernel, so the chain there never branches on values."""
    return tensor.device.type == "cpu"


def _nucleus_candidates(probs: Tensor, p: float) -> tuple[Tensor, Tensor]:
    """The top tokens, descending, enough of them to reach p. Sorting the whole vocabulary costs
    milliseconds per token on a CPU; the nucleus almost always lies in the top few hundred, so
    candidates are taken with ``topk`` and widened only when their mass falls short."""
    vocab = probs.shape[-1]
    k = min(vocab, 256)
    while True:
        top, order = probs.topk(k, dim=-1)
        if k == vocab or bool((top.double().sum(-1) * (1 + TOP_P_ULPS) >= p).all()):
            return top, order
        k = min(vocab, k * 8)


def keep_min_p(logits: Tensor, min_p: float) -> Tensor:
    """Drop tokens below ``min_p * p_max``; compared in log space so tiny probabilities do not
    underflow to a false tie."""
    if min_p <= 0.0:
        return logits
    logprobs = logits.float().log_softmax(-1)
    threshold = logprobs.max(-1, keepdim=True).values + math.log(min_p)
    return logits.masked_fill(logprobs < threshold, -math.inf)


@dataclass(frozen=True)
class Stage:
    name: str
    logits: Tensor  # [batch, vocab]; a removed token is -inf


FILTER_STAGES = ("top_k", "top_p", "min_p")
"""The stages that remove candidates; the step figures count what each removed."""


@dataclass(frozen=True)
class Chain:
    """One step of the pipeline: the logits after every stage and the distribution drawn from.
    ``explain`` shows every stage; the loops count what each filter removed."""

    stages: tuple[Stage, ...]
    probs: Tensor

    @property
    def raw(self) -> Tensor:
        return self.stages[0].logits

    @property
    def penalised(self) -> Tensor:
        """After the penalties: it ranks the alternatives a greedy step discarded."""
        return self.stages[1].logits

    @property
    def final(self) -> Tensor:
        return self.stages[-1].logits

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(stage.name for stage in self.stages)

    def rows(self, index: slice | int) -> Chain:
        """Some rows of every stage (an int keeps a batch of one)."""
        index = slice(index, index + 1) if isinstance(index, int) else index
        return Chain(tuple(Stage(s.name, s.logits[index]) for s in self.stages), self.probs[index])


def sampler_chain(logits: Tensor, history: TokenHistory, cfg: SamplingConfig) -> Chain:
    """``raw, penalties, temperature, top_k, top_p, min_p`` — or ``raw, penalties, greedy`` —
    over ``[batch, vocab]`` logits; the last stage's softmax is what is sampled."""
    logits = logits.float()
    stages = [Stage("raw", logits)]
    logits = apply_penalties(logits, history, cfg)
    stages.append(Stage("penalties", logits))
    if cfg.is_greedy:
        stages.append(Stage("greedy", keep_argmax(logits)))
    else:
        logits = apply_temperature(logits, cfg.temperature)
        stages.append(Stage("temperature", logits))
        logits = keep_top_k(logits, cfg.top_k)
        stages.append(Stage("top_k", logits))
        logits = keep_top_p(logits, cfg.top_p)
        stages.append(Stage("top_p", logits))
        logits = keep_min_p(logits, cfg.min_p)
        stages.append(Stage("min_p", logits))
    return Chain(tuple(stages), stages[-1].logits.softmax(-1))


def sampling_probs(logits: Tensor, history: TokenHistory, cfg: SamplingConfig) -> Tensor:
    """The distribution a token is drawn from; the one function draft and target share."""
    return sampler_chain(logits, history, cfg).probs


def draw(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One token per row by inverse CDF: one uniform per row (``torch.multinomial`` costs ~1.7 ms
    on a 49k vocabulary here, this ~0.1 ms). A zero-probability token is never drawn: its CDF step
    is flat, and the float64 edge where u x total rounds up to the total falls back to the argmax."""
    cdf = probs.double().cumsum(-1)
    u = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64, device=probs.device)
    index = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_(max=probs.shape[-1] - 1)
    index = torch.where(probs.gather(-1, index) > 0, index, probs.argmax(-1, keepdim=True))
    return index.squeeze(-1)


def entropy_bits(probs: Tensor) -> Tensor:
    """Shannon entropy per row in bits, with 0 log 0 = 0."""
    return torch.special.entr(probs).sum(-1) / math.log(2)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """An explicit generator: no global RNG state, so runs with the same seed repeat exactly."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
