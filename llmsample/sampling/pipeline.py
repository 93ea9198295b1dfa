"""The sampler chain and the draw: the stages of :mod:`llmsample.sampling.stages`, in that
table's order, over ``[batch, vocab]`` logits, then one token per row.

Order (fixed; the stages in brackets appear only when their setting is on):
[logit bias] -> [ban] -> [min-tokens] -> [no-repeat-ngram] -> [reasoning budget] -> penalties -> [DRY] -> [constraint]
-> temperature, dynamic when on (or greedy argmax) -> [smoothing] -> [top-n-sigma] -> top-k -> top-p
-> [typical-p] -> [epsilon] -> [eta] -> [top-h] -> [top-a] -> [p-less] -> min-p -> [XTC] -> [adaptive-p]
-> softmax -> draw; with mirostat: ... -> temperature -> mirostat -> softmax -> draw.
Everything that edits logits from the context (biases, bans, penalties) comes before the
temperature, as in transformers' processors and llama.cpp's default chain; the truncation
filters follow text-generation-webui's default priority (top-n-sigma, top-k, top-p, typical-p,
epsilon, eta, top-a, min-p, XTC last; top-h and p-less, which it lacks, beside top-a). The constraint (a grammar's allowed tokens) comes after everything that edits
logits and before greedy and every truncation filter: the truncation then works on the allowed
tokens, and the draw is from the renormalised constrained distribution. The tensor filters are in :mod:`llmsample.sampling.filters` and
:mod:`llmsample.sampling.cutoffs`, the stages that
read texts and token sequences in :mod:`llmsample.sampling.text_stages`.
Every command, the speculative drafter and verifier included, goes through
:func:`sampler_chain`, so what is shown, what is drawn and what is verified agree.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor

from llmsample.sampling import blocks, carried, cutoffs, filters
from llmsample.sampling.budget import force_block_close
from llmsample.sampling.config import SAMPLER_ORDER, SamplingConfig
from llmsample.sampling.drawing import HOST_WIDTH, draw, draw_with, host_indices, uniforms
from llmsample.sampling.filters import (
    apply_penalties,
    keep_argmax,
    keep_min_p,
    keep_top_k,
    keep_top_n_sigma,
    keep_top_p,
    keep_typical_p,
    keep_xtc,
    xtc_mixture,
)
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.row_values import PER_ROW, RowValues
from llmsample.sampling.stages import chain_of
from llmsample.sampling.text_stages import (
    MASKS,
    Masking,
    apply_constraint,
    apply_dry,
    apply_logit_bias,
    mask_banned,
    mask_early_end,
    mask_index,
    mask_repeated_ngrams,
)

StageFunction = Callable[[Tensor, TokenHistory, SamplingConfig], Tensor]


def _carried(
    name: str, logits: Tensor, ids: Tensor | None, vocab: int, history: TokenHistory, cfg: SamplingConfig
) -> tuple[Tensor, Tensor]:
    """A carried stage with the history's state (a history made without the config, explain's or
    a test's, has none: the state before a first draw)."""
    state = history.state
    if state is None:
        state = carried.initial_state(cfg, logits.shape[0], logits.device)
    return carried.apply_carried(name, logits, ids, vocab, state, history.carried, cfg)


APPLY: dict[str, StageFunction] = {
    "logit_bias": apply_logit_bias,
    "ban": mask_banned,
    "min_tokens": mask_early_end,
    "no_repeat_ngram": mask_repeated_ngrams,
    "reasoning_budget": force_block_close,
    "penalties": apply_penalties,
    "dry": apply_dry,
    "constraint": apply_constraint,
    "greedy": lambda logits, history, cfg: keep_argmax(logits),
    "temperature": lambda logits, history, cfg: cutoffs.apply_dynamic_temperature(
        logits, cfg.temperature, cfg.dynatemp_range, cfg.dynatemp_exponent
    ),
    "smoothing": lambda logits, history, cfg: cutoffs.apply_smoothing(
        logits, cfg.smoothing_factor, cfg.smoothing_curve
    ),
    "top_n_sigma": lambda logits, history, cfg: keep_top_n_sigma(logits, cfg.top_n_sigma),
    "top_k": lambda logits, history, cfg: keep_top_k(logits, cfg.top_k),
    "top_p": lambda logits, history, cfg: keep_top_p(logits, cfg.top_p),
    "typical_p": lambda logits, history, cfg: keep_typical_p(logits, cfg.typical_p),
    "epsilon": lambda logits, history, cfg: cutoffs.keep_epsilon(logits, cfg.epsilon_cutoff),
    "eta": lambda logits, history, cfg: cutoffs.keep_eta(logits, cfg.eta_cutoff),
    "top_h": lambda logits, history, cfg: cutoffs.keep_top_h(logits, cfg.top_h),
    "top_a": lambda logits, history, cfg: cutoffs.keep_top_a(logits, cfg.top_a),
    "p_less": lambda logits, history, cfg: cutoffs.keep_p_less(logits),
    "min_p": lambda logits, history, cfg: keep_min_p(logits, cfg.min_p),
    "xtc": lambda logits, history, cfg: keep_xtc(logits, cfg.xtc_threshold),
    "mirostat": lambda logits, history, cfg: _carried("mirostat", logits, None, logits.shape[-1], history, cfg)[0],
    "adaptive_p": lambda logits, history, cfg: _carried("adaptive_p", logits, None, logits.shape[-1], history, cfg)[0],
}
"""What each stage of the table after ``raw`` does to the logits before it."""


