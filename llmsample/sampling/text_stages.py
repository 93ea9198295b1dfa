"""The text-aware stages of the sampler chain: logit biases, bans, min-tokens, no-repeat-ngram and DRY, which
read the tokenizer's texts and each row's token sequence (kept in the :class:`TokenHistory`).
They come before the temperature, as in transformers' processors and llama.cpp's default chain;
no function edits its input in place, and a removed token has logit ``-inf``."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from llmsample.sampling import blocks
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.filters import keep_finite, removed
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.vocabulary import Vocabulary, ban_table, bias_vector, breaker_ids, dry_penalties


def _vocabulary(history: TokenHistory, stage: str) -> Vocabulary:
    if history.vocabulary is None:
        raise ValueError(f"the {stage} stage needs a history built with the tokenizer's vocabulary")
    return history.vocabulary


def _sequences(history: TokenHistory, stage: str) -> tuple[tuple[int, ...], ...]:
    if history.sequences is None:
        raise ValueError(f"the {stage} stage needs a history that keeps the token sequences")
    return history.sequences


def _on(device: torch.device, values: list[int] | list[float], dtype: torch.dtype) -> Tensor:
    """Host values onto the logits' device: a copy to the device, never a read back."""
    tensor = torch.tensor(values, dtype=dtype)
    return tensor if device.type == "cpu" else tensor.to(device, non_blocking=True)


def mask_tokens(logits: Tensor, banned: list[set[int]] | list[frozenset[int]]) -> Tensor:
    """``-inf`` for ``banned[row]`` in each row. A row left with nothing stays so, never lifted:
    the step's figures count no candidate and the emitter ends that row with an error."""
    index = mask_index(banned, logits.device)
    return logits if index is None else logits.index_put(index, removed(logits.device))


def mask_index(banned: list[set[int]] | list[frozenset[int]], device: torch.device) -> tuple[Tensor, Tensor] | None:
    """``(rows, ids)``: each banned token once, as an index into ``[batch, vocab]`` (None: nothing banned)."""
    rows = [r for r, tokens in enumerate(banned) for _ in tokens]
    if not rows:
        return None
    cols = [t for tokens in banned for t in tokens]
    return _on(device, rows, torch.long), _on(device, cols, torch.long)


class Row(Protocol):
    """What a mask reads of the stage before it (a chain's :class:`~llmsample.sampling.pipeline.Stage`)."""

    @property
    def values(self) -> Tensor: ...

    @property
    def maxima(self) -> Tensor: ...


@dataclass(frozen=True)
class Masking:
    """What a mask stage (ban, min-tokens, no-repeat-ngram) set to ``-inf``: ``rows`` and ``ids``,
    each pair once, over ``before``, the stage it masked. A handful of tokens, so what the step
    reads of the whole masked row (its kept count, its block maxima) is that of the row before it,
    mended at those tokens: no pass over a 49k row of its own (two such passes were a quarter of
    a 16-row step's host time)."""

    rows: Tensor
    ids: Tensor
    before: Row

    def kept(self, before: Tensor | float) -> Tensor:
        """Per row, the tokens the mask keeps, given ``before`` (the tokens kept before it:
        :func:`~llmsample.sampling.filters.kept_count`'s, or the vocabulary as a float)."""
        values = self.before.values
        # a NaN is kept, as kept_count counts it (everything but -inf)
        finite = (values[self.rows, self.ids] != -math.inf).to(torch.int32)
        gone = torch.zeros(values.shape[0], dtype=torch.int32, device=values.device).index_add_(0, self.rows, finite)
        return (int(before) if isinstance(before, float) else before) - gone

    def maxima(self, values: Tensor) -> Tensor:
        """:func:`~llmsample.sampling.blocks.block_maxima` of the masked ``values``: the row before's,
        with the blocks that hold a masked token taken again."""
        where = (self.rows, torch.div(self.ids, blocks.BLOCK, rounding_mode="floor"))
        again = values.view(values.shape[0], -1, blocks.BLOCK)[where].amax(-1)
        return self.before.maxima.index_put(where, again)


def apply_logit_bias(logits: Tensor, history: TokenHistory, cfg: SamplingConfig) -> Tensor:
    """OpenAI's ``logit_bias``: a fixed number added to chosen tokens' logits."""
    if not cfg.logit_bias:
        return logits
    bias = bias_vector(_vocabulary(history, "logit_bias"), cfg.logit_bias)
    if logits.device.type != "cpu":
        bias = _device_bias(bias, logits.device)
    # |bias| <= 100 is far below a float32 ulp near its largest value: the sum cannot overflow
    return logits + bias


@functools.lru_cache(maxsize=16)
def _device_bias(bias: Tensor, device: torch.device) -> Tensor:
    return bias.to(device)


def mask_banned(logits: Tensor, history: TokenHistory, cfg: SamplingConfig) -> Tensor:
    """``--ban``: every candidate whose text would complete a banned string, given the text
    generated so far (the banned string may start in earlier tokens), is removed."""
    return mask_tokens(logits, banned_ids(history, cfg))


