"""The options of a command that can run on a warm engine: ``--host`` / ``--local`` (which
engine: :func:`llmsample.client.route.choose`)."""

from __future__ import annotations

from typing import Any

import click

engine_options = [
    click.option(
        "--host",
        metavar="URL",
        help="Run on this llmsample serve (http://HOST:PORT) [env: LLMSAMPLE_HOST; key: LLMSAMPLE_API_KEY].",
    ),
    click.option("--local", is_flag=True, help="Run in this process, even when a warm engine serves the model."),
]


def with_engine_options(f: Any) -> Any:
    before = len(getattr(f, "__click_params__", []))
    for option in reversed(engine_options):
        f = option(f)
    for param in f.__click_params__[before:]:
        param.panel = "Engine"  # its --help heading (commands/help.py)
    return f
