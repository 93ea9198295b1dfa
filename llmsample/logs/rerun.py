"""A run decoded again against the run it repeats: the same token ids, or where the two first part
and why (a near tie that other numbers tipped, or a token the new run would hardly draw: another
model, other weights, other settings)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from llmsample.events import Summary, TokenEvent


def where_they_part(
    logged: Sequence[tuple[int, str, float | None]], events: Sequence[TokenEvent], stop_reason: str
) -> str | None:
    """None when ``events`` (the replay) are the ``logged`` tokens (id, text, probability when
    known), else the first difference in words, and why."""
    for index, ((token, text, prob), event) in enumerate(zip(logged, events, strict=False)):
        if token != event.token_id:
            what = f"token {index}: saved {text!r} (id {token}), replayed {event.text!r} (id {event.token_id})"
            return f"{what}; {_why(token, prob, event)}"
    if len(logged) == len(events):
        return None
    shorter = "the replay" if len(events) < len(logged) else "the saved run"
    return f"{shorter} stopped at token {min(len(logged), len(events))} (replay: {stop_reason}); the same tokens before"


def _why(token: int, prob: float | None, event: TokenEvent) -> str:
    """The saved token's probability then and now: equal, the draw differs (seed, settings that
    only move the draw); apart, the numbers differ (model, weights, dtype, device, settings)."""
    now = next((c.prob for c in event.top if c.token_id == token), None)
    if now is None:
        floor = min((c.prob for c in event.top), default=None)
        if prob is not None and floor is not None and prob <= floor:  # below the listed few: cannot tell
            return (f"the saved token (p {prob:.3g}) is below the replay's {len(event.top)} alternatives: "
                    "a rarer draw (the seed) or other numbers")  # fmt: skip
        return "the saved token is not among the replay's alternatives: the numbers differ (model, weights, settings)"
    if prob is None:
        return f"the saved token has p {now:.3g} in the replay"
    if abs(now - prob) <= 1e-3 * max(prob, 1e-6):
        return f"the saved token has the same p {now:.3g}: the same distribution, another draw (the seed)"
    return f"the saved token had p {prob:.3g} and has p {now:.3g}: the numbers differ (model, dtype, device, settings)"


class ReplayCheck:
    """A renderer: the new run's tokens against a logged run's records; one stderr line at the summary."""

    def __init__(self, run_id: int, records: list[dict[str, Any]]) -> None:
        self.run_id = run_id
        self.logged = [(int(r["token_id"]), str(r.get("text", "")), r.get("prob")) for r in records]
        self.events: list[TokenEvent] = []
        self.matched: bool | None = None

    def token(self, event: TokenEvent) -> None:
        self.events.append(event)

    def summary(self, summary: Summary) -> None:
        if summary.stop_reason == "interrupted":
            print(f"replay of run {self.run_id}: interrupted, nothing to compare", file=sys.stderr)
            return
        parted = where_they_part(self.logged, self.events, summary.stop_reason)
        self.matched = parted is None
        said = f"matched ({len(self.events)} tokens)" if parted is None else f"differs at {parted}"
        print(f"replay of run {self.run_id}: {said}", file=sys.stderr)
