"""The server's queue runs work on the loop's own thread (``QueueFeed.call``): between two
steps, or at once when the loop is idle and waiting; a closed feed fails what has not run."""

from __future__ import annotations

import threading

import pytest

from llmsample.engine.feed import QueueFeed
from llmsample.engine.row_state import BatchItem


def test_an_idle_loop_runs_a_call_and_goes_on_waiting() -> None:
    feed = QueueFeed()
    taken: list[list[BatchItem]] = []
    loop = threading.Thread(target=lambda: taken.append(feed.take(4, wait=True)))
    loop.start()
    future = feed.call(threading.get_ident)
    assert future.result(timeout=10) == loop.ident  # on the loop's thread, woken from its wait
    assert loop.is_alive() and not taken  # and still waiting: an empty take would end the loop
    feed.close()
    loop.join(10)
    assert taken == [[]]


def test_a_busy_loop_runs_a_call_between_steps() -> None:
    feed = QueueFeed()
    future = feed.call(lambda: 1 / 0)
    assert not future.done()  # nothing looked at the feed yet
    assert feed.cancelled() == frozenset()  # a step's look
    with pytest.raises(ZeroDivisionError):
        future.result(timeout=0)


def test_a_closed_feed_fails_what_has_not_run() -> None:
    feed = QueueFeed()
    pending = feed.call(lambda: 1)
    feed.close()
    with pytest.raises(RuntimeError, match="closed"):
        pending.result(timeout=0)
    with pytest.raises(RuntimeError, match="closed"):
        feed.call(lambda: 1)
