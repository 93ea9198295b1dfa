"""``sweep --html``: one self-contained page: the plot (its points clickable), the table of every
setting's figures, and, for the setting clicked, its samples coloured per token with each
token's alternatives on hover, as ``generate --html`` shows a run. Model text is escaped, never
markup; the only script shows and hides the samples."""

from __future__ import annotations

import html
import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from llmsample.client.wire import from_dict
from llmsample.render.html import STYLE, token_spans
from llmsample.sweep.plot import LABELS, figure, svg_text
from llmsample.sweep.summary import SettingSummary

PAGE_STYLE = """
.plot svg { max-width: 100%; height: auto; } .plot g[id^="setting-"] { cursor: pointer; }
table.figures { border-collapse: collapse; font-size: 13px; } .figures td, .figures th { padding: .2rem .6rem; }
.figures tr[data-setting] { cursor: pointer; } .figures tr[data-setting]:hover { outline: 1px solid #8888; }
.figures .front td:first-child::after { content: " \\2605"; color: #c0392b; }
.sample { margin: 1rem 0; border-top: 1px solid #8884; } .sample .meta { margin: .3rem 0; }
"""

SCRIPT = """
function show(i) {
  document.querySelectorAll('section.samples').forEach(s => { s.hidden = s.dataset.setting !== String(i); });
  const shown = document.querySelector(`section.samples[data-setting="${i}"]`);
  if (shown) shown.scrollIntoView({block: 'start'});
}
document.querySelectorAll('g[id^="setting-"]').forEach(g => g.addEventListener('click', () => show(g.id.slice(8))));
document.querySelectorAll('tr[data-setting]').forEach(r => r.addEventListener('click', () => show(r.dataset.setting)));
"""


def sweep_page(summaries: Sequence[SettingSummary], records: Sequence[dict[str, Any]], x: str, y: str,
               title: str) -> str:  # fmt: skip
    """The whole document."""
    plot = f'<figure class="plot">{svg_text(figure(summaries, x, y, title))}</figure>'
    hint = '<p class="meta">Click a point or a row to see that setting\'s samples.</p>'
    body = f"<h1>llmsample sweep</h1><p class=\"meta\">{html.escape(title)}</p>{plot}{hint}{_table(summaries)}"
    mine: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        mine[record["setting"]].append(record)
    body += "".join(_samples(i, s, mine[s.setting.name]) for i, s in enumerate(summaries))
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>llmsample sweep</title>'
        f"<style>{STYLE}{PAGE_STYLE}</style></head><body>{body}<script>{SCRIPT}</script></body></html>\n"
    )


def _table(summaries: Sequence[SettingSummary]) -> str:
    keys = [key for key in LABELS if any(s.metrics.get(key) is not None for s in summaries)]
    keys += [key for key in ("repeats", "loops", "early_end", "off_language")]
    head = "".join(f"<th>{html.escape(key)}</th>" for key in ["setting", "samples", *keys])
    rows = []
    for i, summary in enumerate(summaries):
        cells = [summary.setting.name, str(summary.samples)]
        for key in keys:
            value = summary.metrics.get(key)
            cells.append("" if value is None else f"{value.mean:.3f} ± {value.half:.3f}")
        row = "".join(f"<td>{html.escape(cell)}</td>" for cell in cells)
        rows.append(f'<tr data-setting="{i}"{" class=front" if summary.front else ""}>{row}</tr>')
    return f'<table class="figures"><tr>{head}</tr>{"".join(rows)}</table>'


def _samples(index: int, summary: SettingSummary, records: list[dict[str, Any]]) -> str:
    parts = []
    for record in records:
        if "error" in record:
            meta = f"prompt {record['prompt_index']} · failed: {record['error'].get('message', '')}"
            parts.append(f'<div class="sample"><p class="meta">{html.escape(meta)}</p></div>')
            continue
        events = [from_dict({"type": "token", **token}) for token in record.get("per_token") or []]
        meta = (f"prompt {record['prompt_index']} · seed {record.get('seed')} · {record.get('tokens')} tokens · "
                f"stop: {record.get('stop_reason')} · metrics {json.dumps(record.get('metrics'))}")  # fmt: skip
        parts.append(f'<div class="sample"><p class="meta">{html.escape(meta)}</p>{token_spans(events)}</div>')  # type: ignore[arg-type]
    name = html.escape(summary.setting.name)
    return f'<section class="samples" data-setting="{index}" hidden><h2>{name}</h2>{"".join(parts)}</section>'
