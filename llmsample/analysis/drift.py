"""Model against model: how far B's next-token distributions drift from A's along one text.

Both models score the same tokens by teacher forcing (:func:`llmsample.engine.forcing.forced_logits`,
as :func:`llmsample.analysis.explain.score_continuation` does), and
:func:`divergence` compares the two raw distributions position by position."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from llmsample.analysis.drift_records import DriftSummary, DriftToken, TopToken, summarize
from llmsample.engine.emitter import check_finite
from llmsample.engine.forcing import forced_logits
from llmsample.engine.text_stream import Detokenizer
from llmsample.errors import UserError
from llmsample.models.loading import LoadedModel

CHUNK_ROWS = 64  # positions per step: bounds the float64 temporaries at 64 x vocab


@dataclass(frozen=True)
class Divergence:
    """Per position (each ``[positions]``), on the shared vocabulary ``vocab``."""

    vocab: int
    kl: Tensor  # KL(A‖B) = Σ_x p_A(x) (ln p_A(x) − ln p_B(x)), nats
    acceptance: Tensor  # Σ_x min(p_A(x), p_B(x)) = 1 − TV(A, B)
    top_a: Tensor  # argmax of A (first index on ties)
    top_b: Tensor
    top_prob_a: Tensor  # p_A(top_a)
    top_prob_b: Tensor  # p_B(top_b)
    prob_a: Tensor | None  # p_A(tokens[i]), when tokens were given (0 outside the shared vocabulary)
    prob_b: Tensor | None


def _work_dtype(device: torch.device) -> torch.dtype:
    """float64, so KL of near-identical models is not rounding noise; MPS has no float64."""
    return torch.float32 if device.type == "mps" else torch.float64


def divergence(logits_a: Tensor, logits_b: Tensor, tokens: Tensor | None = None) -> Divergence:
    """Compare two models' raw next-token logits ``[positions, vocab]`` row by row.

    Embeddings padded to different sizes are compared on the shared vocabulary, the first
    ``min(V_A, V_B)`` ids, each distribution renormalised there (padding rows carry no tokens).
    ``tokens`` ``[positions]``: the token actually at each position, whose probabilities are
    returned too. Pure: no model, no state."""
    if logits_a.ndim != 2 or logits_b.ndim != 2 or logits_a.shape[0] != logits_b.shape[0]:
        raise ValueError(
            f"expected [positions, vocab] logits with equal positions, got {logits_a.shape} and {logits_b.shape}"
        )
    vocab = min(logits_a.shape[-1], logits_b.shape[-1])
    dtype = _work_dtype(logits_a.device)
    parts: dict[str, list[Tensor]] = {k: [] for k in ("kl", "acc", "ta", "tb", "pta", "ptb", "pa", "pb")}
    for start in range(0, logits_a.shape[0], CHUNK_ROWS):
        rows = slice(start, start + CHUNK_ROWS)
        log_a = logits_a[rows, :vocab].to(dtype).log_softmax(-1)
        log_b = logits_b[rows, :vocab].to(device=logits_a.device, dtype=dtype).log_softmax(-1)
        p_a, p_b = log_a.exp(), log_b.exp()
        # 0 · ln 0 = 0: a token A never picks adds nothing, even where B gives it -inf.
        terms = torch.where(p_a > 0, p_a * (log_a - log_b), torch.zeros_like(p_a))
        parts["kl"].append(terms.sum(-1).clamp_min(0))  # ≥ 0 exactly; rounding can leave -1e-17
        parts["acc"].append(torch.minimum(p_a, p_b).sum(-1).clamp(0, 1))
        top_pa, top_a = p_a.max(-1)
        top_pb, top_b = p_b.max(-1)
        parts["ta"].append(top_a)
        parts["tb"].append(top_b)
        parts["pta"].append(top_pa)
        parts["ptb"].append(top_pb)
        if tokens is not None:
            chosen = tokens[rows].to(logits_a.device).long()
            inside = chosen < vocab
            index = chosen.clamp_max(vocab - 1)[:, None]
            zero = torch.zeros((), dtype=dtype, device=p_a.device)
            parts["pa"].append(torch.where(inside, p_a.gather(-1, index)[:, 0], zero))
            parts["pb"].append(torch.where(inside, p_b.gather(-1, index)[:, 0], zero))

    def joined(key: str) -> Tensor:
        if parts[key]:
            return torch.cat(parts[key])
        return torch.zeros(0, dtype=torch.long if key in ("ta", "tb") else dtype, device=logits_a.device)

    return Divergence(
        vocab=vocab,
        kl=joined("kl"),
        acceptance=joined("acc"),
        top_a=joined("ta"),
        top_b=joined("tb"),
        top_prob_a=joined("pta"),
        top_prob_b=joined("ptb"),
        prob_a=joined("pa") if tokens is not None else None,
        prob_b=joined("pb") if tokens is not None else None,
    )


def teacher_forced_logits(lm: LoadedModel, prompt_ids: Tensor, continuation: Sequence[int]) -> Tensor:
    """Raw logits ``[len(continuation), vocab]``: row i is the model's next-token logits after the
    prompt and the continuation's first i tokens (the last token, which no row conditions on, is
    not fed), on whichever backend ``lm`` runs."""
    logits = forced_logits(lm, prompt_ids[0].tolist(), continuation[:-1])
    check_finite(logits, prompt_ids.shape[1])
    return logits


def input_vocab(lm: LoadedModel) -> int:
    """How many token ids the model can be fed: its embedding's rows (``config.vocab_size`` for a
    model without the usual embedding)."""
    try:
        embedding = lm.model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        embedding = None
    rows = getattr(embedding, "num_embeddings", None)
    return int(rows) if rows else int(lm.model.config.vocab_size)


def scorable(
    lm_a: LoadedModel, lm_b: LoadedModel, prompt_ids: Tensor, continuation: Sequence[int]
) -> tuple[Sequence[int], str | None]:
    """The part of ``continuation`` both models can score, and a note when that is not all of it.

    Models whose embeddings differ in size (a padded vocabulary) share only the smaller one's ids.
    A continuation token outside it (A sampled a padding id B lacks) is still scored at its own
    position, whose distributions need only the tokens before it, but nothing after it is: no
    model can be fed an id its embedding does not have. A prompt token outside it is one line."""
    sizes = {lm.name: input_vocab(lm) for lm in (lm_a, lm_b)}
    smaller = min(sizes, key=lambda name: sizes[name])
    limit = sizes[smaller]
    prompt = prompt_ids[0].tolist()
    outside = next((t for t in prompt if t >= limit), None)
    if outside is not None:
        raise UserError(
            f"the prompt holds token id {outside}, which {smaller!r} lacks (its vocabulary has {limit} ids); "
            "compare-models needs a prompt both models can read"
        )
    cut = next((i for i, t in enumerate(continuation) if t >= limit), None)
    if cut is None or cut == len(continuation) - 1:
        return continuation, None
    note = (
        f"token {cut} of the continuation is id {continuation[cut]}, outside {smaller!r}'s vocabulary of {limit} "
        f"ids; scored over the shared ids up to it: the first {cut + 1} of {len(continuation)} tokens"
    )
    return continuation[: cut + 1], note


def check_fits(lms: Sequence[LoadedModel], total: int) -> None:
    for lm in lms:
        if lm.context_length and total > lm.context_length:
            raise UserError(
                f"prompt + continuation are {total} tokens but {lm.name} has a context of {lm.context_length}; "
                "shorten them"
            )


def model_drift(
    lm_a: LoadedModel,
    lm_b: LoadedModel,
    prompt_ids: Tensor,
    continuation: Sequence[int],
    *,
    source: str,
    extra: dict[str, Any] | None = None,
) -> tuple[list[DriftToken], DriftSummary]:
    """Score ``continuation`` after ``prompt_ids`` under both models (teacher forcing) and compare
    them at every position. The models must share a tokenizer (checked by the caller). Tokens
    past one that a model's vocabulary lacks are left out (see :func:`scorable`): the summary's
    ``unscored_tokens`` counts them."""
    if not continuation:
        raise UserError("nothing to compare: the continuation has no tokens")
    scored, note = scorable(lm_a, lm_b, prompt_ids, continuation)
    if note is not None:
        extra = {**(extra or {}), "unscored_tokens": len(continuation) - len(scored)}
        continuation = scored
    check_fits((lm_a, lm_b), prompt_ids.shape[1] + len(continuation))
    logits_a = teacher_forced_logits(lm_a, prompt_ids, continuation)
    logits_b = logits_a if lm_b is lm_a else teacher_forced_logits(lm_b, prompt_ids, continuation)
    found = divergence(logits_a, logits_b, torch.tensor(list(continuation)))
    assert found.prob_a is not None and found.prob_b is not None
    tokenizer = lm_a.tokenizer
    detok = Detokenizer(tokenizer, prompt_ids[0].tolist())
    texts = [detok.push(token) for token in continuation]
    texts[-1] += detok.flush()
    columns = [
        t.tolist()
        for t in (found.kl, found.top_a, found.top_b, found.top_prob_a, found.top_prob_b, found.prob_a, found.prob_b)
    ]
    names: dict[int, str] = {}

    def name(token: int) -> str:
        if token not in names:
            names[token] = tokenizer.decode([token], skip_special_tokens=False)
        return names[token]

    records = [
        DriftToken(
            index=i,
            token_id=int(token),
            text=texts[i],
            prob_a=pa,
            prob_b=pb,
            kl=kl,
            same_top=ta == tb,
            top_a=TopToken(ta, name(ta), pta),
            top_b=TopToken(tb, name(tb), ptb),
        )
        for i, (token, kl, ta, tb, pta, ptb, pa, pb) in enumerate(zip(continuation, *columns, strict=True))
    ]
    summary = summarize(
        records,
        found.acceptance.tolist(),
        model_a=lm_a.name,
        model_b=lm_b.name,
        source=source,
        prompt_tokens=prompt_ids.shape[1],
        vocab=found.vocab,
        extra=extra,
    )
    return records, summary
