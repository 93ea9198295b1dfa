"""``--html FILE``: one self-contained page (no external assets) with the text coloured by
probability and each token's alternatives on hover or keyboard focus."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmsample.errors import RuntimeFailure
from llmsample.events import Summary, TokenEvent
from llmsample.files import replace_whole
from llmsample.render.bands import BANDS, band_for
from llmsample.sampling.stages import label

PAGE_STYLE = """
body { font: 16px/1.6 system-ui, sans-serif; margin: 2rem auto; max-width: 60rem; padding: 0 1rem;
       color: #1b1b1b; background: #fdfdfd; }
@media (prefers-color-scheme: dark) { body { color: #e8e8e8; background: #161616; }
  .tip { background: #262626 !important; color: #e8e8e8; } }
.text { white-space: pre-wrap; font-family: ui-monospace, monospace; }
.tok { position: relative; border-radius: 3px; cursor: help; }
.tok:hover, .tok:focus { outline: 1px solid currentColor; }
.tip { display: none; position: absolute; left: 0; top: 1.6em; z-index: 1; min-width: 16rem;
       background: #fff; color: #1b1b1b; border: 1px solid #888; padding: .4rem; font: 13px/1.4 system-ui;
       white-space: normal; box-shadow: 0 2px 8px #0004; }
.tok:hover .tip, .tok:focus .tip { display: block; }
.legend span { padding: 0 .4rem; } .meta { color: #777; font-size: 13px; }
"""
"""What every page of ours shares: text with a tooltip per token, light and dark."""

STYLE = (
    PAGE_STYLE
    + """
.tok.draft { text-decoration: underline; }
.tip table { border-collapse: collapse; } .tip td { padding: 0 .5rem 0 0; }
.watch { margin-top: 1.5rem; } .watch figure { margin: .5rem 0; }
.watch .plot { display: grid; grid-template-columns: 2.2rem minmax(0, 40rem); font: 12px system-ui; color: #777; }
.watch .y { display: flex; flex-direction: column; justify-content: space-between; height: 6rem; text-align: right;
            padding-right: .3rem; }
.watch .x { grid-column: 2; display: flex; justify-content: space-between; }
.watch svg { width: 100%; height: 6rem; border: 1px solid #8884; }
.watch polyline { fill: none; stroke: #0072b2; stroke-width: 1.5; vector-effect: non-scaling-stroke; }
.watch line { stroke: #8884; stroke-dasharray: 2 3; vector-effect: non-scaling-stroke; }
.watch figcaption { font: 13px system-ui; color: #777; }
.head pre { white-space: pre-wrap; margin: .3rem 0; } .head table { font-size: 13px; border-collapse: collapse; }
.head td { padding: 0 .8rem 0 0; }
"""
)

PLOT_WIDTH, PLOT_HEIGHT = 400, 100


def _tooltip(event: TokenEvent) -> str:
    rows = "".join(
        f'<tr class="alt"><td>{html.escape(repr(c.text))}</td><td class="p">{c.prob:.4f}</td>'
        f'<td class="pm">{c.model_prob:.4f}</td></tr>'
        for c in event.top
    )
    removed = ", ".join(f"{label(name)} {count}" for name, count in event.removed.items() if count)
    return (
        f'<span class="tip" role="tooltip">#{event.index} {html.escape(repr(event.text))} '
        f'p=<b class="prob">{event.prob:.4f}</b> model=<span class="model-prob">{event.model_prob:.4f}</span> '
        f"rank {event.model_rank}, entropy {event.entropy:.2f} bits"
        + (f'<br><span class="removed">removed: {html.escape(removed)}</span>' if removed else "")
        + f"<table><tr><th>token</th><th>p</th><th>model</th></tr>{rows}</table></span>"
    )


def token_spans(events: list[TokenEvent], color_by: str = "sampled") -> str:
    spans = []
    for event in events:
        prob = event.prob if color_by == "sampled" else event.model_prob
        classes = "tok draft" if event.source == "draft" else "tok"
        spans.append(
            f'<span class="{classes}" tabindex="0" data-index="{event.index}" data-token-id="{event.token_id}" '
            f'data-prob="{event.prob:.6f}" style="color:{band_for(prob).hex}">'
            f"{html.escape(event.text)}{_tooltip(event)}</span>"
        )
    return f'<div class="text">{"".join(spans)}</div>'


def watch_plots(events: list[TokenEvent]) -> str:
    """``--watch``: per watched token, an inline SVG line of its sampled probability by position,
    with its axes (probability 0 to 1, the first and last position); a token the chain kept at 0
    throughout says so, with its highest probability under the raw model."""
    names = list(dict.fromkeys(name for event in events for name in event.watch))
    figures = "".join(_watch_plot(events, name) for name in names)
    return f'<section class="watch"><h2>watched tokens</h2>{figures}</section>' if figures else ""


def _watch_plot(events: list[TokenEvent], name: str) -> str:
    seen = [(event.index, event.watch[name]) for event in events if name in event.watch]
    last = max(len(events) - 1, 1)
    points = " ".join(
        f"{index * PLOT_WIDTH / last:.1f},{(1 - min(max(w.prob, 0.0), 1.0)) * PLOT_HEIGHT:.1f}" for index, w in seen
    )
    grid = "".join(f'<line x1="0" x2="{PLOT_WIDTH}" y1="{y}" y2="{y}"/>' for y in (PLOT_HEIGHT // 2,))
    token_id = seen[0][1].token_id
    peak = max(w.prob for _, w in seen)
    caption = f"p({html.escape(repr(name))}, id {token_id}) in the sampling distribution by position; highest {peak:.4f}"
    if peak == 0:
        model_peak = max(w.model_prob for _, w in seen)
        caption += f": removed at every step (its highest under the raw model {model_peak:.4f})"
    return (
        f'<figure class="watched" data-watch="{html.escape(name)}" data-token-id="{token_id}"><div class="plot">'
        '<div class="y"><span>1</span><span>0.5</span><span>0</span></div>'
        f'<svg viewBox="0 0 {PLOT_WIDTH} {PLOT_HEIGHT}" preserveAspectRatio="none" role="img" '
        f'aria-label="probability of {html.escape(repr(name))} by position">{grid}<polyline points="{points}"/></svg>'
        f'<div class="x"><span>position {events[0].index if events else 0}</span>'
        f"<span>{events[-1].index if events else 0}</span></div></div><figcaption>{caption}</figcaption></figure>"
    )


@dataclass(frozen=True)
class PageHead:
    """What the run was asked: the prompt as given (and the system message), and its settings."""

    prompt: str
    settings: dict[str, Any]
    system: str | None = None

    def html(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(key)}</td><td>{html.escape(json.dumps(value, ensure_ascii=False))}</td></tr>"
            for key, value in self.settings.items()
            if key != "description"
        )
        system = f"<h3>system</h3><pre>{html.escape(self.system)}</pre>" if self.system else ""
        return (
            f'<details class="head" open><summary>prompt and settings</summary>{system}'
            f'<pre class="prompt">{html.escape(self.prompt)}</pre><table class="settings">{rows}</table></details>'
        )


def page(body: str, color_by: str = "sampled", title: str = "llmsample") -> str:
    """A whole document: styles inline, no scripts, no external assets."""
    legend = "".join(f'<span style="color:{b.hex}">{html.escape(b.label)}</span>' for b in reversed(BANDS))
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f'<style>{STYLE}</style></head><body><p class="legend">p({color_by}): {legend}</p>{body}</body></html>\n'
    )


def render_page(
    events: list[TokenEvent], summary: Summary, color_by: str = "sampled", head: PageHead | None = None
) -> str:
    meta = (
        f"{summary.model} · preset {summary.preset} · seed {summary.seed} · {summary.tokens} tokens · "
        f"stop: {summary.stop_reason}"
    )
    asked = head.html() if head is not None else ""
    body = f'<p class="meta">{html.escape(meta)}</p>{asked}{token_spans(events, color_by)}{watch_plots(events)}'
    return page(body, color_by)


def compare_page(runs: list[tuple[str, int, list[TokenEvent]]]) -> str:
    """``compare-presets``: one section per preset and sample."""
    sections = "".join(
        f"<h2>{html.escape(preset)} <small>sample {sample}</small></h2>{token_spans(events)}"
        for preset, sample, events in runs
    )
    return page(sections, title="llmsample compare-presets")


def write_page(path: Path, document: str) -> None:
    """The whole page or nothing (:func:`~llmsample.files.replace_whole`): a full disk or an
    interrupt never leaves half a page (or clobbers the old one). The directory was checked
    before the run; a failure now is a runtime failure (exit 1)."""
    try:
        replace_whole(path, document.encode("utf-8"))
    except OSError as exc:
        raise RuntimeFailure(f"cannot write --html {path} ({exc.strerror or exc}); nothing was written") from exc


class HtmlRenderer:
    def __init__(self, path: Path, color_by: str = "sampled", head: PageHead | None = None) -> None:
        self.path = path
        self.color_by = color_by
        self.head = head
        self.events: list[TokenEvent] = []

    def token(self, event: TokenEvent) -> None:
        self.events.append(event)

    def summary(self, summary: Summary) -> None:
        write_page(self.path, render_page(self.events, summary, self.color_by, self.head))
