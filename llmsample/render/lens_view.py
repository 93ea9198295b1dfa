"""What ``explain --layers`` and ``explain --tree`` show: in the terminal (rich) and as a
self-contained page (``--html``: the layers as a heatmap, the tree as nested lists). Model text
is always escaped, never HTML."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from llmsample.render.bands import band_for
from llmsample.render.html import PAGE_STYLE
from llmsample.render.inspect import visible

if TYPE_CHECKING:  # types only: a renderer imports no torch
    from llmsample.analysis.lens_records import LayerReport
    from llmsample.engine.tree import Branch

LENS_STYLE = """
table.lens { border-collapse: collapse; font: 13px ui-monospace, monospace; }
.lens th, .lens td { padding: .15rem .5rem; text-align: right; border: 1px solid #8883; }
.lens th.chosen { text-decoration: underline; }
ul.tree { font: 14px ui-monospace, monospace; list-style: none; padding-left: 1.2rem; }
.tree .p { color: #777; }
"""


def reading(i: int) -> str:
    """The name of the ``i``-th reading: the embeddings, then layers counted from 1."""
    return "emb" if i == 0 else str(i)


def settled(report: LayerReport) -> str:
    at = report.settles_at()
    if at is None:
        return "the chosen token is not the model's top at the last layer (the preset chose otherwise)"
    return f"the chosen token is rank 1 from {'the embeddings' if at == 0 else f'layer {at}'} on"


def layers_table(report: LayerReport) -> Any:
    """Readings by row (embeddings, then each layer), tokens by column: rank and probability."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="the next token, layer by layer", box=None, pad_edge=False, header_style="bold")
    table.add_column("layer", justify="right")
    for i, token in enumerate(report.tokens):
        table.add_column(("* " if i == 0 else "") + visible(token.text), justify="right", max_width=12)
    for row in range(report.layers + 1):
        cells = [Text(f"{t.ranks[row]} {t.probs[row]:.2f}", style=band_for(t.probs[row]).style) for t in report.tokens]
        table.add_row(reading(row), *cells)
    table.caption = (
        "rank and probability of each token in each layer's residual stream read\n"
        f"through the final norm and the head (the logit lens); * chosen:\n{settled(report)}"
    )
    return table


def tree_view(branches: list[Branch], depth: int, width: int) -> Any:
    from rich.tree import Tree

    root = Tree(f"the {width} most likely next tokens, {depth} deep (p given the path; path p)")

    def grow(node: Any, children: list[Branch]) -> None:
        for branch in children:
            label = f"{visible(branch.text)}  {branch.prob:.3f}  path {branch.path_prob:.4f}"
            grow(node.add(label, style=band_for(branch.prob).style), branch.children)

    grow(root, branches)
    return root


def _document(title: str, body: str) -> str:
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{PAGE_STYLE}{LENS_STYLE}</style></head><body>{body}</body></html>\n"
    )


def layers_page(report: LayerReport, prompt: str) -> str:
    """A heatmap: a cell's shade is the token's probability at that layer, its text the rank."""
    heads = "".join(
        f"<th{' class=chosen' if i == 0 else ''}>{html.escape(visible(t.text))}</th>"
        for i, t in enumerate(report.tokens)
    )
    rows = []
    for row in range(report.layers + 1):
        cells = "".join(
            f'<td style="background:rgba(0,114,178,{t.probs[row]:.3f})" '
            f'title="p={t.probs[row]:.4f}">{t.ranks[row]}</td>'
            for t in report.tokens
        )
        rows.append(f"<tr><th>{reading(row)}</th>{cells}</tr>")
    body = (
        f"<h1>the next token, layer by layer</h1><pre>{html.escape(prompt)}</pre>"
        f'<table class="lens"><tr><th>layer</th>{heads}</tr>{"".join(rows)}</table>'
        f'<p class="meta">rank in each cell, shaded by probability (the logit lens); underlined: chosen. '
        f"{html.escape(settled(report))}</p>"
    )
    return _document("llmsample explain --layers", body)


def tree_page(branches: list[Branch], prompt: str) -> str:
    def items(children: list[Branch]) -> str:
        return "".join(
            f'<li><span style="color:{band_for(b.prob).hex}">{html.escape(visible(b.text))}</span> '
            f'<span class="p">{b.prob:.3f} (path {b.path_prob:.4f})</span>'
            + (f'<ul class="tree">{items(b.children)}</ul>' if b.children else "")
            + "</li>"
            for b in children
        )

    body = (
        f"<h1>the most likely continuations</h1><pre>{html.escape(prompt)}</pre>"
        f'<ul class="tree">{items(branches)}</ul>'
        '<p class="meta">each token with its probability given the path above it, and the path\'s</p>'
    )
    return _document("llmsample explain --tree", body)
