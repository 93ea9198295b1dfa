"""Why a token: the sampler chain stage by stage for the next token, and teacher-forced scoring
of a given continuation. Both run the pipeline's own functions, never a copy of them, and
:func:`explain_prompt` is what ``explain`` runs from its own words, in its process or on a warm
engine (the records are :mod:`llmsample.analysis.explain_records`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from llmsample.analysis.explain_records import Answer, ChainReport, ScoredToken, StageCandidate
from llmsample.engine.emitter import raise_nothing_left
from llmsample.engine.forcing import forced_logits
from llmsample.jobs import Explanation
from llmsample.models.loading import LoadedModel
from llmsample.sampling import blocks
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import Chain, entropy_bits, sampler_chain


def check_candidates(chain: Chain, first_index: int, first_position: int) -> None:
    """Every row must keep a candidate: bans (with min-tokens) that remove them all are one line
    (exit 1), as in generation, never a distribution of NaNs."""
    kept = torch.stack([(stage.logits != -torch.inf).sum(-1) for stage in chain.stages], -1).tolist()
    for row, counts in enumerate(kept):
        if counts[-1] == 0:
            removed = {name: counts[i - 1] - counts[i] for i, name in enumerate(chain.names) if i}
            raise_nothing_left(removed, first_index + row, first_position + row)


def _removed_by(chain: Chain, row: int, token: int) -> str | None:
    for stage in chain.stages:
        if not torch.isfinite(stage.logits[row, token]):
            return stage.name
    return None


def chain_report(
    logits: Tensor,
    history: TokenHistory,
    cfg: SamplingConfig,
    tokenizer: Any,
    top_n: int = 10,
    watch: Sequence[int] = (),
) -> ChainReport:
    """``logits``: raw next-token logits ``[1, vocab]``; ``watch``: token ids shown after the top
    candidates when they are not among them (``--watch``)."""
    chain = sampler_chain(logits, history, cfg)
    check_candidates(chain, 0, history.prompt_lengths[0] if history.prompt_lengths else 0)
    probs = {stage.name: stage.logits[0].softmax(-1) for stage in chain.stages}
    if "xtc" in probs:  # XTC fires at random: what is sampled after it is the mixture
        probs["xtc"] = chain.probs[0]
    # Ranked as the events' top lists are (ties among them in the same order).
    raw_top = blocks.top(chain.raw[:1], top_n)[1][0].tolist()
    final_top = [t for t in blocks.top(chain.final[:1], top_n)[1][0].tolist() if chain.probs[0, t] > 0]
    ids = list(dict.fromkeys(final_top + raw_top))[:top_n]
    ids += [t for t in dict.fromkeys(watch) if t not in ids]
    candidates = [
        StageCandidate(
            token_id=t,
            text=tokenizer.decode([t], skip_special_tokens=False),
            probs={name: float(p[t]) for name, p in probs.items()},
            removed_by=_removed_by(chain, 0, t),
        )
        for t in ids
    ]
    kept = {stage.name: int(torch.isfinite(stage.logits[0]).sum()) for stage in chain.stages}
    return ChainReport(list(chain.names), candidates, kept, float(entropy_bits(chain.probs[0])))


def constrained_history(
    lm: LoadedModel, cfg: SamplingConfig, history: TokenHistory, vocab: int, tokens: Sequence[int] = ()
) -> TokenHistory:
    """With a constraint: the grammar's allowed tokens at the start and after each of ``tokens``
    (a token the grammar rejects leaves nothing allowed after it)."""
    from llmsample.engine.row_state import start_matcher

    matcher = start_matcher(lm, cfg, vocab)
    if matcher is None:
        return history
    masks = matcher.masks(tokens[: matcher.valid_prefix(tokens)])
    rows = len(tokens) + 1 - masks.shape[0]
    masks = torch.cat([masks, masks.new_zeros(rows, vocab)]) if rows else masks
    return dataclasses.replace(history, allowed=masks)


def explain_next(
    lm: LoadedModel, prompt_ids: Tensor, cfg: SamplingConfig, top_n: int = 10, watch: Sequence[int] = ()
) -> ChainReport:
    logits = forced_logits(lm, prompt_ids[0].tolist())
    history = TokenHistory.for_config(prompt_ids, logits.shape[-1], cfg, lm.tokenizer, lm.eos_ids)
    history = constrained_history(lm, cfg, history, logits.shape[-1])
    return chain_report(logits, history, cfg, lm.tokenizer, top_n, watch)


def score_continuation(
    lm: LoadedModel, prompt_ids: Tensor, continuation: list[int], cfg: SamplingConfig
) -> list[ScoredToken]:
    """Teacher forcing (:func:`forced_logits`: row i sees the continuation before token i), then
    each continuation token's probability under the raw model and under the preset (penalties
    see the tokens before it)."""
    cont = torch.tensor(continuation, device=prompt_ids.device)
    # The last token fed too (its row unused), as explain always has: the same pass, the same bits.
    logits = forced_logits(lm, prompt_ids[0].tolist(), continuation)[:-1]
    history = TokenHistory.for_config(prompt_ids, logits.shape[-1], cfg, lm.tokenizer, lm.eos_ids)
    history = history.prefixes(cont, continuation)
    history = constrained_history(lm, cfg, history, logits.shape[-1], continuation)
    chain = sampler_chain(logits, history.rows(slice(0, -1)), cfg)
    check_candidates(chain, 0, prompt_ids.shape[1])
    raw = chain.raw
    model_probs, preset_probs = raw.softmax(-1), chain.probs
    scored = []
    for i, token in enumerate(continuation):
        scored.append(
            ScoredToken(
                index=i,
                token_id=token,
                text=lm.token_text(token),
                model_prob=float(model_probs[i, token]),
                prob=float(preset_probs[i, token]),
                model_rank=int((raw[i] > raw[i, token]).sum()) + 1,
                allowed=bool(preset_probs[i, token] > 0),
                # XTC removes a token only when it fires: a token it alone removes stays possible
                removed_by=_removed_by(chain, i, token) if preset_probs[i, token] == 0 else None,
            )
        )
    return scored


def continuation_ids(lm: LoadedModel, text: str) -> list[int]:
    """``--continuation``'s tokens, as the model would write them (no special tokens)."""
    ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        from llmsample.errors import UserError

        raise UserError("--continuation is empty; give the text to score")
    return ids