@dataclass(frozen=True)
class Stage:
    """A stage's logits ``[batch, vocab]``, a removed token ``-inf``. After the chain narrowed (on a
    CPU: :func:`sampler_chain`) the stages compute only the candidates: ``values``
    ``[batch, width]`` at token ``ids`` (ascending; a row with fewer is padded with ``-inf``), and
    the whole row is made when something reads ``logits`` (explain, a renderer)."""

    name: str
    values: Tensor
    ids: Tensor | None = None
    vocab: int = 0
    whole: Callable[[], Tensor] | None = None  # the whole row, where the stage keeps more than its ids
    masking: Masking | None = None  # a mask stage's tokens, when it set any
    tops: dict[str, tuple[Tensor, Tensor]] = field(default_factory=dict, compare=False, repr=False)  # see top

    @cached_property
    def logits(self) -> Tensor:
        if self.whole is not None:
            return self.whole()
        if self.ids is None:
            return self.values
        rows = self.values.shape[0]
        return self.values.new_full((rows, self.vocab), -math.inf).scatter_(-1, self.ids, self.values)

    @cached_property
    def maxima(self) -> Tensor:
        """:func:`blocks.block_maxima` of the stage's values, made once for whoever ranks them (the
        chain's top-k on the raw row, greedy, then the step's figures)."""
        if self.masking is not None:
            return self.masking.maxima(self.values)
        return blocks.block_maxima(self.values)

    def top(self, m: int) -> tuple[Tensor, Tensor]:
        """:func:`blocks.top` of the stage's values, at least ``m`` wide: the widest asked for yet,
        whose first m are a top m (the chain's top-k ranks the raw row, the step's figures take
        their top list and the drawn token's rank from the same ranking)."""
        widest = self.tops.get("widest")
        if widest is None or widest[0].shape[-1] < m:
            maxima = self.maxima if blocks.blocks_pay(self.values, m) else None
            widest = self.tops["widest"] = blocks.top(self.values, m, maxima)
        return widest

    def rows(self, index: slice) -> Stage:
        whole = None if self.whole is None else lambda: self.logits[index]
        return Stage(self.name, self.values[index], None if self.ids is None else self.ids[index], self.vocab, whole)


