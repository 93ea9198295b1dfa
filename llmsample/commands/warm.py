"""A decoding command on a warm engine: ``--host`` / ``--local``, and ``generate`` through the
engine with the same renderers over the same records as in-process. Nothing here imports torch:
the command decides before anything heavy loads."""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any

import click

from llmsample.client.connection import Target, say, stream_job
from llmsample.client.wire import Job
from llmsample.commands.options import read_prompt, resolve_sampling
from llmsample.errors import RuntimeFailure

engine_options = [
    click.option(
        "--host",
        metavar="URL",
        help="Run on this llmsample serve (http://HOST:PORT) [env: LLMSAMPLE_HOST; key: LLMSAMPLE_API_KEY].",
    ),
    click.option("--local", is_flag=True, help="Run in this process, even when a warm engine serves the model."),
]


def with_engine_options(f: Any) -> Any:
    for option in reversed(engine_options):
        f = option(f)
    return f


def generate_on(target: Target, options: dict[str, Any]) -> None:
    """``generate`` on an engine: the settings resolved here as in-process (the seed drawn here),
    the prompt sent as text (the engine applies the chat template), the records rendered here."""
    from llmsample.commands.generate import build_renderers, consume
    from llmsample.events import RunStats

    preset, cfg = resolve_sampling(options)
    if cfg.seed is None:
        cfg = dataclasses.replace(cfg, seed=secrets.randbits(63))
    prompt = read_prompt(options["prompt"], options["raw"])
    job = Job(prompt, cfg, preset, options["system"], options["raw"], options["truncate"], options["top_n"],
              model=None if target.where.startswith("unix:") else options["model"])  # fmt: skip
    stats = RunStats(model=target.name or options["model"] or "", preset=preset, seed=cfg.seed)
    events = stream_job(target, job, say)
    try:
        summary = consume(events, build_renderers(options) if not options.get("silent") else [], stats,
                          options["quiet"])  # fmt: skip
    finally:
        events.close()  # a Ctrl-C: the connection closes, and the engine cancels the row
    if summary.stop_reason == "cancelled":
        raise RuntimeFailure(f"the engine at {target.where} stopped before the answer was done")
