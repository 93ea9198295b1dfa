"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023): a drafter proposes K tokens,
the target scores them in one forward pass, and the output distribution stays exactly the
target's. A draft model's tokens are drawn from q and kept by rejection sampling
(:func:`accept_drafts`); fixed drafts (prompt lookup, the suffix pool) are checked against the
target's own draws (:func:`accept_by_draws`), so a seed gives the plain run's text with them.
Draft and target probabilities both come from :func:`llmsample.sampling.pipeline.sampler_chain`,
so the distributions compared are the ones sampled."""

from __future__ import annotations

import dataclasses
import weakref
from typing import Protocol

import torch
from torch import Tensor

from llmsample.engine.backend import Backend, open_backend
from llmsample.errors import UserError
from llmsample.models.loading import LoadedModel
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.constraint import Matcher
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import Chain, draw, sampler_chain


def accept_drafts(p: Tensor, q: Tensor, drafted: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """The rejection step, batched: ``p`` ``[B, K+1, V]`` (target), ``q`` ``[B, K, V]`` (draft),
    ``drafted`` ``[B, K]``. Returns how many drafts each row accepts and the token after them:
    from ``normalize(max(0, p - q))`` at the first rejection, from ``p`` when all K pass."""
    batch, k = drafted.shape
    rows = torch.arange(batch, device=p.device)
    if k == 0:
        return torch.zeros(batch, dtype=torch.long, device=p.device), draw(p[:, 0], generator)
    p_x = p[:, :k].gather(-1, drafted.unsqueeze(-1)).squeeze(-1)
    q_x = q.gather(-1, drafted.unsqueeze(-1)).squeeze(-1)
    # min(1, p/q) is implied by u < 1; q(x) = 0 cannot be drafted, the guard only avoids 0/0.
    ratio = torch.where(q_x > 0, p_x / q_x.clamp_min(torch.finfo(q_x.dtype).tiny), torch.zeros_like(p_x))
    u = torch.rand(batch, k, generator=generator, device=p.device)
    accepted = (u < ratio).long().cumprod(-1).sum(-1)
    p_next = p[rows, accepted]
    q_next = torch.cat([q, torch.zeros_like(q[:, :1])], dim=1)[rows, accepted]  # q = 0 after all K: plain p
    residual = (p_next - q_next).clamp_min(0)
    mass = residual.sum(-1, keepdim=True)
    # p == q leaves no residual (and no rejection in exact arithmetic): never normalise zeros.
    dist = torch.where(mass > 0, residual / mass.clamp_min(torch.finfo(mass.dtype).tiny), p_next)
    return accepted, draw(dist, generator)


def accept_by_draws(chain: Chain, drafted: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Fixed drafts checked against the target's own draws: ``chain`` holds one row's ``K+1``
    positions, ``drafted`` its ``K`` drafts. Position j draws what a plain run draws there (the
    row's next uniform, the same inverse CDF), and the drafts stand while they equal those draws;
    the draw at the first difference (or after all K) comes next. The tokens emitted are the
    plain run's, so the seed gives one text with and without drafting; and a draft x stands with
    probability p(x), the rejection step's min(1, p/q) at q(x) = 1: nothing is lost. Returns how
    many drafts stand and the token after them; the generator ends where a plain run's would,
    the uniforms past the first difference given back."""
    k = drafted.shape[0]
    state = generator.get_state()
    drawn = chain.draw([generator] * (k + 1))
    count = int((drawn[:k] == drafted).long().cumprod(0).sum())
    if count < k:  # the draws after the first difference were never a plain run's
        generator.set_state(state)
        chain.rows(slice(0, count + 1)).draw([generator] * (count + 1))
    return torch.tensor(count, device=drawn.device), drawn[count : count + 1]


