"""The options of a command that can run on a warm engine: ``--host`` / ``--local`` (which
engine: :func:`llmsample.client.route.choose`)."""

from __future__ import annotations

import click

from llmsample.commands.option_group import option_group

with_engine_options = option_group(
    click.option(
        "--host",
        metavar="URL",
        help="Run on this llmsample serve (http://HOST:PORT) [env: LLMSAMPLE_HOST; key: LLMSAMPLE_API_KEY].",
    ),
    click.option("--local", is_flag=True, help="Run in this process, even when a warm engine serves the model."),
    panel="Engine",
)
