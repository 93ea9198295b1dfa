"""``sweep --plot``: quality against diversity, one point per setting with its 95 % intervals as
error bars, the Pareto front drawn through the settings no other beats on both. matplotlib (the
``studio`` extra): it writes SVG, PNG and PDF itself, with no browser, and its SVG keeps each
point's id (``setting-N``), which the ``--html`` page makes clickable."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from llmsample.errors import RuntimeFailure, UserError
from llmsample.files import replace_whole
from llmsample.sweep.summary import HIGHER_IS_BETTER, SettingSummary

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FORMATS = (".svg", ".png", ".pdf")
LABELS = {
    "logprob": "mean log-probability under the model (T=1)",
    "judge_logprob": "mean log-probability under the judge",
    "entropy": "mean entropy of the sampling distribution (bits)",
    "distinct_1": "distinct-1 across seeds",
    "distinct_2": "distinct-2 across seeds",
    "distinct_3": "distinct-3 across seeds",
    "self_bleu": "self-BLEU across seeds",
}


def axis_label(metric: str) -> str:
    better = "higher" if HIGHER_IS_BETTER[metric] else "lower"
    return f"{LABELS[metric]} ({better} is better)"


def figure(summaries: Sequence[SettingSummary], x: str, y: str, title: str) -> Figure:
    """The picture; settings missing either figure are left out (say, no judge)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5.5), layout="constrained")
    ax = fig.add_subplot()
    front = []
    for i, summary in enumerate(summaries):
        mx, my = summary.metrics.get(x), summary.metrics.get(y)
        if mx is None or my is None:
            continue
        color = "#c0392b" if summary.front else "#2c3e50"
        ax.errorbar([mx.mean], [my.mean], xerr=[mx.half], yerr=[my.half], fmt="none", ecolor=color, alpha=0.5)
        ax.plot([mx.mean], [my.mean], "o", color=color, markersize=7, gid=f"setting-{i}")
        ax.annotate(summary.setting.name, (mx.mean, my.mean), textcoords="offset points", xytext=(5, 4), fontsize=7)
        if summary.front:
            front.append((mx.mean, my.mean))
    if len(front) > 1:
        xs, ys = zip(*sorted(front), strict=True)
        ax.plot(xs, ys, "--", color="#c0392b", linewidth=1, label="Pareto front")
        ax.legend(loc="best", fontsize=8)
    ax.set_xlabel(axis_label(x))
    ax.set_ylabel(axis_label(y))
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    return fig


def svg_text(fig: Figure) -> str:
    """The figure as an SVG element (no XML prolog), the same bytes for the same figure."""
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None})
    text = out.getvalue()
    return text[text.index("<svg") :]


def plot_format(path: Path) -> str:
    """The file's format from its suffix, checked before the sweep runs."""
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise UserError(f"--plot {path}: write .svg, .png, .pdf, or .html for the page")
    return suffix


def write_plot(path: Path, summaries: Sequence[SettingSummary], x: str, y: str, title: str) -> None:
    """The whole file or nothing: rendered in memory, then put in place in one step."""
    suffix = plot_format(path)
    out = io.BytesIO()
    metadata = {".svg": {"Date": None}, ".pdf": {"CreationDate": None}}.get(suffix)
    figure(summaries, x, y, title).savefig(out, format=suffix[1:], metadata=metadata)
    try:
        replace_whole(path, out.getvalue())
    except OSError as exc:
        raise RuntimeFailure(f"cannot write --plot {path} ({exc.strerror or exc}); nothing was written") from exc