@dataclass(frozen=True)
class Chain:
    """One step of the pipeline: the logits after every stage and the distribution drawn from.
    ``explain`` shows every stage; the loops count what each filter removed.

    ``sampled`` is that distribution over the last stage's ``support``: the candidates the chain
    narrowed to (their ids ascending), or the whole vocabulary (None). What a step reads (the draw,
    the figures) reads it there; ``probs`` is the whole row, made when asked for (verification).
    ``states``: the carried stage's state each row was sampled with (:mod:`llmsample.sampling.carried`)."""

    stages: tuple[Stage, ...]
    sampled: Tensor
    support: Tensor | None = None
    states: Tensor | None = None

    @cached_property
    def probs(self) -> Tensor:
        if self.support is None:
            return self.sampled
        rows, vocab = self.sampled.shape[0], self.stages[-1].vocab
        return self.sampled.new_zeros(rows, vocab).scatter_(-1, self.support, self.sampled)

    @property
    def raw(self) -> Tensor:
        return self.stages[0].logits

    @property
    def penalised(self) -> Stage:
        """The stage after the biases, bans and penalties, before the temperature: it ranks the
        alternatives a greedy step discarded."""
        names = self.names
        at = next((i for i, name in enumerate(names) if name == "greedy" or name in SAMPLER_ORDER), len(names))
        return self.stages[at - 1]

    @property
    def final(self) -> Tensor:
        return self.stages[-1].logits

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(stage.name for stage in self.stages)

    @property
    def is_greedy(self) -> bool:
        """The distribution is its one surviving token (greedy is the last stage)."""
        return self.stages[-1].name == "greedy"

    def prob_of(self, ids: Tensor) -> Tensor:
        """The sampled probability of ``ids`` ``[batch, n]``: a gather, or over the support (its ids
        ascending) each id looked up among the candidates (0 for an id outside them)."""
        if self.support is None:
            return self.sampled.gather(-1, ids)
        at = torch.searchsorted(self.support, ids.contiguous()).clamp_(max=self.support.shape[-1] - 1)
        found = self.support.gather(-1, at) == ids
        return torch.where(found, self.sampled.gather(-1, at), self.sampled.new_zeros(()))

    def draw(self, generator: torch.Generator | Sequence[torch.Generator] | None) -> Tensor:
        """The sampled token per row (see :func:`draw`). A greedy chain's distribution is its one
        surviving token, so that is read off without a cumulative sum or a random number. Over a
        support the draw walks the candidates in id order, as it would walk the whole row; a CPU's
        few candidates are walked on the host (:func:`llmsample.sampling.drawing.host_indices`, the same index)."""
        if self.is_greedy:
            return self.support[:, 0] if self.support is not None else filters.first_argmax(self.final).squeeze(-1)
        if (
            self.support is not None
            and self.support.shape[-1] <= HOST_WIDTH
            and filters.host_syncs_are_free(self.sampled)
        ):
            u = uniforms(self.sampled, generator)
            picked = host_indices(self.host_sampled, u.view(-1).tolist())
            if picked is not None:
                return torch.tensor([ids[i] for ids, i in zip(self.host_support, picked, strict=True)])
            index = draw_with(self.sampled, u)
        else:
            index = draw(self.sampled, generator)
        return index if self.support is None else self.support.gather(-1, index.unsqueeze(-1)).squeeze(-1)

    @cached_property
    def host_sampled(self) -> list[list[float]]:
        """``sampled`` on the host (a CPU's few candidates: read once for the draw and the figures)."""
        return self.sampled.tolist()

    @cached_property
    def host_support(self) -> list[list[int]]:
        """``support`` on the host, as :attr:`host_sampled`."""
        assert self.support is not None
        return self.support.tolist()

    def rows(self, index: slice | int) -> Chain:
        """Some rows of every stage (an int keeps a batch of one)."""
        index = slice(index, index + 1) if isinstance(index, int) else index
        support = None if self.support is None else self.support[index]
        states = None if self.states is None else self.states[index]
        return Chain(tuple(s.rows(index) for s in self.stages), self.sampled[index], support, states)

    def state_after(self, tokens: Tensor, cfg: SamplingConfig) -> Tensor | None:
        """Each row's carried state after drawing ``tokens`` ``[rows]`` there (None: no carried stage)."""
        if self.states is None:
            return None
        before, last = self.stages[-2], self.stages[-1]
        return carried.observe(last.name, self.states, before.values, last.values, last.ids, tokens, cfg)


