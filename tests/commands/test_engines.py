"""Durations as ``start --keep-alive`` takes them and as ``ps`` shows them."""

from __future__ import annotations

import pytest

from llmsample.commands.engines import format_duration, parse_duration


@pytest.mark.parametrize("given", ["30m", "10m", "1h", "2h", "90m", "90s", "45s", "0.5s", "never"])
def test_a_duration_is_shown_as_it_was_given(given: str) -> None:
    assert format_duration(parse_duration(given)) == given


@pytest.mark.parametrize(("given", "shown"), [("1800", "30m"), ("3600s", "1h"), ("0.5h", "30m"), ("1.5m", "90s")])
def test_other_spellings_are_shown_in_the_largest_whole_unit(given: str, shown: str) -> None:
    assert format_duration(parse_duration(given)) == shown
