"""What the token loop tells its renderers: one event per token, then a summary.

Renderers (plain, live colour, JSONL, HTML, inspection tables) read only these records;
none of them touches the model, and this module imports no torch.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any


@dataclass(frozen=True)
class Candidate:
    token_id: int
    text: str
    prob: float
    model_prob: float


@dataclass(frozen=True)
class Watched:
    """A token named with ``--watch``, at one step: its probability in the sampling distribution,
    under the raw model, and its raw-model rank (1 is the model's favourite)."""

    token_id: int
    prob: float
    model_prob: float
    model_rank: int


@dataclass(frozen=True)
class ReferenceFigures:
    """The token under a reference model (``generate --reference``: the same checkpoint in full
    precision): ``kl`` = KL(P_ref ‖ P_model) in nats over the raw distributions (temperature 1,
    no penalties or filters), ``same_top``: both put the same token first, ``prob``: the sampled
    token's probability under the reference."""

    kl: float
    same_top: bool
    prob: float


@dataclass(frozen=True)
class TokenEvent:
    """``prob``: in the distribution the token was drawn from; ``model_*``: under the raw model
    (temperature 1, no penalties or filters); ``entropy``: of the sampling distribution, bits;
    ``removed``: candidates each filter removed at this step; ``text``: what this token released
    to the output (stop strings and split characters can delay text to a later token);
    ``watch``: the ``--watch`` tokens at this step, keyed by the text the user gave."""

    index: int
    token_id: int
    text: str
    prob: float
    model_prob: float
    model_rank: int
    entropy: float
    top: tuple[Candidate, ...]
    removed: dict[str, int]
    source: str = "target"
    eos: bool = False
    watch: dict[str, Watched] = field(default_factory=dict)
    reference: ReferenceFigures | None = None

    def to_dict(self) -> dict[str, Any]:
        """``{"type": "token", **asdict(self)}`` without the keys a run did not ask for, built by
        hand: ``dataclasses.asdict`` copies generically, and in a 16-client server its calls
        (the stream's and the log's, every token) were a fifth of the work beside the passes."""
        data: dict[str, Any] = {
            "type": "token", "index": self.index, "token_id": self.token_id, "text": self.text, "prob": self.prob,
            "model_prob": self.model_prob, "model_rank": self.model_rank, "entropy": self.entropy,
            "top": tuple({"token_id": c.token_id, "text": c.text, "prob": c.prob, "model_prob": c.model_prob}
                         for c in self.top),
            "removed": dict(self.removed), "source": self.source, "eos": self.eos,
        }  # fmt: skip
        if self.watch:  # only runs with --watch carry the key
            data["watch"] = {name: {"token_id": w.token_id, "prob": w.prob, "model_prob": w.model_prob,
                                    "model_rank": w.model_rank} for name, w in self.watch.items()}  # fmt: skip
        if self.reference is not None:  # only runs with --reference carry it
            ref = self.reference
            data["reference"] = {"kl": ref.kl, "same_top": ref.same_top, "prob": ref.prob}
        return data


@dataclass(frozen=True)
class Speculation:
    """What a speculative run drafted and kept, current at every token."""

    drafted: int = 0
    accepted: int = 0
    target_passes: int = 0
    tokens_per_pass: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "target_passes": self.target_passes,
            "tokens_per_pass": self.tokens_per_pass,
        }


@dataclass(frozen=True)
class ReferenceSummary:
    """``--reference``: the run's figures against the float32 checkpoint (the ``reference`` key)."""

    dtype: str
    tokens: int
    mean_kl: float
    max_kl: float
    same_top: float


@dataclass(frozen=True)
class PlainComparison:
    """``--compare``: the same prompt decoded without speculation, same seed."""

    plain_tokens_per_s: float | None
    plain_elapsed_s: float
    speedup: float | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.speedup is None:
            del data["speedup"]
        return data


@dataclass(frozen=True)
class CacheReuse:
    """A turn of a session: prompt tokens found in the cache, and prompt tokens prefilled."""

    reused: int
    prefilled: int


@dataclass(frozen=True)
class ConstraintOutcome:
    """A constrained run: which constraint (its flag) and whether the output is complete under it
    (``False``: the length limit or a stop string cut the text before the grammar accepted)."""

    constraint: str
    complete: bool
    constraint_ignored: tuple[str, ...] = ()  # schema keywords left unenforced (lenient)