def banned_ids(history: TokenHistory, cfg: SamplingConfig) -> list[frozenset[int]]:
    """Per row, the tokens :func:`mask_banned` removes (none when ``--ban`` is off)."""
    if not cfg.ban:
        return []
    vocabulary, sequences = _vocabulary(history, "ban"), _sequences(history, "ban")
    table = ban_table(vocabulary, cfg.ban)
    tails = (vocabulary.generated_text_tail(history.generated(row), table.longest - 1) for row in range(len(sequences)))
    return [table.banned(text) for text in tails]


def mask_early_end(logits: Tensor, history: TokenHistory, cfg: SamplingConfig) -> Tensor:
    """``--min-tokens``: before the N-th generated token no EOS id, and no token that would
    complete a stop string."""
    return mask_tokens(logits, early_end_ids(history, cfg))


def early_end_ids(history: TokenHistory, cfg: SamplingConfig) -> list[set[int]]:
    """Per row, the tokens :func:`mask_early_end` removes (none when ``--min-tokens`` is off)."""
    if cfg.min_tokens <= 0:
        return []
    vocabulary, sequences = _vocabulary(history, "min_tokens"), _sequences(history, "min_tokens")
    stops = ban_table(vocabulary, cfg.stop) if cfg.stop else None
    banned: list[set[int]] = []
    for row in range(len(sequences)):
        generated = history.generated(row)
        tokens: set[int] = set()
        if len(generated) < cfg.min_tokens:
            tokens.update(vocabulary.eos_ids)
            if stops is not None:
                tokens |= stops.banned(vocabulary.generated_text_tail(generated, stops.longest - 1))
        banned.append(tokens)
    return banned


def apply_dry(logits: Tensor, history: TokenHistory, cfg: SamplingConfig) -> Tensor:
    """DRY over each row's prompt and generated tokens (see :func:`dry_penalties`)."""
    if not cfg.has_dry:
        return logits
    sequences = _sequences(history, "dry")
    breakers = breaker_ids(_vocabulary(history, "dry"), cfg.dry_sequence_breakers)
    rows: list[int] = []
    cols: list[int] = []
    values: list[float] = []
    for row, sequence in enumerate(sequences):
        penalties = dry_penalties(
            sequence, cfg.dry_multiplier, cfg.dry_base, cfg.dry_allowed_length, breakers, cfg.dry_penalty_last_n
        )
        rows += [row] * len(penalties)
        cols += list(penalties)
        values += [-v for v in penalties.values()]
    if not rows:
        return logits
    device = logits.device
    index = (_on(device, rows, torch.long), _on(device, cols, torch.long))
    return keep_finite(logits.index_put(index, _on(device, values, torch.float32), accumulate=True), logits)


def apply_constraint(logits: Tensor, history: TokenHistory, cfg: SamplingConfig) -> Tensor:
    """``--json-schema``, ``--regex``, ...: only the tokens the row's grammar state allows (EOS where
    the grammar accepts). Before the temperature and every truncation filter, so top-k, top-p and
    min-p choose among allowed tokens and the draw is from the renormalised constrained
    distribution. A row left with nothing stays all ``-inf``; the emitter names the stages."""
    if cfg.constraint is None:
        return logits
    if history.allowed is None:
        raise ValueError("the constraint stage needs a history with each row's allowed tokens")
    allowed = history.allowed
    if allowed.device != logits.device:
        allowed = allowed.to(logits.device, non_blocking=True)
    return logits.masked_fill(~allowed, -math.inf)


def mask_repeated_ngrams(logits: Tensor, history: TokenHistory, cfg: SamplingConfig) -> Tensor:
    """transformers' ``no_repeat_ngram_size``: remove every token that would complete an n-gram
    already in the row's sequence (prompt and generated, as transformers reads a decoder's
    ``input_ids``); n = 1 removes every token seen."""
    return mask_tokens(logits, repeated_ngram_ids(history, cfg))


def repeated_ngram_ids(history: TokenHistory, cfg: SamplingConfig) -> list[set[int]]:
    """Per row, the tokens :func:`mask_repeated_ngrams` removes (none when it is off)."""
    n = cfg.no_repeat_ngram_size
    if n <= 0:
        return []
    return [ngram_completions(row, n) for row in _sequences(history, "no_repeat_ngram")]


MASKS = {"ban": banned_ids, "min_tokens": early_end_ids, "no_repeat_ngram": repeated_ngram_ids}
"""The stages that set a few tokens to ``-inf`` and change nothing else: each one's tokens per row
(the chain keeps them as the stage's :class:`Masking`)."""


def ngram_completions(sequence: tuple[int, ...], n: int) -> set[int]:
    """The tokens that follow, somewhere in ``sequence``, the n - 1 tokens it ends with."""
    start = len(sequence) - n + 1
    if start < 0:
        return set()
    prefix = sequence[start:]
    return {sequence[i + n - 1] for i in range(start) if sequence[i : i + n - 1] == prefix}