def explain_prompt(
    lm: LoadedModel,
    prompt: str,
    cfg: SamplingConfig,
    *,
    system: str | None = None,
    raw: bool = False,
    truncate: str = "error",
    top_n: int = 10,
    continuation: str | None = None,
    watch: Sequence[str] = (),
) -> Answer:
    """``explain`` without ``--layers`` or ``--tree``, from the command's words: the prompt as
    ``generate`` encodes it, the next token's report (``watch``: tokens named as ``--watch``
    names them), or ``continuation`` scored. One function for both places it runs, so a warm
    engine's answer is the in-process run's to the last bit."""
    from llmsample.engine.prompt import encode_prompt
    from llmsample.sampling.vocabulary import Vocabulary, named_tokens

    watched = ()
    if watch:
        watched = named_tokens(Vocabulary.of(lm.tokenizer, lm.model.config.vocab_size, lm.eos_ids), watch, "--watch")
    prompt_ids = encode_prompt(lm, prompt, system, raw, truncate, cfg.max_tokens)
    if continuation is not None:
        return score_continuation(lm, prompt_ids, continuation_ids(lm, continuation), cfg)
    return explain_next(lm, prompt_ids, cfg, top_n, [token for _, token in watched])


def explain_reply(
    lm: LoadedModel, prompt_ids: list[int], reply: Sequence[int], cfg: SamplingConfig, top_n: int = 10,
    watch: Sequence[int] = (),
) -> ChainReport:
    """The chain at a reply's position ``len(reply)``: after its prompt and its tokens so far,
    the penalties seeing them as the reply's own draws saw them (chat's ``/explain N``)."""
    prompt = torch.tensor([prompt_ids], device=lm.device)
    logits = forced_logits(lm, [*prompt_ids, *reply])
    history = TokenHistory.for_config(prompt, logits.shape[-1], cfg, lm.tokenizer, lm.eos_ids)
    for token in reply:
        history = history.advanced(torch.tensor([token], device=lm.device), [token])
    return chain_report(logits, history, cfg, lm.tokenizer, top_n, watch)


def explain_job(lm: LoadedModel, asked: Explanation) -> Answer:
    """:func:`explain_prompt` for an engine's question, or :func:`explain_reply` for a chat's
    (its prompt built as its reply's row was: :func:`~llmsample.engine.job_row.job_row`). Its
    passes are plain whatever the engine's mode (explain has no ``--deterministic``), so an
    engine started with it answers with the same numbers as one without."""
    job = asked.job
    if asked.reply is not None:
        from llmsample.engine.job_row import job_row
        from llmsample.sampling.vocabulary import Vocabulary, named_tokens

        watched = named_tokens(Vocabulary.of(lm.tokenizer, lm.model.config.vocab_size, lm.eos_ids), asked.watch,
                               "/watch") if asked.watch else ()  # fmt: skip
        item, _ = job_row(lm, job, 0)
        return explain_reply(lm, item.prompt_ids, asked.reply, job.cfg, job.top_n, [t for _, t in watched])
    return explain_prompt(lm, job.prompt, job.cfg, system=job.system, raw=job.raw, truncate=job.truncate,
                          top_n=job.top_n, continuation=asked.continuation, watch=asked.watch)  # fmt: skip
