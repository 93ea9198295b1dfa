"""What a command asks of an engine, here or warm: a :class:`Job` (one prompt or conversation and
its resolved settings) or an :class:`Explanation` (``explain``'s question). Torch-free, below
both the client that sends them and the engine that runs them, so the two read one definition."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from llmsample.sampling.config import SamplingConfig

NGRAM = (2, 4)
"""Prompt lookup's shortest and longest n-gram unless given (``--ngram-min``, ``--ngram-max``)."""


AUTO = "auto"
"""A job's ``drafter`` by default (``--draft auto``): its engine's own suffix pool, whatever else
the engine drafts with, on the backends that draft by default (elsewhere none)."""


def engine_drafter(draft: str | None) -> str | None:
    """``--draft``'s value as a job's ``drafter``: ``auto`` when not given; prompt lookup is the
    row's own (``ngram``, None here, as ``none``); a suffix pool or a draft model (any other
    value) the engine's."""
    if draft is None or draft == AUTO:
        return AUTO
    if draft in ("none", "ngram"):
        return None
    return "suffix" if draft == "suffix" else "model"


def drafter_asked(draft: str | None) -> bool:
    """Whether ``--draft`` asks for drafting that a mode without it must refuse (``auto``, the
    default, drafts where it can and is silent where it cannot)."""
    return draft not in (None, AUTO, "none")


@dataclass(frozen=True)
class Job:
    """One prompt for the engine, as ``generate`` resolved it before loading anything: the text
    (the engine applies the chat template, as the in-process run does), the settings with their
    seed and compiled constraint, how many alternatives each record lists, and ``--draft ngram``
    (``ngram``: its shortest and longest n; ``draft_tokens``: a fixed K, None adaptive).
    ``messages``: a whole conversation (a batch line's, a chat's) in place of the prompt text;
    ``fit_room``: a chat's positions kept for the reply, the conversation's oldest exchanges
    dropped until it fits the context (how many: the answer's ``X-Llmsample-Dropped``);
    ``cache_prompt``: False, the engine prefills the prompt whole rather than after a cached
    prefix (llama-server's ``cache_prompt``): a prefix prefilled apart rounds apart, so a
    one-shot command's bytes are the in-process run's only so.

    ``prompt_ids``: the prompt already encoded, in place of the text (an OpenAI batch line,
    shaped here with the model's tokenizer: its tools and its thinking block); ``prefix``: ids
    put after the prompt as the reply's start (a chat's ``/branch``, a replayed reply).

    ``watch``: tokens whose numbers every record carries (each row its own). What needs more
    than a row of the batch (:class:`Capabilities`): ``reference`` (every token scored under the
    engine's float32 reference model) and ``drafter`` (the engine's own drafter: ``auto``, the
    default, ``suffix``, its pool across requests, or ``model``, its draft model). ``own_pool``:
    with ``auto``, the job's rows draft from a fresh pool of their own, as a ``generate`` process's,
    not the engine's (a chat exchange): on llama.cpp a draft's length
    changes a pass's rounding, so a seed gives ``generate``'s text only from ``generate``'s pool,
    and an undone exchange leaves nothing behind."""

    prompt: str
    cfg: SamplingConfig
    preset: str
    system: str | None = None
    raw: bool = False
    truncate: str = "error"
    top_n: int = 5
    model: str | None = None  # the model the caller expects (None: whatever the engine serves)
    ngram: tuple[int, int] | None = None
    draft_tokens: int | None = None
    messages: list[dict[str, Any]] | None = None
    fit_room: int | None = None
    cache_prompt: bool = True
    ignore_eos: bool = False
    watch: tuple[str, ...] = ()
    reference: bool = False
    drafter: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    prefix: tuple[int, ...] = ()
    own_pool: bool = False

    def to_json(self) -> dict[str, Any]:
        config = {f.name: getattr(self.cfg, f.name) for f in fields(self.cfg)}
        if self.cfg.constraint is not None:
            config["constraint"] = asdict(self.cfg.constraint)
        data = asdict(self)
        data["cfg"] = config
        return data


@dataclass(frozen=True)
class Capabilities:
    """What an engine holds beyond a row of its batch, or what a command asks of one: a drafter
    of its own (a draft model, by name or kind, or ``suffix``) and a reference model. The one
    table every engine refuses from, in one line naming the flag (``needs --local``)."""

    drafter: str | None = None
    reference: bool = False

    def names(self) -> list[str]:
        """As an engine's status lists them."""
        return ["drafter"] * (self.drafter not in (None, AUTO)) + ["reference"] * self.reference

    def lacking(self, asked: Capabilities, draft_flag: str | None = None) -> str | None:
        """The flag of the first thing ``asked`` that this engine lacks (``--draft`` shown as
        ``draft_flag``, the value the user gave, else as its kind: ``--draft MODEL`` for a
        draft model); None: the engine runs it."""
        if asked.reference and not self.reference:
            return "--reference"
        if asked.drafter not in (None, AUTO) and asked.drafter != self.drafter:
            return f"--draft {draft_flag or ('MODEL' if asked.drafter == 'model' else asked.drafter)}"
        return None

    @classmethod
    def of_job(cls, job: Job) -> Capabilities:
        return cls(job.drafter, job.reference)


@dataclass(frozen=True)
class Explanation:
    """``explain``'s question for an engine: a job's prompt (or a chat's messages) and settings
    (``top_n``: candidates shown), and ``continuation`` to score (None: the next token) or
    ``watch``'s tokens as given. ``reply``: a chat's reply so far (``/explain N``: its first N
    tokens), the chain then shown at the position after them, as the reply saw it."""

    job: Job
    continuation: str | None = None
    watch: tuple[str, ...] = ()
    reply: tuple[int, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"job": self.job.to_json(), "continuation": self.continuation, "watch": list(self.watch),
                "reply": None if self.reply is None else list(self.reply)}  # fmt: skip
