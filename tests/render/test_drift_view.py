"""The ``compare-models`` views: a fixed KL scale with marks that read without colour, a table
that fits 80 columns, an escaped page; and no torch behind any of them."""

from __future__ import annotations

import io
import math
import subprocess
import sys

import pytest
from rich.console import Console

from llmsample.analysis.drift_records import DriftToken, TopToken, summarize
from llmsample.render.drift_view import DRIFT_BANDS, drift_band, drift_page, drift_report, drift_text, format_kl
from tests.conftest import REPO


def token(index: int, text: str, kl: float, same_top: bool = True) -> DriftToken:
    return DriftToken(index, 5, text, 0.25, 0.125, kl, same_top, TopToken(5, "w5", 0.25), TopToken(6, "<w6>", 0.5))


TOKENS = [token(0, " a", 0.0), token(1, " <b>&", 2.5, same_top=False), token(2, "\n", 0.05)]
SUMMARY = summarize(TOKENS, [1.0, 0.1, 0.9], model_a="A", model_b="B", source="given", prompt_tokens=2, vocab=32)


@pytest.mark.parametrize(
    ("kl", "mark"), list(zip([0.0, 0.0099, 0.01, 0.099, 0.1, 0.3, 0.99, 1.0, math.inf], "··▂▂▄▆▆██", strict=True))
)
def test_fixed_bands(kl: float, mark: str) -> None:
    assert drift_band(kl).mark == mark


def test_small_kl_keeps_its_digits() -> None:
    assert [format_kl(x) for x in (0.0, 0.00012345, 0.001, 0.5)] == ["0.0000", "1.2e-04", "0.0010", "0.5000"]


def test_bands_are_ordered_and_distinct() -> None:
    lows = [band.low for band in DRIFT_BANDS]
    assert lows == sorted(lows, reverse=True) and lows[-1] == 0
    assert len({band.mark for band in DRIFT_BANDS}) == len({band.hex for band in DRIFT_BANDS}) == len(DRIFT_BANDS)


def test_text_is_coloured_by_band_and_underlined_where_tops_differ() -> None:
    text = drift_text(TOKENS)
    assert text.plain == " a <b>&\n"
    styles = {text.plain[span.start : span.end]: str(span.style) for span in text.spans}
    assert styles[" <b>&"] == "bold #d55e00 underline" and styles["\n"] == "#009e73"
    assert " a" not in styles  # agreeing tokens keep the terminal's own colour


def test_table_fits_80_columns_and_reads_without_colour() -> None:
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(drift_report(TOKENS, SUMMARY))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    table = out.getvalue()
    assert "2.5000" in table and "█" in table and "w5 / <w6>" in table and "·<b>&" in table
    assert "mean KL(A‖B) 0.8500 nats" in table and "same top token 66.7%" in table
    assert "expected acceptance if B drafted for A: 66.7%" in table
    assert "most divergent: #1 ·<b>& 2.5000, #2 ↵ 0.0500, #0 ·a 0.0000" in table


def test_page_is_self_contained_and_escaped() -> None:
    page = drift_page(TOKENS, SUMMARY)
    assert page.startswith("<!doctype html>") and "<script" not in page and "http" not in page
    assert "<b>&" not in page.replace("<b>&amp;", "") and "&lt;b&gt;&amp;" in page
    assert page.count('class="tok differs"') == 1 and page.count('class="tok"') == 2
    assert 'data-kl="2.5"' in page and "color:#d55e00" in page


def test_imports_without_torch() -> None:
    code = "import sys; sys.modules['torch'] = None; import llmsample.render.drift_view, llmsample.analysis.drift_records"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr.strip().splitlines()[-1]
