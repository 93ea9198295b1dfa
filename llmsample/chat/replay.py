"""``chat --replay``: a saved reply against the same reply decoded again, and where and why
the two part (a near tie tipped by different numbers; a token the replay would hardly draw,
which says the model, its weights or the settings are not those of the saved run)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmsample.chat.conversation import Reply
    from llmsample.models.loading import LoadedModel


@dataclass(frozen=True)
class Replayed:
    """One saved reply's replay: ``same`` None when it was not replayed (``why`` says why)."""

    exchange: int
    same: bool | None
    why: str = ""


def compare(lm: LoadedModel, exchange: int, saved: dict[str, Any], reply: Reply | None) -> Replayed:
    """The replay against the saved record: its token ids where it has them, else its text."""
    if reply is None:
        return Replayed(exchange, False, "the replay was interrupted")
    ids = saved.get("token_ids")
    if ids is None:
        same = reply.text == saved.get("content")
        return Replayed(exchange, same, "" if same else "the text differs (the saved reply has no token ids)")
    if reply.ids == ids:
        return Replayed(exchange, True)
    at = next((i for i, (a, b) in enumerate(zip(ids, reply.ids, strict=False)) if a != b), None)
    if at is None:
        longer, shorter = ("saved reply", "replay") if len(ids) > len(reply.ids) else ("replay", "saved reply")
        return Replayed(exchange, False, f"the {shorter} stopped at token {min(len(ids), len(reply.ids))} "
                                         f"({reply.stop_reason} in the replay) where the {longer} went on")  # fmt: skip
    event, old = reply.events[at], ids[at]
    now = f"replayed {lm.token_text(event.token_id)!r} (p {event.prob:.3g})"
    held = next((c.prob for c in event.top if c.token_id == old), None)
    then = f"saved {lm.token_text(old)!r}"
    if held is None:
        reason = "the saved token is not among the replay's alternatives: another model, weights or settings?"
    else:
        reason = f"the saved token has p {held:.3g} in the replay: a near tie that other numbers tipped"
    return Replayed(exchange, False, f"token {at}: {then}, {now}; {reason}")


def summary_line(results: list[Replayed]) -> list[str]:
    """What ``--replay`` says: a line per reply that differs, then the count."""
    replayed = [r for r in results if r.same is not None]
    skipped = len(results) - len(replayed)
    lines = [f"exchange {r.exchange} differs at {r.why}" if r.why.startswith("token") else
             f"exchange {r.exchange} differs: {r.why}" for r in replayed if not r.same]  # fmt: skip
    head = f"replayed {len(replayed)} replies"
    if skipped:
        head += f" ({skipped} interrupted, skipped: where the interrupt landed is not in the seed)"
    differ = [str(r.exchange) for r in replayed if not r.same]
    lines.append(f"{head}: exchange(s) {', '.join(differ)} differ from the saved ones" if differ
                 else f"{head}: all equal to the saved ones")  # fmt: skip
    return lines
