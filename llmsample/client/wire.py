"""What a command and an engine say to each other: a job (the prompt and the resolved sampling
settings, so the engine decodes exactly what the in-process run would) and the loop's records as
JSON lines, rebuilt here into the same dataclasses the renderers read in-process. Floats go through
``repr`` and back, so every number the renderers print is the engine's to the last bit."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, fields
from typing import Any

from llmsample.events import (
    CacheReuse,
    Candidate,
    ConstraintOutcome,
    PlainComparison,
    ReferenceFigures,
    ReferenceSummary,
    RunFacts,
    Speculation,
    Summary,
    TokenEvent,
    Watched,
)
from llmsample.jobs import AUTO, Explanation, Job
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.constraint import Constraint

JOB_PATH = "/llmsample/v1/generate"
EXPLAIN_PATH = "/llmsample/v1/explain"
ENGINE_PATH = "/llmsample/v1/engine"
VERSION_HEADER = "X-Llmsample-Version"
DROPPED_HEADER = "X-Llmsample-Dropped"
DETERMINISTIC_HEADER = "X-Llmsample-Deterministic"
"""Sent by a command run with ``--deterministic``: an engine not started in that mode refuses it."""


def job_from_json(data: Any) -> Job:
    """The engine's side; a body that is not a job raises ``ValueError`` naming what is wrong."""
    if not isinstance(data, dict):
        raise ValueError("the body must be a JSON object")
    names = {f.name for f in fields(Job)}
    if set(data) - names or "prompt" not in data or "cfg" not in data or "preset" not in data:
        raise ValueError(f"a job has the keys {', '.join(sorted(names))} (prompt, cfg and preset required)")
    config = data["cfg"]
    known = {f.name for f in fields(SamplingConfig)}
    if not isinstance(config, dict) or set(config) - known:
        raise ValueError(f"cfg: unknown keys {sorted(set(config) - known) if isinstance(config, dict) else config!r}")
    constraint = _constraint(config.get("constraint"))
    cfg = SamplingConfig(**{key: _tuples(value) for key, value in config.items() if key != "constraint"})
    cfg = dataclasses.replace(cfg, constraint=constraint)
    room = data.get("fit_room")
    if room is not None and not (type(room) is int and room >= 0 and data.get("messages") is not None):
        raise ValueError(f"fit_room: expected a whole number from 0, with messages, got {room!r}")
    if not isinstance(data.get("cache_prompt", True), bool):
        raise ValueError(f"cache_prompt: expected true or false, got {data['cache_prompt']!r}")
    for key in ("ignore_eos", "reference", "own_pool"):
        if not isinstance(data.get(key, False), bool):
            raise ValueError(f"{key}: expected true or false, got {data[key]!r}")
    if data.get("drafter") not in (None, "auto", "suffix", "model"):
        raise ValueError(f"drafter: expected auto, suffix, model or null, got {data['drafter']!r}")
    watch = data.get("watch", [])
    if not (isinstance(watch, list) and all(isinstance(token, str) for token in watch)):
        raise ValueError(f"watch: expected a list of strings, got {watch!r}")
    ids, prefix = data.get("prompt_ids"), data.get("prefix", [])
    if ids is not None and not (_token_ids(ids) and ids):
        raise ValueError(f"prompt_ids: expected a list of token ids, got {ids!r}")
    if not _token_ids(prefix):
        raise ValueError(f"prefix: expected a list of token ids, got {prefix!r}")
    return Job(**{**data, "cfg": cfg, "ngram": _ngram(data.get("ngram")), "draft_tokens": _draft_tokens(data),
                  "messages": _messages(data.get("messages")), "watch": tuple(watch),
                  "prompt_ids": None if ids is None else tuple(ids), "prefix": tuple(prefix)})  # fmt: skip


def _token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(type(t) is int and t >= 0 for t in value)


def explanation_from_json(data: Any) -> Explanation:
    """The engine's side; a body that is not one raises ``ValueError`` naming what is wrong."""
    if not isinstance(data, dict) or set(data) - {"job", "continuation", "watch", "reply"} or "job" not in data:
        raise ValueError("an explanation has the keys job (required), continuation, watch and reply")
    job = job_from_json(data["job"])
    reply = data.get("reply")
    if reply is not None and not (isinstance(reply, list) and all(type(t) is int and t >= 0 for t in reply)):
        raise ValueError(f"reply: expected a list of token ids, got {reply!r}")
    if job.ngram is not None or job.drafter not in (None, AUTO) or (job.messages is not None and reply is None):
        raise ValueError("job: explain takes a prompt (messages with a reply), not drafts")
    continuation, watch = data.get("continuation"), data.get("watch") or []
    if continuation is not None and not isinstance(continuation, str):
        raise ValueError(f"continuation: expected a string, got {continuation!r}")
    if not (isinstance(watch, list) and all(isinstance(token, str) for token in watch)):
        raise ValueError(f"watch: expected a list of strings, got {watch!r}")
    return Explanation(job, continuation, tuple(watch), None if reply is None else tuple(reply))


