"""A chat's reply in this process: a row that fails ends the reply in one line, and the
session's turn is closed whatever happens."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from llmsample.api.local import raised_failures
from llmsample.engine.row_state import RowFailed
from llmsample.errors import RuntimeFailure


def test_a_failed_row_is_raised_and_the_turn_closed() -> None:
    closed = []

    def turn() -> Generator[Any, None, None]:
        try:
            yield 0, "an event"
            yield 0, RowFailed(0, "the logits came out NaN")
            yield 0, "never reached"
        finally:
            closed.append(True)

    inner = turn()  # held here: only an explicit close ends it, not the collector
    records = raised_failures(inner)
    assert next(records) == "an event"
    with pytest.raises(RuntimeFailure, match="the logits came out NaN"):
        next(records)
    assert closed == [True]


def test_closing_the_reply_closes_the_turn() -> None:
    closed = []

    def turn() -> Generator[Any, None, None]:
        try:
            yield 0, "an event"
            yield 0, "another"
        finally:
            closed.append(True)

    inner = turn()
    records = raised_failures(inner)
    next(records)
    records.close()  # Ctrl-C mid-reply: the session starts its cache afresh
    assert closed == [True]
