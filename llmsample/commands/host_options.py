"""The options of a command that can run on a warm engine: ``--host`` / ``--local`` (which
engine: :func:`llmsample.client.route.choose`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from llmsample.commands.option_group import option_group

if TYPE_CHECKING:
    from llmsample.client.connection import Target
    from llmsample.client.engine_client import EngineClient

with_engine_options = option_group(
    click.option(
        "--host",
        metavar="URL",
        help="Run on this llmsample serve (http://HOST:PORT) [env: LLMSAMPLE_HOST; key: LLMSAMPLE_API_KEY].",
    ),
    click.option("--local", is_flag=True, help="Run in this process, even when a warm engine serves the model."),
    panel="Engine",
)


def open_engine(options: dict[str, Any], refused: list[str] | None = None) -> EngineClient:
    """The engine a command runs on, chosen before anything heavy is imported
    (:func:`~llmsample.client.route.choose`): a warm one, or this process's, which loads the
    model when first asked. ``refused``: the command's own flags an engine cannot honour."""
    from llmsample.client.route import choose

    return engine_at(choose(options, refused), options)


def engine_at(target: Target | None, options: dict[str, Any]) -> EngineClient:
    """The client for a chosen engine: ``target``'s, or this process's (None)."""
    if target is None:
        from llmsample.commands.model_options import local_engine

        return local_engine(options)
    from llmsample.client.engine_client import RemoteEngine

    return RemoteEngine(target)
