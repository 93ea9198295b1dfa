"""``chat --replay``: a saved reply against the same reply decoded again, and where and why
the two part (:func:`llmsample.logs.rerun.where_they_part`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmsample.logs.rerun import where_they_part

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
    probs = saved.get("token_probs") or [None] * len(ids)  # a logged reply's (-c), not a /save file's
    saved_tokens = [(t, lm.token_text(t), p) for t, p in zip(ids, probs, strict=False)]
    parted = where_they_part(saved_tokens, reply.events, reply.stop_reason)
    return Replayed(exchange, parted is None, parted or "")


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
