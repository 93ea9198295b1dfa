"""Text on stdout as it is sampled: plain when piped, coloured by probability on a terminal."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Protocol, TextIO

from llmsample.events import Summary, TokenEvent
from llmsample.render.bands import BANDS, band_for
from llmsample.render.jsonout import strict_json

if TYPE_CHECKING:  # rich is imported by the renderers that colour: piped text starts without it
    from rich.console import Console
    from rich.text import Text


class Renderer(Protocol):
    def token(self, event: TokenEvent) -> None: ...

    def summary(self, summary: Summary) -> None: ...


class PlainRenderer:
    """Exactly the generated text, nothing else: what scripts read."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout

    def token(self, event: TokenEvent) -> None:
        if event.text:
            self.out.write(event.text)
            self.out.flush()

    def summary(self, summary: Summary) -> None:
        self.out.write("\n")
        self.out.flush()


class OneLineRenderer(PlainRenderer):
    """Plain text, each reply on one line: a newline in it is written ``\\n``, a carriage return
    ``\\r``, a backslash ``\\\\`` (``printf '%b'`` undoes it). Piped ``chat``, so that a script
    reads one reply per line (``while IFS= read -r reply``) whatever the replies hold."""

    ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r"})

    def token(self, event: TokenEvent) -> None:
        if event.text:
            self.out.write(event.text.translate(self.ESCAPES))
            self.out.flush()


class ColorRenderer:
    """Appends each token in its band's colour; the screen is never redrawn, so it stays live."""

    def __init__(self, console: Console, color_by: str = "sampled") -> None:
        from rich.text import Text  # once, not at every token

        self.console = console
        self.color_by = color_by
        self.text = Text

    def token(self, event: TokenEvent) -> None:
        if not event.text:
            return
        prob = event.prob if self.color_by == "sampled" else event.model_prob
        style = band_for(prob).style
        if event.source == "draft":
            style = f"{style} underline".strip()
        self.console.print(self.text(event.text, style=style), end="")
        self.console.file.flush()

    def summary(self, summary: Summary) -> None:
        self.console.print()


class JsonlRenderer:
    """One JSON object per token and a summary line (schema in the README)."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout

    def _write(self, data: dict) -> None:
        self.out.write(strict_json(data) + "\n")
        self.out.flush()

    def token(self, event: TokenEvent) -> None:
        self._write(event.to_dict())

    def summary(self, summary: Summary) -> None:
        self._write(summary.to_dict())


def legend(color_by: str) -> Text:
    """One line for stderr: the colour scale."""
    from rich.text import Text

    text = Text(f"p({color_by}): ")
    for band in reversed(BANDS):
        text.append(f" {band.label} ", style=band.style or "default")
    return text


def summary_lines(summary: Summary, width: int | None, first_token_s: float | None = None) -> str:
    """The figures broken between parts to fit a terminal's ``width``, never inside one (a wrapped
    "1.2 tok/s" reads as two figures); one line when ``width`` is None. ``first_token_s``: see
    :func:`summary_parts`."""
    lines: list[str] = []
    for part in summary_parts(summary, first_token_s):
        if lines and (width is None or len(lines[-1]) + len(" · ") + len(part) <= width):
            lines[-1] += " · " + part
        else:
            lines.append(part)
    return "\n".join(lines)


def print_summary(console: Console, summary: Summary, first_token_s: float | None = None) -> None:
    """The dim summary on stderr: fitted to a terminal, one line into a pipe or a file."""
    from rich.text import Text

    width = console.width if console.is_terminal else None
    console.print(Text(summary_lines(summary, width, first_token_s), style="dim"))


def summary_parts(summary: Summary, first_token_s: float | None = None) -> list[str]:
    """The summary's figures. ``first_token_s``: the wait for the first token from the command's
    start, which is what its user waited (a load and the start-up in it); without it the row's
    own ``ttft_s``, from the row's start."""
    parts = [f"{summary.tokens} tokens", f"stop: {summary.stop_reason}"]
    if summary.facts.load_s is not None:
        parts.append(f"load {summary.facts.load_s:.2f} s")
    first = first_token_s if first_token_s is not None else summary.ttft_s
    if first is not None:
        parts.append(f"first token {first:.2f} s")
    if summary.tokens_per_s is not None:
        parts.append(f"{summary.tokens_per_s:.1f} tok/s")
    facts = summary.facts
    if (spec := facts.speculation) is not None and not spec.drafted:
        parts.append("drafted nothing")  # --draft auto found nothing it expected kept
    elif spec is not None:
        parts.append(f"accepted {spec.accepted}/{spec.drafted} drafted ({spec.acceptance_rate:.0%})")
        parts.append(f"{spec.tokens_per_pass:.2f} tokens/target pass")
    if (reference := facts.reference) is not None and reference.tokens:
        parts.append(f"vs {reference.dtype}: mean KL {reference.mean_kl:.4f} nats, same top {reference.same_top:.1%}")
    if (comparison := facts.comparison) is not None and comparison.speedup is not None:
        parts.append(f"plain loop {comparison.plain_tokens_per_s:.1f} tok/s: {said_speedup(comparison.speedup)}")
    if (cache := facts.cache) is not None:  # a chat turn: what its session's cache spared
        parts.append(f"prompt {cache.reused} cached + {cache.prefilled} prefilled")
    if facts.backend == "llama.cpp":
        parts.append(f"{facts.device} llama.cpp {facts.quantization or ''}".rstrip())
    elif facts.device is not None:
        parts.append(f"{facts.device} {facts.dtype}")
    if facts.engine is not None:
        parts.append(f"engine {facts.engine}")
    return parts


def said_speedup(speedup: float) -> str:
    """Speculation against the plain loop in words: a ratio under 1 read as "0.65x speedup" looks
    like a gain to most readers, so a loss is said as how many times slower it was."""
    if round(speedup, 2) >= 1:
        return f"{speedup:.2f}x speedup"
    return f"speculation {1 / speedup:.2f}x slower"
