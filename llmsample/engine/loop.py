"""Our own autoregressive loop: prefill once, one cached forward pass per token, one event
per token, then a summary."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from llmsample.engine.runner import ModelRunner
from llmsample.engine.text_stream import TextStream
from llmsample.errors import RuntimeFailure, UserError
from llmsample.events import RunStats, StepFigures, Summary, TokenEvent, make_event, step_figures
from llmsample.models.loading import LoadedModel
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.pipeline import TokenHistory, draw, make_generator, sampler_stages


def encode_prompt(
    lm: LoadedModel, prompt: str, system: str | None = None, raw: bool = False, truncate: str = "error", room: int = 0
) -> Tensor:
    """Prompt ids ``[1, n]`` on the model's device: a chat turn through the tokenizer's own
    template when it has one, plain text for completion with ``raw``. A prompt that does not fit
    the context is an error, or loses its oldest tokens with ``truncate="left"`` (keeping ``room``
    positions free for the answer where it can)."""
    tokenizer = lm.tokenizer
    if not raw and getattr(tokenizer, "chat_template", None):
        if not prompt.strip():
            raise UserError("the prompt is empty; pass --prompt TEXT (or --raw to let the model start on its own)")
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer(prompt)["input_ids"]
        if not ids and tokenizer.bos_token_id is not None:
            ids = [tokenizer.bos_token_id]
        if not ids:
            raise UserError("the prompt is empty and this tokenizer has no BOS token to start from; pass --prompt TEXT")
    limit = lm.context_length
    if limit and len(ids) >= limit:
        if truncate != "left":
            raise UserError(
                f"the prompt is {len(ids)} tokens but {lm.name} has a context of {limit}; "
                "shorten it or pass --truncate left to drop its oldest tokens"
            )
        ids = ids[-max(limit - room, limit // 2) :]
    return torch.tensor([ids], device=lm.device)


def check_finite(logits: Tensor, position: int) -> None:
    """NaN or +inf anywhere, or nothing finite, means the forward pass broke: stop, never sample it.
    (The plain loop checks the same in its step figures, without a host sync of its own.)"""
    broken = ~(logits < math.inf) | (logits == -math.inf).all(-1, keepdim=True)
    if broken.any():
        raise_broken_logits(position)


def raise_broken_logits(position: int) -> None:
    raise RuntimeFailure(
        f"the model produced NaN/inf logits at position {position}; try --dtype float32 (half precision can overflow)"
    )


class Emitter:
    """Turns sampled tokens into events: text, EOS, stop strings and the length limit, the
    same for the plain and the speculative loop."""

    def __init__(self, lm: LoadedModel, cfg: SamplingConfig, stats: RunStats, prompt_ids: Tensor, ignore_eos: bool):
        self.lm = lm
        self.max_tokens = cfg.max_tokens
        self.stats = stats
        self.eos = set() if ignore_eos else lm.eos_ids
        self.stream = TextStream(lm.tokenizer, cfg.stop, prompt_ids[0].tolist())
        self.reason: str | None = None
        stats.prompt_tokens = prompt_ids.shape[1]

    def emit(self, figures: StepFigures, source: str = "target") -> TokenEvent:
        index = self.stats.tokens
        position = self.stats.prompt_tokens + index
        if not figures.finite_logits:
            raise_broken_logits(position)
        if not math.isclose(figures.mass, 1.0, abs_tol=1e-3):  # NaN fails too
            raise RuntimeFailure(
                f"the sampling distribution at position {position} is not finite "
                "(the settings overflowed float32); use milder penalties or temperature"
            )
        is_eos = figures.token_id in self.eos
        if is_eos:
            text, self.reason = self.stream.flush(), "eos"
        else:
            text, stopped = self.stream.push(figures.token_id)
            if stopped:
                self.reason = "stop"
            elif index == self.max_tokens - 1:
                text, self.reason = text + self.stream.flush(), "length"
        event = make_event(figures, index, text, self.lm.tokenizer, source=source, eos=is_eos)
        self.stats.record(event)
        return event


def generate(
    lm: LoadedModel,
    prompt_ids: Tensor,
    cfg: SamplingConfig,
    stats: RunStats,
    *,
    top_n: int = 5,
    ignore_eos: bool = False,
) -> Iterator[TokenEvent | Summary]:
    """Sample up to ``cfg.max_tokens`` tokens; stop at EOS, a stop string or the length.

    ``stats`` belongs to the caller so that an interrupted run still has its summary."""
    for _, item in generate_rows(lm, prompt_ids, cfg, [stats], [cfg.seed], top_n=top_n, ignore_eos=ignore_eos):
        yield item


def generate_rows(
    lm: LoadedModel,
    prompt_ids: Tensor,
    cfg: SamplingConfig,
    stats: list[RunStats],
    seeds: list[int | None],
    *,
    top_n: int = 5,
    ignore_eos: bool = False,
) -> Iterator[tuple[int, TokenEvent | Summary]]:
    """Several samples of one prompt advancing together, one forward pass per step; row i draws
    with its own generator seeded ``seeds[i]``, so it equals the same sample run alone.
    Yields ``(row, event)`` and ``(row, summary)`` when that row ends."""
    batch = len(stats)
    runner = ModelRunner(lm.model, (batch, prompt_ids.shape[1] + cfg.max_tokens) if lm.compile else None)
    if runner.compile_s:
        for row_stats in stats:
            row_stats.extra["compile_s"] = runner.compile_s
    generators = [make_generator(seed, lm.device) for seed in seeds]
    emitters = [Emitter(lm, cfg, row_stats, prompt_ids, ignore_eos) for row_stats in stats]
    ids = prompt_ids.expand(batch, -1)  # the same prompt in every row: no padding needed
    logits = runner.prefill(ids)
    history = TokenHistory.start(ids, logits.shape[-1]) if cfg.has_penalties else None
    active = list(range(batch))
    while active:
        stages = sampler_stages(logits, history, cfg)
        probs = stages[-1][1].softmax(-1)
        tokens = torch.cat([draw(probs[i : i + 1], generators[i]) for i in range(batch)])
        figures = step_figures(stages, probs, tokens, top_n)
        for row in list(active):
            yield row, emitters[row].emit(figures[row])
            if emitters[row].reason:
                active.remove(row)
                yield row, stats[row].summary(emitters[row].reason)
        if active:  # finished rows keep a place in the batch; their tokens are ignored
            history = history.advanced(tokens) if history is not None else None
            logits = runner.step(tokens)


def run_to_end(events: Iterator[Any]) -> tuple[list[TokenEvent], Summary]:
    """Collect a run (tests, metrics): the token events and the summary."""
    tokens: list[TokenEvent] = []
    for item in events:
        if isinstance(item, Summary):
            return tokens, item
        tokens.append(item)
    raise RuntimeError("the token loop ended without a summary")
