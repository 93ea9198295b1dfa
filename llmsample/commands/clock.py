"""When the command started: what the summary line counts a user's wait for the first token from
(a model's load and the start-up in it), kept in the click context's ``meta`` by the group."""

from __future__ import annotations

import click

STARTED = "llmsample.started"
"""The ``meta`` key of the command's start, a ``time.perf_counter()`` reading."""


def since_start(at: float) -> float | None:
    """Seconds from the command's start to ``at`` (a ``perf_counter`` reading); None for a
    command run outside the ``llmsample`` group."""
    ctx = click.get_current_context(silent=True)
    started = ctx.meta.get(STARTED) if ctx is not None else None
    return None if started is None else at - started
