"""Views of ``compare-models``: the continuation coloured by how far B drifts from A, a table of
every token, a summary, and a self-contained HTML page. Torch-free: they read drift records only.

The colour scale is fixed (not relative to the run), so two runs can be compared by eye, and each
band also has a mark (``·`` ``▂`` ``▄`` ``▆`` ``█``) so the table reads without colour."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Group
from rich.table import Table
from rich.text import Text

from llmsample.analysis.drift_records import DriftSummary, DriftToken
from llmsample.render.html import PAGE_STYLE
from llmsample.render.inspect import visible


@dataclass(frozen=True)
class DriftBand:
    low: float  # inclusive lower bound of KL(A‖B), nats
    label: str
    mark: str  # the band without colour
    style: str  # rich style
    hex: str  # for HTML


# The probability view's Okabe-Ito colours, in the same order of alarm.
DRIFT_BANDS = (
    DriftBand(1.0, "≥1", "█", "bold #d55e00", "#d55e00"),
    DriftBand(0.3, "0.3-1", "▆", "#e69f00", "#e69f00"),
    DriftBand(0.1, "0.1-0.3", "▄", "#56b4e9", "#56b4e9"),
    DriftBand(0.01, "0.01-0.1", "▂", "#009e73", "#009e73"),
    DriftBand(0.0, "<0.01", "·", "", "inherit"),
)


def drift_band(kl: float) -> DriftBand:
    for band in DRIFT_BANDS:
        if kl >= band.low:
            return band
    return DRIFT_BANDS[-1]


def drift_legend() -> Text:
    """One line: the scale, from agreeing to far apart."""
    text = Text("KL(A‖B), nats: ")
    for band in reversed(DRIFT_BANDS):
        text.append(f" {band.mark} {band.label} ", style=band.style or "default")
    return text


def drift_text(tokens: Sequence[DriftToken]) -> Text:
    """The continuation, each token in its band's colour; where the two models' top tokens
    differ it is underlined too."""
    text = Text()
    for token in tokens:
        style = drift_band(token.kl).style
        if not token.same_top:
            style = f"{style} underline".strip()
        text.append(token.text, style=style or None)
    return text


def format_kl(kl: float) -> str:
    """Four decimals, or two significant digits below 0.001 (a quantized copy drifts by ~1e-4)."""
    if kl == 0 or kl >= 0.001:
        return f"{kl:.4f}"
    return f"{kl:.1e}"


def _percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def drift_table(tokens: Sequence[DriftToken], summary: DriftSummary) -> Table:
    """Every token: p under A and B, KL with its band mark, and the tops where they differ."""
    table = Table(
        title=f"A = {summary.model_a}  B = {summary.model_b}",
        box=None,
        pad_edge=False,
        header_style="bold",
    )
    for name, justify in (("#", "right"), ("token", "left"), ("p A", "right"), ("p B", "right"),
                          ("KL", "right"), ("", "left"), ("top A / top B", "left")):  # fmt: skip
        table.add_column(name, justify=justify, overflow="fold", max_width=14 if name == "token" else None)
    for token in tokens:
        band = drift_band(token.kl)
        tops = (
            Text("same")
            if token.same_top
            else Text(f"{visible(token.top_a.text)} / {visible(token.top_b.text)}", style="bold")
        )
        table.add_row(
            str(token.index),
            visible(token.text),
            f"{token.prob_a:.4f}",
            f"{token.prob_b:.4f}",
            Text(format_kl(token.kl), style=band.style),
            Text(band.mark, style=band.style),
            tops,
        )
    return table


def drift_report(tokens: Sequence[DriftToken], summary: DriftSummary) -> Group:
    """The text view: the coloured continuation, the table, then the summary lines (not a caption,
    which rich would wrap to the table's width)."""
    return Group(
        drift_text(tokens), Text(), drift_table(tokens, summary), Text(), Text("\n".join(summary_lines(summary)))
    )


def summary_lines(summary: DriftSummary) -> list[str]:
    divergent = ", ".join(f"#{d.index} {visible(d.text)} {format_kl(d.kl)}" for d in summary.most_divergent)
    return [
        f"{summary.tokens} tokens · mean KL(A‖B) {format_kl(summary.mean_kl)} nats (max {format_kl(summary.max_kl)}) · "
        f"same top token {_percent(summary.same_top_rate)}",
        f"expected acceptance if B drafted for A: {_percent(summary.expected_acceptance)}",
        f"most divergent: {divergent}",
    ]


STYLE = (
    PAGE_STYLE
    + """
.tok.differs { text-decoration: underline; }
table.divergent { border-collapse: collapse; font-size: 14px; } .divergent td, .divergent th { padding: 0 .8rem 0 0; }
"""
)


def _token_span(token: DriftToken) -> str:
    band = drift_band(token.kl)
    tops = (
        f"top token agrees: {html.escape(repr(token.top_a.text))}"
        if token.same_top
        else f"top A {html.escape(repr(token.top_a.text))} ({token.top_a.prob:.4f}) · "
        f"top B {html.escape(repr(token.top_b.text))} ({token.top_b.prob:.4f})"
    )
    tip = (
        f'<span class="tip" role="tooltip">#{token.index} {html.escape(repr(token.text))} '
        f'p<sub>A</sub>=<b class="prob-a">{token.prob_a:.4f}</b> p<sub>B</sub>=<b class="prob-b">{token.prob_b:.4f}</b> '
        f'KL=<b class="kl">{format_kl(token.kl)}</b> nats<br>{tops}</span>'
    )
    classes = "tok" if token.same_top else "tok differs"
    return (
        f'<span class="{classes}" tabindex="0" data-index="{token.index}" data-token-id="{token.token_id}" '
        f'data-kl="{token.kl!r}" style="color:{band.hex}">{html.escape(token.text)}{tip}</span>'
    )


def drift_page(tokens: Sequence[DriftToken], summary: DriftSummary) -> str:
    """A whole document: styles inline, no scripts, no external assets."""
    legend = "".join(
        f'<span style="color:{b.hex}">{html.escape(b.mark)} {html.escape(b.label)}</span>'
        for b in reversed(DRIFT_BANDS)
    )
    meta = f"A = {summary.model_a} · B = {summary.model_b} · continuation {summary.source} · {summary.tokens} tokens"
    rows = "".join(
        f"<tr><td>#{d.index}</td><td>{html.escape(repr(d.text))}</td><td>{format_kl(d.kl)}</td></tr>"
        for d in summary.most_divergent
    )
    figures = "".join(f"<li>{html.escape(line)}</li>" for line in summary_lines(summary)[:2])
    body = (
        f'<p class="meta">{html.escape(meta)}</p>'
        f'<p class="legend">KL(A‖B), nats: {legend} · underlined: the top tokens differ</p>'
        f'<div class="text">{"".join(_token_span(t) for t in tokens)}</div>'
        f'<ul class="summary">{figures}</ul>'
        f'<table class="divergent"><tr><th>position</th><th>token</th><th>KL</th></tr>{rows}</table>'
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>llmsample compare-models</title>'
        f"<style>{STYLE}</style></head><body><h1>Model against model</h1>{body}</body></html>\n"
    )
