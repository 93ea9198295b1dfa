"""``--inspect``: a table of every token's numbers after the text (the same numbers as JSONL)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from llmsample.events import Summary, TokenEvent
from llmsample.render.bands import band_for
from llmsample.sampling.stages import BY_NAME, FILTER_STAGES

VISIBLE = {" ": "·", "\n": "↵", "\t": "→", "\r": "␍"}


def visible(text: str) -> str:
    """Whitespace and control characters made visible, so a token's exact text can be read."""
    out = []
    for char in text:
        if char in VISIBLE:
            out.append(VISIBLE[char])
        elif ord(char) < 32 or 0x7F <= ord(char) < 0xA0:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return "".join(out) or "∅"


def steady_removals(events: list[TokenEvent]) -> dict[str, int]:
    """Filters that removed the same count at every step (top-k over a vocabulary of 49,152 says
    ``k49102`` on each row): said once in the legend, so the column shows what changes."""
    if len(events) < 2:
        return {}
    first = events[0].removed
    return {name: n for name, n in first.items() if n and all(e.removed.get(name) == n for e in events)}


def removed_cell(event: TokenEvent, steady: dict[str, int] | None = None) -> str:
    """The ``removed`` column: each filter's letter (from the stage table) and its count, less the
    ``steady`` ones the legend names."""
    steady = steady or {}
    return " ".join(f"{BY_NAME[name].letter}{n}" for name, n in event.removed.items() if n and name not in steady) or "-"


def removed_legend(events: list[TokenEvent]) -> str:
    """The letters of the filters these events report (top-k, top-p and min-p always), the counts
    that never changed, and the draft mark when a token came from a draft."""
    names = [name for name in FILTER_STAGES if any(name in event.removed for event in events)]
    names = names or ["top_k", "top_p", "min_p"]
    letters = ", ".join(f"{BY_NAME[n].legend} ({BY_NAME[n].letter})" for n in names)
    parts = [f"removed: candidates dropped by {letters}"]
    parts += [f"{BY_NAME[n].legend} removed {count} at every step" for n, count in steady_removals(events).items()]
    if any(event.source == "draft" for event in events):
        parts.append("✓ accepted draft token")
    return "; ".join(parts)


def token_table(events: list[TokenEvent]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name, justify in (("#", "right"), ("token", "left"), ("p", "right"), ("p model", "right"), ("rank", "right"),
                          ("H bits", "right"), ("removed", "left"), ("top alternatives", "left")):  # fmt: skip
        table.add_column(name, justify=justify, overflow="fold")
    watched = watched_names(events)
    steady = steady_removals(events)
    for name in watched:  # --watch: each watched token's probability in the sampling distribution
        table.add_column(f"p {visible(name)}", justify="right", overflow="fold")
    for event in events:
        alternatives = "  ".join(f"{visible(c.text)} {c.prob:.2f}" for c in event.top if c.token_id != event.token_id)
        label = "<eos>" if event.eos else visible(event.text)
        if event.source == "draft":
            label += " ✓"  # an accepted draft token
        table.add_row(
            str(event.index),
            Text(label, style=band_for(event.prob).style),
            f"{event.prob:.3f}",
            f"{event.model_prob:.3f}",
            str(event.model_rank),
            f"{event.entropy:.2f}",
            removed_cell(event, steady),
            alternatives,
            *(f"{event.watch[name].prob:.3f}" if name in event.watch else "" for name in watched),
        )
    return table


def watched_names(events: list[TokenEvent]) -> list[str]:
    """The ``--watch`` texts these events carry, in the order given."""
    return list(dict.fromkeys(name for event in events for name in event.watch))


class InspectRenderer:
    """Collects events and prints their table once the text is complete."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.events: list[TokenEvent] = []

    def token(self, event: TokenEvent) -> None:
        self.events.append(event)

    def summary(self, summary: Summary) -> None:
        self.console.print()
        self.console.print(token_table(self.events))
        self.console.print(removed_legend(self.events))
