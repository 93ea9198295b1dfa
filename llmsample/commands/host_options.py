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


def open_engine(options: dict[str, Any], refused: list[str] | None = None, restart: bool = False) -> EngineClient:
    """The engine a command runs on, chosen before anything heavy is imported
    (:func:`~llmsample.client.route.choose`): a warm one, or this process's, which loads the
    model when first asked. ``refused``: the command's own flags an engine cannot honour;
    ``restart``: this user's engine, found stopped between turns, is started again (``chat``)."""
    from llmsample.client.route import choose

    return engine_at(choose(options, refused), options, restart)


def engine_at(target: Target | None, options: dict[str, Any], restart: bool = False) -> EngineClient:
    """The client for a chosen engine: ``target``'s, or this process's (None)."""
    if target is None:
        from llmsample.commands.model_options import local_engine

        return local_engine(options)
    from llmsample.client.engine_client import RemoteEngine
    from llmsample.client.route import hosted

    mine = restart and hosted(options) is None  # found by the model options, not given by --host
    return RemoteEngine(target, restart=(lambda gone: started_again(gone, options)) if mine else None)


def started_again(gone: Target, options: dict[str, Any]) -> Target:
    """This user's engine, gone (its keep-alive ran out while a chat waited, or it was
    stopped), started again with the same options, saying so in one line."""
    from llmsample.client.connection import EngineGone, Target, say
    from llmsample.commands.engines import format_duration, running_engine
    from llmsample.errors import RuntimeFailure

    keep = gone.keep_alive_s
    why = "" if keep is None else f" (its keep-alive: {format_duration(keep)} without work; or llmsample stop)"
    say(f"the engine for {gone.name} has stopped{why}; starting it again")
    try:
        record, _ = running_engine({**options, "batch_size": None, "max_queue": None, "quiet": True}, keep)
    except RuntimeFailure as exc:
        raise EngineGone(str(exc)) from None
    return Target(record.where, name=record.name, deterministic=record.deterministic, keep_alive_s=record.keep_alive_s)
