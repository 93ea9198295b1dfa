"""Admission: the engine takes a request while its rows fit in the free rows and the queue
together (any request when nothing is in flight), refuses it otherwise, and every request it
took is answered, row for row. On the engine itself with a tiny model, no HTTP server."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsample.batch.requests import COMPLETIONS_URL
from llmsample.events import Summary
from llmsample.models.loading import LoadedModel, load_model
from llmsample.serve.engine import Busy, Engine
from llmsample.serve.mailbox import Mailbox
from llmsample.serve.parsing import parse_body
from llmsample.serve.request_rows import build_items
from llmsample.serve.state import ServeState
from tests.conftest import make_tiny_model


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_model(str(make_tiny_model(tmp_path_factory.mktemp("tiny"))), "cpu", "float32")


def submit(state: ServeState, n: int) -> tuple[Mailbox, int] | None:
    """A request of ``n`` rows on the running event loop: its mailbox, or None when refused."""
    body = {"prompt": "w3 w4", "max_tokens": 3, "n": n, "seed": 1}
    items, _ = build_items(state, parse_body(body, COMPLETIONS_URL, frozenset()), chat=False)
    box = Mailbox(asyncio.get_running_loop())
    try:
        state.engine.submit(items, box)
    except Busy as busy:
        assert busy.retry_after >= 1
        return None
    return box, n


async def answers(box: Mailbox, rows: int) -> list[Summary]:
    """Every row's end, waited for generously (a loaded machine is slow, never this slow)."""
    ends: list[Any] = []
    while len(ends) < rows:
        records = await asyncio.wait_for(box.take(), 120)
        assert records is not None
        ends += [record for _, record in records if not hasattr(record, "token_id")]
    return ends


async def burst_then_idle(state: ServeState, burst: list[int]) -> None:
    engine = state.engine
    capacity = engine.batch_size + engine.max_queue
    taken = [submit(state, n) for n in burst]  # all at once: the loop has not run a step yet
    used = 0
    for n, result in zip(burst, taken, strict=True):
        fits = used == 0 or used + n <= capacity
        assert (result is not None) == fits, (burst, capacity)
        used += n if fits else 0
    loop = threading.Thread(target=engine.run, name="engine")
    loop.start()
    try:
        for box, n in filter(None, taken):
            ends = await answers(box, n)
            assert len(ends) == n and all(isinstance(end, Summary) for end in ends)
            assert {end.stop_reason for end in ends} <= {"eos", "length"}
        assert engine.figures()["in_flight"] == 0
        # Idle again: a request of more rows than rows and queue together is taken, and answered.
        box, n = submit(state, capacity + 1) or pytest.fail("an idle engine refused a request")
        assert len(await answers(box, n)) == n
    finally:
        engine.shutdown()
        loop.join(60)
    assert not loop.is_alive()


@settings(max_examples=20, deadline=None)
@given(
    batch_size=st.integers(1, 4),
    max_queue=st.integers(0, 4),
    burst=st.lists(st.integers(1, 4), min_size=1, max_size=10),
)
def test_a_request_is_refused_only_when_rows_and_queue_are_full_and_every_taken_one_is_answered(
    lm: LoadedModel, batch_size: int, max_queue: int, burst: list[int]
) -> None:
    state = ServeState(lm, Engine(lm, batch_size, max_queue))
    asyncio.run(burst_then_idle(state, burst))


def test_a_burst_fills_every_row_and_the_queue(lm: LoadedModel) -> None:
    """The issue's numbers: 64 requests at once on 4 rows and 4 queue places: 8 taken."""
    state = ServeState(lm, Engine(lm, 4, 4))

    async def burst() -> int:
        taken = [submit(state, 1) for _ in range(64)]
        return sum(result is not None for result in taken)

    assert asyncio.run(burst()) == 8


def test_retry_after_is_about_how_long_an_answer_takes(lm: LoadedModel) -> None:
    engine = Engine(lm, 1, 0)
    assert engine.retry_after() == 1  # nothing answered yet
    engine.answer_s = 7.2
    assert engine.retry_after() == 8
