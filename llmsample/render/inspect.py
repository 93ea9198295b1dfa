"""``--inspect``: a table of every token's numbers after the text (the same numbers as JSONL)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from llmsample.events import Summary, TokenEvent
from llmsample.render.bands import band_for

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


def removed_cell(event: TokenEvent) -> str:
    short = {"top_k": "k", "top_p": "p", "min_p": "m"}
    return " ".join(f"{short[name]}{count}" for name, count in event.removed.items() if count) or "-"


def token_table(events: list[TokenEvent]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name, justify in (("#", "right"), ("token", "left"), ("p", "right"), ("p model", "right"), ("rank", "right"),
                          ("H bits", "right"), ("removed", "left"), ("top alternatives", "left")):  # fmt: skip
        table.add_column(name, justify=justify, overflow="fold")
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
            removed_cell(event),
            alternatives,
        )
    return table


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
        self.console.print("removed: candidates dropped by top-k (k), top-p (p), min-p (m); ✓ accepted draft token")
