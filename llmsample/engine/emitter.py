"""From sampled tokens to events: text, EOS, stop strings, the length limit and the model's
context, shared by every loop (plain, speculative, batch)."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence

from torch import Tensor

from llmsample.engine.text_stream import TextStream
from llmsample.errors import RuntimeFailure
from llmsample.events import Candidate, RunStats, StepFigures, TokenEvent, Watched
from llmsample.models.loading import LoadedModel
from llmsample.sampling.config import SamplingConfig


def check_finite(logits: Tensor, position: int) -> None:
    """NaN or +inf anywhere, or nothing finite, means the forward pass broke: stop, never sample it.
    (The plain loop checks the same in its step figures, without a host sync of its own.)"""
    broken = ~(logits < math.inf) | (logits == -math.inf).all(-1, keepdim=True)
    if broken.any():
        raise_broken_logits(position)


def raise_nothing_left(removed: dict[str, int], index: int, position: int) -> None:
    """The bans (with --min-tokens) removed every candidate: the run (or batch row) fails rather
    than lifting them; only these stages can, every other filter keeps its best token."""
    stages = [name for stage, name in (("ban", "bans"), ("min_tokens", "min_tokens")) if removed.get(stage)]
    how = "ban fewer strings" + (" or lower min_tokens" if "min_tokens" in stages else "")
    raise RuntimeFailure(
        f"the {' and '.join(stages) or 'sampling settings'} leave no token to generate at token {index} "
        f"(position {position}): every candidate is removed, and they are never lifted; {how}"
    )


def raise_broken_logits(position: int) -> None:
    raise RuntimeFailure(
        f"the model produced NaN/inf logits at position {position}; try --dtype float32 (half precision can overflow)"
    )


class Emitter:
    """Turns sampled tokens into events: text, EOS, stop strings, the length limit and the
    context, the same for the plain and the speculative loop. A row stops at its model's context
    (``context``): positions past it are garbage or a crash on many architectures."""

    def __init__(
        self,
        lm: LoadedModel,
        cfg: SamplingConfig,
        stats: RunStats,
        prompt_ids: Sequence[int],
        ignore_eos: bool,
        watch: Sequence[tuple[str, int]] = (),
        stop_ids: Collection[int] = (),
        keep_stop: bool = False,
        deterministic: bool = False,
    ):
        """``watch``: the row's watched tokens as ``(the user's text, id)``, picked by id from the
        step's watched figures (which may hold other rows' too);
        ``stop_ids``: tokens that end the text as the end of text does (vLLM's ``stop_token_ids``);
        ``keep_stop``: a stop string that ends the text stays in it; ``deterministic``: the run's
        mode, which the summary notes."""
        self.lm = lm
        self.watch = tuple(watch)
        self.max_tokens = cfg.max_tokens
        self.context = lm.context_length or 0  # 0: not known, no limit
        self.stats = stats
        self.eos = (set() if ignore_eos else set(lm.eos_ids)) | set(stop_ids)
        self.cfg = cfg
        self.stream = TextStream(lm.tokenizer, cfg.stop, list(prompt_ids), keep_stop)
        self.reason: str | None = None
        stats.prompt_tokens = len(prompt_ids)
        # What the run actually used (``--device``/``--dtype auto`` resolve per machine and model).
        stats.note(device=str(lm.device), dtype=lm.weights, backend=lm.backend, model_file=lm.model_file)
        if deterministic:
            stats.note(deterministic=True)

    def room(self) -> int:
        """How many more tokens the row may emit before its length limit or its context."""
        left = self.max_tokens - self.stats.tokens
        if self.context:
            left = min(left, self.context - self.stats.prompt_tokens - self.stats.tokens)
        return left

    def emit(self, figures: StepFigures, source: str = "target") -> TokenEvent:
        index = self.stats.tokens
        position = self.stats.prompt_tokens + index
        if not figures.finite_logits:
            raise_broken_logits(position)
        constrained = self.cfg.constraint is not None
        if figures.candidates == 0 and not constrained:
            raise_nothing_left(figures.removed, index, position)
        if figures.candidates == 0 or not math.isclose(figures.mass, 1.0, abs_tol=1e-3):  # NaN fails too
            if constrained:
                raise RuntimeFailure(nothing_left(self.cfg, figures.removed, position))
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
            elif self.context and position >= self.context - 1:  # the last position the model has
                text, self.reason = text + self.stream.flush(), "context"
        if figures.removed.get("reasoning_budget"):
            source = "forced"  # the budget left this token alone
        event = make_event(
            figures, index, text, self.lm.token_text, source=source, eos=is_eos, watch=self.watch
        )
        self.stats.record(event)
        return event


def nothing_left(cfg: SamplingConfig, removed: dict[str, int], position: int) -> str:
    """Why a constrained step has no candidate: the grammar allows only what another stage removed."""
    flag = cfg.constraint.flag
    others = [flag for name, flag in (("ban", "--ban"), ("min_tokens", "--min-tokens")) if removed.get(name)]
    if others:
        return (
            f"no token is left at position {position}: {flag} allows only tokens that {' and '.join(others)} "
            f"removed; loosen one of them"
        )
    return f"no token is left at position {position}: {flag} allows no token here; check the constraint"


def make_event(
    figures: StepFigures,
    index: int,
    text: str,
    token_text: Callable[[int], str],
    source: str = "target",
    eos: bool = False,
    watch: Sequence[tuple[str, int]] = (),
) -> TokenEvent:
    top = tuple(
        Candidate(t, token_text(t), p, m)
        for t, p, m in zip(figures.top_ids, figures.top_probs, figures.top_model_probs, strict=True)
    )
    return TokenEvent(
        index=index,
        token_id=figures.token_id,
        text=text,
        prob=figures.prob,
        model_prob=figures.model_prob,
        model_rank=figures.model_rank,
        entropy=figures.entropy,
        top=top,
        removed=figures.removed,
        source=source,
        eos=eos,
        watch=_watched(figures, watch),
    )


def _watched(figures: StepFigures, watch: Sequence[tuple[str, int]]) -> dict[str, Watched]:
    """The row's own watched tokens by the names it gave them."""
    if not watch:
        return {}
    by_id = {watched.token_id: watched for watched in figures.watch}
    return {name: by_id[token] for name, token in watch}