def sampler_chain(logits: Tensor, history: TokenHistory, cfg: SamplingConfig, values: RowValues | None = None) -> Chain:
    """``raw, [logit_bias, ban, min_tokens,] penalties, [dry,] [constraint,] temperature, [top_n_sigma,]
    top_k, top_p, [typical_p,] min_p[, xtc]`` — or ``raw, [...,] penalties, [dry,] [constraint,] greedy`` — over
    ``[batch, vocab]`` logits (bracketed stages only when on: :func:`chain_of`). What is sampled is
    the last stage's softmax, or with XTC the mixture of its two branches.

    On a CPU, greedy hands on its one token and top-k its k candidates (:class:`Stage`), and so does
    the first of top-n-sigma, top-p, typical-p and min-p that leaves at most an eighth of the
    vocabulary: what follows them are all filters of a distribution, which give the same answer on
    the candidates as on a row where every other token is ``-inf``, at a fraction of the passes
    over a 49k vocabulary. ``values``: the rows' own temperatures, top-p and min-p
    (:class:`RowValues`), when they differ."""
    logits = filters.float32(logits)
    vocab = logits.shape[-1]
    stages = [Stage("raw", logits)]
    ids: Tensor | None = None
    states: Tensor | None = None
    infos = chain_of(cfg)
    names = [info.name for info in infos]
    for at, info in enumerate(infos[1:], 1):
        scaled = (
            _scaled_top_k(logits, cfg, values, stages[0] if logits is stages[0].values else None)
            if ids is None
            and names[at : at + 2] == ["temperature", "top_k"]
            and not cfg.has_dynatemp
            and compacts(logits, cfg.top_k)
            else None
        )
        if scaled is not None:  # the temperature on top-k's candidates; the row when something reads it
            whole = functools.partial(_stage, "temperature", logits, history, cfg, values)
            logits, ids = scaled
            stages.append(Stage(info.name, logits, ids, vocab, whole))
            continue
        masking = None
        if ids is None and info.name == "greedy" and compacts(logits, 1):
            # the one token keep_argmax keeps, from the block maxima the figures rank it among
            ids = filters.first_argmax(logits, stages[-1].maxima if blocks.blocks_pay(logits, 1) else None)
            logits = logits.gather(-1, ids)
        elif ids is None and info.name in MASKS:
            index = mask_index(MASKS[info.name](history, cfg), logits.device)
            if index is not None:
                masking = Masking(*index, stages[-1])
                logits = logits.index_put(index, filters.removed(logits.device))
        elif ids is None and info.name == "top_k" and compacts(logits, cfg.top_k):
            logits, ids = filters.top_k_candidates(logits, cfg.top_k)
        elif ids is None and info.name == "top_p" and compacts(logits, 1):  # ranks its own candidates
            logits, ids = filters.top_p_kept(logits, cfg.top_p if values is None else values.top_p, vocab // 8)
        elif info.carries:
            logits, states = _carried(info.name, logits, ids, vocab, history, cfg)
        else:
            logits = _stage(info.name, logits, history, cfg, values)
            if ids is None and info.name in NARROWING and compacts(logits, 1):
                narrowed = filters.kept_candidates(logits, logits.shape[-1] // 8)
                if narrowed is not None:
                    logits, ids = narrowed
        stages.append(Stage(info.name, logits, ids, vocab, masking=masking))
    if stages[-1].name == "xtc":
        return Chain(tuple(stages), xtc_mixture(stages[-2].values, logits, cfg.xtc_probability), ids)
    return Chain(tuple(stages), logits.softmax(-1), ids, states)


def _stage(name: str, logits: Tensor, history: TokenHistory, cfg: SamplingConfig, values: RowValues | None) -> Tensor:
    """Stage ``name`` over ``logits``: with the rows' own values where it reads them (a dynamic
    temperature reads each row's own config: its entropy is the row's)."""
    if values is not None and name in PER_ROW and not (name == "temperature" and cfg.has_dynatemp):
        return PER_ROW[name](logits, values)
    return APPLY[name](logits, history, cfg)


def _scaled_top_k(
    logits: Tensor, cfg: SamplingConfig, values: RowValues | None, raw: Stage | None
) -> tuple[Tensor, Tensor] | None:
    """The temperature stage on the tokens top-k keeps after it, ``(values, ids)`` in ascending id
    order, from one ranking of the row before it: dividing by a positive temperature keeps the
    order, so the k + 1 largest before it are the k + 1 largest after it, and when the k-th of them
    stays strictly above the next one (no tie made by the division straddles the cut, no NaN) the
    first k are top-k's set, each with the value the whole row's division gives it. None
    otherwise (then the whole row), and when the division overflowed or met +inf or NaN (then the
    stage clamps). Saves the division and range check over the vocabulary and top-k's own
    ranking. ``raw``: the raw stage when ``logits`` are its values (its ranking serves the step's
    figures too)."""
    k = cfg.top_k
    top, order = blocks.top(logits, k + 1) if raw is None else raw.top(k + 1)
    if top.shape[-1] > k + 1:  # a wider ranking (the step's top list's); a slice of all of it is still a call
        top, order = top[..., : k + 1], order[..., : k + 1]
    scaled = top / (cfg.temperature if values is None else values.temperature)
    # Read on the host (a CPU's: the chain narrows only there), two calls for the checks' dozen.
    # Where the division made nothing but finite values (and -inf from -inf), the temperature
    # stage's clamp (keep_finite) has nothing to do: the division is what the stage computes.
    if not all(
        row[k - 1] > row[k] and all(math.isfinite(v) or v == b == -math.inf for v, b in zip(row, before, strict=True))
        for row, before in zip(scaled.tolist(), top.tolist(), strict=True)
    ):
        return None
    ids, at = order[..., :k].sort(-1)
    return scaled[..., :k].gather(-1, at), ids


NARROWING = frozenset({"top_n_sigma", "top_p", "typical_p", "epsilon", "eta", "top_h", "top_a", "p_less", "min_p"})
"""The filters after the temperature that usually leave a few candidates: after the first of
them that does, the chain goes on on its candidates (the stages after it are all filters of a
distribution)."""


def compacts(logits: Tensor, k: int) -> bool:
    """Whether a stage that keeps ``k`` tokens hands them on: on a CPU (the candidates' set is
    exact only after a host check), when k is a small part of the vocabulary."""
    return 0 < k <= logits.shape[-1] // 8 and filters.host_syncs_are_free(logits)


def sampling_probs(logits: Tensor, history: TokenHistory, cfg: SamplingConfig) -> Tensor:
    """The distribution a token is drawn from; the one function draft and target share."""
    return sampler_chain(logits, history, cfg).probs


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