@dataclass(frozen=True)
class RunFacts:
    """What a run used and measured beyond the counts, in typed optional sections; a section
    that does not apply is None and leaves its keys out of the summary record."""

    device: str | None = None
    dtype: str | None = None
    backend: str | None = None  # transformers or llama.cpp
    quantization: str | None = None
    model_file: str | None = None  # the GGUF llama.cpp ran
    device_map: tuple[str, ...] | None = None
    compile_s: float | None = None
    load_s: float | None = None  # the model's load this run waited for (None: it was loaded already, or warm)
    speculation: Speculation | None = None
    reference: ReferenceSummary | None = None
    comparison: PlainComparison | None = None
    cache: CacheReuse | None = None
    constraint: ConstraintOutcome | None = None
    engine: str | None = None  # where a warm engine decoded the run (None: in this process)
    warm: bool | None = None
    deterministic: bool | None = None  # --deterministic: batch-invariant numbers (else left out)

    def to_dict(self) -> dict[str, Any]:
        """The summary record's keys, as the JSONL schema has them (flat, ``reference`` nested)."""
        data: dict[str, Any] = {}
        for key in ("quantization", "compile_s", "load_s", "device", "dtype", "backend", "model_file", "deterministic"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        if self.device_map is not None:
            data["device_map"] = list(self.device_map)
        if self.speculation is not None:
            data.update(self.speculation.to_dict())
        if self.reference is not None:
            data["reference"] = asdict(self.reference)
        if self.comparison is not None:
            data.update(self.comparison.to_dict())
        if self.cache is not None:
            data["cache"] = asdict(self.cache)
        if self.constraint is not None:
            data.update(constraint=self.constraint.constraint, complete=self.constraint.complete)
            if self.constraint.constraint_ignored:
                data["constraint_ignored"] = list(self.constraint.constraint_ignored)
        if self.engine is not None:
            data.update(engine=self.engine, warm=self.warm)
        return data


@dataclass(frozen=True)
class Summary:
    text: str
    tokens: int
    prompt_tokens: int
    stop_reason: str  # eos | length | stop | context (the model's) | interrupted | cancelled
    ttft_s: float | None
    tokens_per_s: float | None
    model: str
    preset: str
    seed: int | None
    elapsed_s: float
    facts: RunFacts = field(default_factory=RunFacts)

    def to_dict(self) -> dict[str, Any]:
        data = {"type": "summary", **{f.name: getattr(self, f.name) for f in fields(self) if f.name != "facts"}}
        data.update(self.facts.to_dict())
        return data


@dataclass
class RunStats:
    """Counts and clocks of one run, so a summary exists even when the run is cut short."""

    model: str
    preset: str
    seed: int | None
    prompt_tokens: int = 0
    started: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    tokens: int = 0
    text_parts: list[str] = field(default_factory=list)
    facts: RunFacts = field(default_factory=RunFacts)

    def note(self, **sections: Any) -> None:
        """Set sections of the run's facts (``device=...``, ``speculation=...``)."""
        self.facts = replace(self.facts, **sections)

    def record(self, event: TokenEvent) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self.tokens += 1
        self.text_parts.append(event.text)

    def summary(self, stop_reason: str) -> Summary:
        now = time.perf_counter()
        ttft = None if self.first_token_at is None else self.first_token_at - self.started
        decode_time = None if self.first_token_at is None else now - self.first_token_at
        # Decode speed excludes the prefill, as llama.cpp and transformers' benchmarks count it.
        rate = (self.tokens - 1) / decode_time if decode_time and self.tokens > 1 else None
        return Summary(
            text="".join(self.text_parts),
            tokens=self.tokens,
            prompt_tokens=self.prompt_tokens,
            stop_reason=stop_reason,
            ttft_s=ttft,
            tokens_per_s=rate,
            model=self.model,
            preset=self.preset,
            seed=self.seed,
            elapsed_s=now - self.started,
            facts=self.facts,
        )


@dataclass(frozen=True)
class StepFigures:
    """Per-row numbers of one sampling step, fetched from the device in a single transfer."""

    token_id: int
    prob: float
    model_prob: float
    model_rank: int
    entropy: float
    top_ids: list[int]
    top_probs: list[float]
    top_model_probs: list[float]
    removed: dict[str, int]
    mass: float  # total of the sampling distribution: 1 unless something overflowed
    finite_logits: bool  # the model's logits had no NaN/+inf and something finite
    candidates: int = 1  # tokens the chain's last stage kept: 0 when bans/min-tokens removed every one
    watch: tuple[Watched, ...] = ()  # the watched ids, in the order step_figures was given them
    accepted: int = 0  # speculation: how many of its row's drafts this step accepted


@dataclass(frozen=True)
class PromptLogprobs:
    """Every prompt token: its text (the texts concatenate to the prompt's decoded text), its
    natural log probability and rank given the tokens before it, and the ``top_n`` likeliest
    tokens at its position (id, text, log probability), likeliest first, then the token itself
    when it is not among them (up to ``top_n + 1``, as OpenAI and vLLM list them). The first
    token's figures are None and its alternatives empty: nothing before it predicts it."""

    token_ids: tuple[int, ...]
    texts: tuple[str, ...]
    logprobs: tuple[float | None, ...]
    ranks: tuple[int | None, ...]
    top: tuple[tuple[tuple[int, str, float], ...], ...]
