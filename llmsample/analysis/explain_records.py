"""What ``explain`` tells its views (the next token's chain stage by stage, a continuation scored
token by token): plain data, no torch (like :mod:`llmsample.events`), so a command on a warm
engine rebuilds them from the engine's JSON and prints what the in-process run prints. JSON
keeps every float to the last bit (``repr`` and back)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class StageCandidate:
    token_id: int
    text: str
    probs: dict[str, float]  # stage name -> probability after that stage (0 once removed)
    removed_by: str | None


@dataclass(frozen=True)
class ChainReport:
    stages: list[str]
    candidates: list[StageCandidate]
    kept: dict[str, int]  # stage -> candidates still allowed after it
    entropy: float  # of the final distribution, bits

    def to_dict(self) -> dict[str, Any]:
        return {"type": "chain", **asdict(self)}


@dataclass(frozen=True)
class ScoredToken:
    index: int
    token_id: int
    text: str
    model_prob: float
    prob: float  # under the preset's sampling distribution
    model_rank: int
    allowed: bool
    removed_by: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"type": "scored", **asdict(self)}


Answer = ChainReport | list[ScoredToken]
"""What ``explain`` computes without ``--layers`` or ``--tree``: the next token's report, or
the continuation's tokens scored."""


def answer_to_json(answer: Answer) -> dict[str, Any]:
    if isinstance(answer, ChainReport):
        return answer.to_dict()
    return {"type": "scored_list", "tokens": [token.to_dict() for token in answer]}


def answer_from_json(data: Any) -> Answer:
    """:func:`answer_to_json`'s object as the records it was; anything else raises ``ValueError``."""
    try:
        if data["type"] == "chain":
            fields = {key: value for key, value in data.items() if key != "type"}
            fields["candidates"] = [StageCandidate(**candidate) for candidate in fields["candidates"]]
            return ChainReport(**fields)
        if data["type"] == "scored_list":
            return [ScoredToken(**{k: v for k, v in token.items() if k != "type"}) for token in data["tokens"]]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not an explain answer ({exc})") from None
    raise ValueError(f"not an explain answer (type {data.get('type')!r})")