def _constraint(data: Any) -> Constraint | None:
    """The client compiled it (a bad one failed there, before anything was sent)."""
    if data is None:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str) or not isinstance(data.get("grammar"), str):
        raise ValueError("cfg.constraint: expected an object with a kind and a grammar")
    try:
        return Constraint(**{**data, "ignored": tuple(data.get("ignored", ()))})
    except TypeError:
        raise ValueError(f"cfg.constraint: the keys are {', '.join(f.name for f in fields(Constraint))}") from None


def _ngram(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 2 and all(type(n) is int and n >= 1 for n in value)):
        raise ValueError(f"ngram: expected [shortest, longest], two whole numbers from 1, got {value!r}")
    if value[0] > value[1]:
        raise ValueError(f"ngram: the shortest n {value[0]} is above the longest {value[1]}")
    return value[0], value[1]


def _draft_tokens(data: dict[str, Any]) -> int | None:
    value = data.get("draft_tokens")
    if value is not None and not (type(value) is int and value >= 1):
        raise ValueError(f"draft_tokens: expected a whole number from 1, got {value!r}")
    return value


def _messages(value: Any) -> list[dict[str, Any]] | None:
    """The client read them as the in-process run does (a bad line failed there); the shape is checked here."""
    if value is None:
        return None
    if not (isinstance(value, list) and value and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                      for m in value)):  # fmt: skip
        raise ValueError("messages: expected a list of objects, each with a role")
    return value


def _tuples(value: Any) -> Any:
    """JSON's lists back to the config's tuples (``logit_bias``: pairs)."""
    if isinstance(value, list):
        return tuple(_tuples(item) for item in value)
    return value


def encode(record: Any) -> str:
    """One record as a JSON line: a token, a summary, or a row's failure."""
    if isinstance(record, TokenEvent):
        return json.dumps({"type": "token", **asdict(record)}, allow_nan=False)
    if isinstance(record, Summary):
        return json.dumps({"type": "summary", **asdict(record)}, allow_nan=False)
    return json.dumps({"type": "failed", "message": record.message, "user_error": record.user_error})


@dataclass(frozen=True)
class Failed:
    """A row the engine could not finish: ``user_error`` as the in-process run would raise it."""

    message: str
    user_error: bool


def decode(line: str) -> TokenEvent | Summary | Failed:
    """A line of :func:`encode` as the record it was."""
    return from_dict(json.loads(line))


def from_dict(data: dict[str, Any]) -> TokenEvent | Summary | Failed:
    """A record's JSON object (``type``: token, summary or failed) as the record it was; a token's
    ``TokenEvent.to_dict`` reads back too (the run log keeps those)."""
    data = dict(data)
    kind = data.pop("type")
    if kind == "token":
        return _token(data)
    if kind == "summary":
        return _summary(data)
    if kind == "failed":
        return Failed(data["message"], bool(data["user_error"]))
    raise ValueError(f"unknown record type {kind!r}")


def _token(data: dict[str, Any]) -> TokenEvent:
    data["top"] = tuple(Candidate(**candidate) for candidate in data["top"])
    data["watch"] = {name: Watched(**figures) for name, figures in data.get("watch", {}).items()}
    if data.get("reference") is not None:
        data["reference"] = ReferenceFigures(**data["reference"])
    return TokenEvent(**data)


SECTIONS = {
    "speculation": Speculation,
    "reference": ReferenceSummary,
    "comparison": PlainComparison,
    "cache": CacheReuse,
    "constraint": ConstraintOutcome,
}


def _summary(data: dict[str, Any]) -> Summary:
    facts = dict(data.pop("facts"))
    for key, kind in SECTIONS.items():
        if facts.get(key) is not None:
            facts[key] = kind(**facts[key])
    if facts.get("device_map") is not None:
        facts["device_map"] = tuple(facts["device_map"])
    return Summary(**data, facts=RunFacts(**facts))


def served(summary: Summary, where: str) -> Summary:
    """The summary as the client reports it: which engine decoded it, warm. The engine's prompt
    cache is its own business (the tokens are a cold prefill's), so its reuse is left out and a
    run prints what it prints in-process."""
    facts = dataclasses.replace(summary.facts, engine=where, warm=True, cache=None)
    return dataclasses.replace(summary, facts=facts)
