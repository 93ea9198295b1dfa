"""The ``--inspect`` table on hand-made events: what changes from row to row is in the rows, what
never changes is said once in the legend."""

from __future__ import annotations

from rich.console import Console

from llmsample.events import TokenEvent
from llmsample.render.inspect import removed_legend, token_table


def event(index: int, removed: dict[str, int], source: str = "target") -> TokenEvent:
    return TokenEvent(index, 7, "x", 0.5, 0.4, 1, 1.0, (), removed, source=source)


def rendered(events: list[TokenEvent]) -> str:
    console = Console(width=120, color_system=None)
    with console.capture() as capture:
        console.print(token_table(events))
    return capture.get()


def test_a_count_that_never_changes_moves_to_the_legend() -> None:
    events = [event(i, {"top_k": 49102, "top_p": p, "min_p": 0}) for i, p in enumerate((40, 48, 0))]
    table = rendered(events)
    assert "k49102" not in table and "p40" in table and "p48" in table
    rows = table.splitlines()[1:]
    assert rows[2].split()[-1] == "-"  # the third step: only the steady top-k, so nothing left to show
    legend = removed_legend(events)
    assert "top-k removed 49102 at every step" in legend and "top-p removed" not in legend


def test_the_draft_mark_is_explained_only_when_a_draft_token_is_shown() -> None:
    plain = [event(0, {"top_k": 5}), event(1, {"top_k": 3})]
    assert "draft" not in removed_legend(plain)
    assert "k5" in rendered(plain) and "k3" in rendered(plain)  # it changes: it stays in the rows
    assert "✓ accepted draft token" in removed_legend([*plain, event(2, {"top_k": 4}, source="draft")])


def test_one_token_keeps_its_counts_in_the_row() -> None:
    assert "k49102" in rendered([event(0, {"top_k": 49102})])


def test_a_summary_breaks_between_its_figures_never_inside_one() -> None:
    from llmsample.events import Summary
    from llmsample.render.stream import summary_lines

    summary = Summary("", 6, 3, "length", ttft_s=2.53, tokens_per_s=1.2, model="m", preset="p", seed=1, elapsed_s=5.0)
    one = summary_lines(summary, None)
    assert one == "6 tokens · stop: length · first token 2.53 s · 1.2 tok/s"
    assert summary_lines(summary, 40).splitlines() == ["6 tokens · stop: length", "first token 2.53 s · 1.2 tok/s"]
    assert summary_lines(summary, len(one)) == one


def test_a_summary_names_the_load_and_the_wait_for_the_first_token() -> None:
    from llmsample.events import RunFacts, Summary
    from llmsample.render.stream import summary_lines

    facts = RunFacts(load_s=17.04)
    summary = Summary("", 6, 3, "length", ttft_s=1.31, tokens_per_s=1.2, model="m", preset="p", seed=1, elapsed_s=5.0,
                      facts=facts)  # fmt: skip
    assert summary_lines(summary, None, first_token_s=18.6) == (
        "6 tokens · stop: length · load 17.04 s · first token 18.60 s · 1.2 tok/s"
    )
    assert "first token 1.31 s" in summary_lines(summary, None)  # no command's start: the row's own


def test_a_comparison_below_one_is_said_as_a_slowdown() -> None:
    """Issue 60: ``speculate --compare`` slower than the plain loop says so in words, not as a
    "0.65x speedup" a reader takes for a gain."""
    from llmsample.events import PlainComparison, RunFacts, Summary
    from llmsample.render.stream import summary_lines

    def said(speedup: float) -> str:
        facts = RunFacts(comparison=PlainComparison(40.0, 1.0, speedup))
        return summary_lines(Summary("", 6, 3, "length", ttft_s=0.1, tokens_per_s=40.0 * speedup, model="m", preset="p", seed=1,
                                     elapsed_s=1.0, facts=facts), None)  # fmt: skip

    assert "plain loop 40.0 tok/s: 1.65x speedup" in said(1.65)
    assert "plain loop 40.0 tok/s: speculation 1.54x slower" in said(0.65)
    assert "0.65" not in said(0.65) and "speedup" not in said(0.65)
