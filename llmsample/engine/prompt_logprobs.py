"""A prompt's own log probabilities: each of its tokens scored by the model given the tokens
before it, teacher-forced through the seam (:func:`llmsample.engine.forcing.forced_logits`), so
every backend that decodes also scores. What ``/v1/completions`` answers for ``echo`` with
``logprobs`` (lm-evaluation-harness's log-likelihoods, vLLM's ``prompt_logprobs``), and a batch
line's the same. The figures are the raw model's (temperature 1, no penalties or filters), as
the generated tokens' ``logprobs`` are."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from llmsample.engine.forcing import forced_logits
from llmsample.engine.text_stream import Detokenizer
from llmsample.errors import RuntimeFailure
from llmsample.events import PromptLogprobs
from llmsample.models.loading import LoadedModel

ROWS_AT_ONCE = 256
"""Positions normalised at a time, in place: a long prompt over a large vocabulary holds one
copy of its logits, not two (a 2,000-token prompt over 150,000 tokens is 1.2 GB in float32)."""


def prompt_logprobs(lm: LoadedModel, ids: Sequence[int], top_n: int) -> PromptLogprobs:
    """``ids`` scored in one teacher-forced pass (row i of the pass predicts token i + 1), with
    ``top_n`` alternatives per position. Logits that are not numbers are a
    :class:`~llmsample.errors.RuntimeFailure`, never a NaN in an answer."""
    ids = list(ids)
    logprobs: list[float | None] = [None]
    ranks: list[int | None] = [None]
    top: list[tuple[tuple[int, str, float], ...]] = [()]
    if len(ids) > 1:
        # The whole text verified in one pass (a copy of its own); the row after the last token is not needed.
        scores = forced_logits(lm, ids[:1], ids[1:])[:-1]
        for start in range(0, scores.shape[0], ROWS_AT_ONCE):
            block = scores[start : start + ROWS_AT_ONCE]
            block -= block.logsumexp(-1, keepdim=True)
        if scores.isnan().any():
            raise RuntimeFailure("the model's logits over the prompt are not numbers (NaN); try --dtype float32")
        target = torch.tensor(ids[1:], device=scores.device)[:, None]
        chosen = scores.gather(1, target)
        logprobs += chosen[:, 0].tolist()
        ranks += ((scores > chosen).sum(-1) + 1).tolist()
        values, indices = scores.topk(min(top_n, scores.shape[-1]), -1)
        for token, logprob, row_ids, row_values in zip(ids[1:], logprobs[1:], indices.tolist(), values.tolist(),
                                                       strict=True):  # fmt: skip
            if token not in row_ids:  # the token itself too, as OpenAI and vLLM list it
                row_ids, row_values = [*row_ids, token], [*row_values, logprob]
            top.append(tuple((i, lm.token_text(i), v) for i, v in zip(row_ids, row_values, strict=True)))
    return PromptLogprobs(tuple(ids), _texts(lm, ids), tuple(logprobs), tuple(ranks), tuple(top))


def _texts(lm: LoadedModel, ids: list[int]) -> tuple[str, ...]:
    """Each token's share of the prompt's text, decoded as the loop decodes what it writes (a
    character split across tokens comes whole with its last token, the one before it ``""``)."""
    stream = Detokenizer(lm.tokenizer)
    texts = [stream.push(token) for token in ids]
    if texts:
        texts[-1] += stream.flush()
    return tuple(texts)
