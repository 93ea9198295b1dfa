"""The ``--html`` page on hand-made events: what was asked heads it (escaped, never markup), and a
watched token's plot has its axes and says when the chain removed it at every step."""

from __future__ import annotations

from llmsample.events import Summary, TokenEvent, Watched
from llmsample.render.html import PageHead, render_page


def event(index: int, watched: float, model: float) -> TokenEvent:
    watch = {"w5": Watched(5, watched, model, 3)}
    return TokenEvent(index, 7, "x", 0.5, 0.4, 1, 1.0, (), {}, watch=watch)


SUMMARY = Summary("xx", 2, 3, "length", None, None, model="m", preset="p", seed=1, elapsed_s=1.0)


def test_the_prompt_and_settings_head_the_page_as_text() -> None:
    head = PageHead('<img src=x onerror="alert(1)"> & w3', {"temperature": 0.7, "stop": ["</pre>"], "seed": None},
                    system="<script>alert(2)</script>")  # fmt: skip
    document = render_page([], SUMMARY, head=head)
    assert "<img" not in document and "<script" not in document and "</pre>&quot;" not in document
    assert '<pre class="prompt">&lt;img src=x onerror=&quot;alert(1)&quot;&gt; &amp; w3</pre>' in document
    assert "<td>temperature</td><td>0.7</td>" in document and "<td>seed</td><td>null</td>" in document
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in document
    assert "prompt and settings" not in render_page([], SUMMARY)  # no head, no section


def test_a_watched_token_at_zero_throughout_says_why_and_the_plot_has_axes() -> None:
    kept = render_page([event(0, 0.25, 0.3), event(1, 0.5, 0.6)], SUMMARY)
    removed = render_page([event(0, 0.0, 0.125), event(1, 0.0, 0.0625)], SUMMARY)
    assert "removed at every step (its highest under the raw model 0.1250)" in removed
    assert "removed at every step" not in kept and "highest 0.5000" in kept
    assert '<div class="y"><span>1</span><span>0.5</span><span>0</span></div>' in kept
    assert "<span>position 0</span><span>1</span>" in kept