class Drafter(Protocol):
    drawn: bool
    """Whether its drafts are drawn from q (a draft model: kept by rejection sampling, so the
    seed's text differs from the plain run's), or fixed tokens (checked by
    :func:`accept_by_draws`: the plain run's text)."""

    def propose(
        self,
        seq: list[int],
        k: int,
        history: TokenHistory,
        cfg: SamplingConfig,
        generator: torch.Generator,
        matcher: Matcher | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Up to k tokens after ``seq`` and their draft distributions ``[k, V]``; ``matcher``: the
        row's grammar state, whose masks a drafter that samples applies to q at every position
        (the row cuts drafts at the first the grammar rejects). A drafter may also have
        ``verified(drafted, accepted)``: after each pass that verified a draft of its, how much
        of it the target kept (the suffix pool measures its acceptance with it);
        ``sharing(rows)``: before a proposal, the rows of the pass it is for (the pool's cut
        rises with them); and ``finished(seq)``: the row's whole sequence when it ends (the
        pool keeps all of it)."""
        ...


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the sequence's last n tokens (longest n
    first) and propose what followed it. Deterministic, so q is one-hot.

    The lookup reads an index of the sequence's n-grams, each to where it last ended, kept as the
    sequence grows: a row's tokens are read once in all, not once a token (scanning a 4k-token
    prompt back to front took milliseconds a step in Python, a forward pass's share). So a
    drafter serves one row; given another list, or its own grown shorter, it indexes that afresh
    (a row's ``seq`` only grows: rejected drafts are never in it)."""

    drawn = False

    def __init__(self, vocab_size: int, device: torch.device, ngram_min: int = 2, ngram_max: int = 4) -> None:
        self.vocab_size, self.device = vocab_size, device
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        self._seq: list[int] | None = None  # the sequence indexed (held, so its identity is not reused)
        self._ends: dict[tuple[int, ...], int] = {}  # n-gram -> where its latest occurrence ended
        self._indexed = 0  # the n-grams ending at or before this position are in ``_ends``

    def lookup(self, seq: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens after the latest occurrence of ``seq``'s last n tokens that ends
        before ``seq`` does."""
        self._index(seq)
        for n in range(min(self.ngram_max, len(seq) - 1), self.ngram_min - 1, -1):
            end = self._ends.get(tuple(seq[-n:]))
            if end is not None:
                return seq[end : end + k]
        return []

    def _index(self, seq: list[int]) -> None:
        """Index the n-grams of ``seq`` that end before its last token and are not indexed yet."""
        if seq is not self._seq or len(seq) <= self._indexed:
            self._seq, self._ends, self._indexed = seq, {}, 0
        low, ends = self.ngram_min, self._ends
        for end in range(max(self._indexed + 1, low), len(seq)):
            for n in range(low, min(self.ngram_max, end) + 1):
                ends[tuple(seq[end - n : end])] = end
        self._indexed = max(self._indexed, len(seq) - 1)

    def propose(
        self,
        seq: list[int],
        k: int,
        history: TokenHistory,
        cfg: SamplingConfig,
        generator: torch.Generator,
        matcher: Matcher | None = None,
    ) -> tuple[Tensor, Tensor]:
        drafted = torch.tensor(self.lookup(seq, k), dtype=torch.long, device=self.device)
        return drafted, torch.nn.functional.one_hot(drafted, self.vocab_size).float()


class ModelDrafter:
    """A smaller model with its own KV cache (one row of a backend of its own, transformers or
    llama.cpp), sampled with the same pipeline and preset."""

    drawn = True

    def __init__(self, draft: LoadedModel, vocab_size: int, sample_device: torch.device | None = None) -> None:
        """``sample_device``: the target's, where its proposals are compared with the target's
        distributions (the draft's own when None)."""
        self.draft, self.vocab_size = draft, vocab_size
        self.sample_device = sample_device or draft.sample_device
        self.backend: Backend | None = None
        self.fed: list[int] = []

    def _open(self, seq: list[int], max_tokens: int) -> Tensor:
        """The draft's row, its prompt admitted, with room for the row's whole run (``max_tokens``
        and a draft past it; a llama.cpp context is sized by it); closed when the drafter goes."""
        positions = len(seq) + max_tokens + DraftLength.max_k + 1
        self.backend = open_backend(self.draft, 1, positions, one_prompt=True, steps=False)
        weakref.finalize(self, self.backend.close)
        return self.backend.admit([seq])

    def _fit(self, logits: Tensor) -> Tensor:
        """Draft logits on the target's vocabulary: padding rows of either embedding differ in size."""
        extra = self.vocab_size - logits.shape[-1]
        if extra > 0:
            return torch.nn.functional.pad(logits, (0, extra), value=-torch.inf)
        return logits[..., : self.vocab_size]

    def propose(
        self,
        seq: list[int],
        k: int,
        history: TokenHistory,
        cfg: SamplingConfig,
        generator: torch.Generator,
        matcher: Matcher | None = None,
    ) -> tuple[Tensor, Tensor]:
        device = self.sample_device
        if self.backend is None:
            logits = self._open(seq, cfg.max_tokens)
        else:
            common = 0
            for a, b in zip(self.fed, seq, strict=False):
                if a != b:
                    break
                common += 1
            common = min(common, len(seq) - 1)  # feed at least one token to get fresh logits
            self.backend.rollback(0, common)
            logits = self.backend.verify([seq[common:]])[:, -1]
        logits = logits.to(device)
        self.fed = list(seq)
        tokens, dists = [], []
        pushed = 0
        for i in range(k):
            if matcher is not None:  # q under the grammar state after the drafts before it, as p
                history = dataclasses.replace(history, allowed=matcher.masks())
            chain = sampler_chain(self._fit(logits), history, cfg)
            q = chain.probs
            token = draw(q, generator)
            tokens.append(token)
            dists.append(q)
            if matcher is not None:
                if not matcher.push(int(token)):  # EOS: the draft ends
                    break
                pushed += 1
                if matcher.stopped:  # nothing but EOS can follow
                    break
            if i < k - 1:
                history = history.advanced(token, state=chain.state_after(token, cfg))  # mu, as the target's
                logits = self.backend.step(token).to(device)
        if matcher is not None:
            matcher.rollback(pushed)
        if not tokens:
            return torch.zeros(0, dtype=torch.long, device=device), torch.zeros(0, self.vocab_size, device=device)
        drafted = torch.cat(tokens)
        self.fed += drafted[:-1].tolist()
        return drafted, torch.cat(dists)


@dataclasses.dataclass
class DraftLength:
    """Fixed K, or adaptive: +2 after a fully accepted round, -1 otherwise (within 1..max_k)."""

    k: int = 4
    adaptive: bool = True
    max_k: int = 16

    def fit(self, rows: int) -> int:
        """K for a pass the row shares with ``rows`` rows. A pass is as wide as its longest row,
        so every position one row drafts costs every row a position: adaptive rows share
        ``max_k`` (greedy code rewrites at batch 4: 1.43x over no drafting with 16 each, 1.57x
        with 4), and an adaptive K above that comes down to it, so that it adapts from there; a
        fixed K is the user's (up to ``max_k``)."""
        if not self.adaptive:
            return min(self.k, self.max_k)
        self.k = min(self.k, max(1, self.max_k // rows))
        return self.k

    def update(self, accepted: int, drafted: int) -> None:
        if not self.adaptive or drafted == 0:
            return
        self.k = min(self.k + 2, self.max_k) if accepted == drafted else max(self.k - 1, 1)


def check_same_tokenizer(draft: LoadedModel, target: LoadedModel) -> None:
    """A draft must speak the target's vocabulary, or its proposals mean other tokens."""
    if draft.tokenizer.get_vocab() != target.tokenizer.get_vocab():
        raise UserError(
            f"draft {draft.name!r} has a different tokenizer from {target.name!r} "
            f"({len(draft.tokenizer)} vs {len(target.tokenizer)} tokens); use a draft from the same model family, "
            "or --draft ngram"
        )
