"""``llmsample logs``: the runs kept in the run log (:mod:`llmsample.logs.store`), listed,
searched, and shown again through the same renderers that printed them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich_click import RichGroup

from llmsample.commands.help import GroupedCommand
from llmsample.commands.options import format_option
from llmsample.errors import UserError
from llmsample.logs import store


@click.group(cls=RichGroup, invoke_without_command=True)
@click.option("-n", "--count", type=click.IntRange(1, 100000), default=10, show_default=True, help="How many runs.")
@click.pass_context
def logs(ctx: click.Context, count: int) -> None:
    """The runs kept in the log, newest first: every generate and speculate, chat reply, batch
    request and served request, with its prompt, settings, seed and every token's record.

    \b
    llmsample logs
    llmsample logs show 12 --inspect
    llmsample logs search "capital of France"
    llmsample logs off
    """
    if ctx.invoked_subcommand is None:
        _list(store.recent(count), "text")


@logs.command("list", cls=GroupedCommand)
@click.option("-n", "--count", type=click.IntRange(1, 100000), default=10, show_default=True, help="How many runs.")
@format_option
def list_runs(count: int, fmt: str) -> None:
    """The newest runs, one line each (or one JSON object each)."""
    _list(store.recent(count), fmt)


@logs.command("search", cls=GroupedCommand)
@click.argument("text")
@click.option("-n", "--count", type=click.IntRange(1, 100000), default=10, show_default=True, help="How many runs.")
@format_option
def search(text: str, count: int, fmt: str) -> None:
    """The newest runs whose prompt or text holds TEXT (any case)."""
    _list(store.recent(count, search=text), fmt)


@logs.command("show", cls=GroupedCommand)
@click.argument("run_id", metavar="ID", type=int)
@format_option
@click.option("--inspect", is_flag=True, help="Every token's numbers as a table after the text.")
@click.option("--html", type=click.Path(path_type=Path, dir_okay=False), help="Write the run as a page.")
@click.option(
    "--color-by",
    type=click.Choice(["sampled", "model"]),
    default="sampled",
    show_default=True,
    help="Colour by the probability in the sampling distribution, or under the raw model.",
)
@click.option("--no-color", is_flag=True, help="Plain text even on a terminal.")
def show(run_id: int, **options: Any) -> None:
    """One run again, through the renderers that printed it: coloured text, --inspect's table,
    --format jsonl's records (the same lines), --html's page."""
    from llmsample.client.wire import from_dict
    from llmsample.commands.generate import build_renderers

    run = store.get(run_id)
    if run is None:
        raise UserError(f"no run {run_id} in the log ({store.database_path()}); `llmsample logs` lists them")
    renderers = build_renderers({**options, "quiet": True, "no_log": True, "system": run.system},
                                asked=(run.prompt, run.settings))  # fmt: skip
    click.echo(f"#{run.id} {run.started} {run.command} {run.model} · preset {run.preset} · seed {run.seed}", err=True)
    for record in run.records:
        for renderer in renderers:
            renderer.token(from_dict(record))
    summary = from_dict({"type": "summary", **run.summary})
    for renderer in renderers:
        renderer.summary(summary)


@logs.command("on", cls=GroupedCommand)
def on() -> None:
    """Keep every run from now on (the default)."""
    store.off_switch().unlink(missing_ok=True)
    click.echo(f"runs are kept in {store.database_path()}", err=True)


@logs.command("off", cls=GroupedCommand)
def off() -> None:
    """Keep no more runs (those kept stay; `llmsample logs on` undoes it)."""
    store.off_switch().parent.mkdir(parents=True, exist_ok=True)
    store.off_switch().touch()
    click.echo("runs are no longer kept; `llmsample logs on` keeps them again", err=True)


@logs.command("path", cls=GroupedCommand)
def path() -> None:
    """Where the log is (a SQLite database: `sqlite3 "$(llmsample logs path)"`)."""
    click.echo(str(store.database_path()))


def _list(runs: list[store.LoggedRun], fmt: str) -> None:
    if not store.logging_on():
        click.echo("runs are not being kept (LLMSAMPLE_NO_LOG or `llmsample logs off`)", err=True)
    for run in runs:
        if fmt == "jsonl":
            keys = ("id", "started", "command", "model", "backend", "preset", "seed", "prompt", "system",
                    "text", "stop_reason", "tokens", "settings", "conversation", "parent")  # fmt: skip
            click.echo(json.dumps({key: getattr(run, key) for key in keys}, ensure_ascii=False, allow_nan=False))
        else:
            click.echo(f"{run.id:>5}  {run.started}  {run.command:<9} seed {run.seed}  {_short(run.prompt)} → "
                       f"{_short(run.text)}")  # fmt: skip


def _short(text: str, width: int = 40) -> str:
    """A line's worth of a text: newlines shown as ↵, cut with … ."""
    flat = text.replace("\n", "↵")
    return json.dumps(flat if len(flat) <= width else flat[: width - 1] + "…", ensure_ascii=False)
