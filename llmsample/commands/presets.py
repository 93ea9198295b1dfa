"""``llmsample presets``: what presets exist and what they resolve to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich_click import RichGroup

from llmsample.commands.help import GroupedCommand
from llmsample.sampling import presets as preset_store


@click.group(cls=RichGroup)
def presets() -> None:
    """List and show decoding presets (built-in, user, or a file)."""


@presets.command("list", cls=GroupedCommand)
def list_presets() -> None:
    """Every preset: name, where it comes from, description. A broken file does not hide the
    others: it is left out and named on stderr (one line each), and the exit code stays 0."""
    from rich.table import Table

    from llmsample.errors import UserError
    from llmsample.terminal import stdout_console, use_color

    printable = preset_store.printable
    table = Table("name", "source", "description", box=None, pad_edge=False)
    broken = []
    for name, found in sorted(preset_store.discover().items()):
        try:
            cfg = preset_store.read_preset_file(found.path)
        except UserError as exc:
            broken.append(str(exc))
            continue
        source = "built-in" if found.source == "built-in" else f"user ({printable(str(found.path))})"
        table.add_row(printable(name), source, cfg.description)
    stdout_console(use_color()).print(table)
    for problem in broken:
        click.echo(f"Warning: skipped {problem}", err=True)


@presets.command("show", cls=GroupedCommand)
@click.argument("name", required=False)
@click.option("--file", "path", type=click.Path(path_type=Path, dir_okay=False), help="Show a preset file instead.")
def show(name: str | None, path: Path | None) -> None:
    """A preset's resolved values as TOML: first what it sets apart from the defaults (what makes
    it itself), then every default it leaves as it is."""
    from llmsample.sampling.config import SamplingConfig

    if name is None and path is None:
        raise click.UsageError("give a preset NAME or --file PATH")
    _, cfg = preset_store.load(name, path)
    defaults = SamplingConfig().as_dict()
    values = {key: value for key, value in cfg.as_dict().items() if value is not None}
    own = [key for key, value in values.items() if value != defaults[key]]
    click.echo("# set by this preset")
    for key in own:
        click.echo(_toml_line(key, values[key]))
    click.echo("\n# the defaults, left as they are")
    for key, value in values.items():
        if key not in own:
            click.echo(_toml_line(key, value))


def _toml_line(key: str, value: Any) -> str:
    """``key = value``; a table inline, its keys and values as JSON writes them (TOML's ``=``)."""
    from llmsample.render.jsonout import strict_json

    if isinstance(value, dict):
        pairs = ", ".join(f"{strict_json(k, key)} = {strict_json(v, f'{key}.{k}')}" for k, v in value.items())
        return f"{key} = {{{pairs}}}" if pairs else f"{key} = {{}}"
    return f"{key} = {strict_json(value, key)}"
