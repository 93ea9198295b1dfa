"""``--reasoning-budget N``: after N tokens inside the thinking block (``<think>`` ... ``</think>``)
the block is closed by forcing its closing text, one token a step (every other token ``-inf``).

A stage of the sampler chain that reads only the row's token sequence, so it holds wherever the
chain runs: a speculative verifier checks each drafted token against the forced one, and a
rolled-back row (its sequence shorter again) is forced again from where it stands. The emitter
names a token this stage chose alone ``source: "forced"`` in the records."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from torch import Tensor

from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.tool_grammar import Reasoning
from llmsample.sampling.vocabulary import Vocabulary

BLOCK = Reasoning()
"""The block's texts (the ones :func:`llmsample.sampling.tool_grammar.reasoning_of` reads in templates)."""


@functools.lru_cache(maxsize=16)
def closing_ids(vocabulary: Vocabulary) -> tuple[int, ...]:
    """The closing text's tokens, as the tokenizer writes it after thinking text."""
    return tuple(vocabulary.tokenizer(BLOCK.close, add_special_tokens=False)["input_ids"])


def forced_token(vocabulary: Vocabulary, prompt: Sequence[int], generated: Sequence[int], budget: int) -> int | None:
    """The token the budget forces next in a row (None: the row is free): the block is open (the
    prompt opened it, or the answer did first), ``budget`` tokens have gone into it, and the
    model did not close it within them."""
    texts = vocabulary.texts
    prompt_text = vocabulary.generated_text_tail(prompt, len(BLOCK.open) + 8)
    start = 0 if prompt_text.rstrip().endswith(BLOCK.open) else _opened_at(texts, generated)
    if start is None:
        return None
    thinking = generated[start:]
    if len(thinking) < budget:
        return None
    if BLOCK.close in "".join(texts[t] if 0 <= t < vocabulary.size else "" for t in thinking[:budget]):
        return None  # closed in time
    close, forced = closing_ids(vocabulary), thinking[budget:]
    if len(forced) >= len(close) or tuple(forced) != close[: len(forced)]:
        return None  # closed (by force), or written past the budget by someone else: free
    return close[len(forced)]


def _opened_at(texts: Sequence[str], generated: Sequence[int]) -> int | None:
    """How many tokens of the answer it took to open the block (None: it has not, or cannot now)."""
    text = ""
    for count, token in enumerate(generated, 1):
        text += texts[token] if 0 <= token < len(texts) else ""
        stripped = text.lstrip()
        if stripped.startswith(BLOCK.open):
            return count
        if not BLOCK.open.startswith(stripped):
            return None
    return None


def force_block_close(logits: Tensor, history: TokenHistory, cfg: SamplingConfig) -> Tensor:
    """Each row at its budget keeps only the closing text's next token (its logit as it was)."""
    if cfg.reasoning_budget <= 0:
        return logits
    if history.vocabulary is None or history.sequences is None or history.prompt_lengths is None:
        raise ValueError("the reasoning_budget stage needs a history with sequences and the vocabulary")
    forced = []
    for row, sequence in enumerate(history.sequences):
        prompt = sequence[: history.prompt_lengths[row]]
        token = forced_token(history.vocabulary, prompt, history.generated(row), cfg.reasoning_budget)
        if token is not None:
            forced.append((row, token))
    if not forced:
        return logits
    out = logits.clone()
    for row, token in forced:
        kept = out[row, token].clone()
        out[row] = -math.inf
        out[row, token] = kept
    return out


