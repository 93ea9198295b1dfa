"""``--help`` that guides: options under the same headings in every command, full command summaries,
no flag where it is refused, and suggestions only for near misses."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from llmsample.cli import main
from llmsample.commands.help import PANELS, GroupedCommand


def top_level() -> dict[str, click.Command]:
    return {name: main.get_command(None, name) for name in main.list_commands(None)}


def commands() -> dict[str, click.Command]:
    out = {}
    for name, command in top_level().items():
        subs = command.commands.items() if isinstance(command, click.Group) else [("", command)]
        out.update({f"{name} {sub}".strip(): c for sub, c in subs})
    return out


def help_of(*path: str) -> str:
    result = CliRunner().invoke(main, [*path, "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    return result.output


def test_every_command_groups_its_options() -> None:
    for name, command in commands().items():
        assert isinstance(command, GroupedCommand), f"{name}: use cls=GroupedCommand"


def test_generate_lists_its_options_by_purpose_in_one_order() -> None:
    text = help_of("generate")
    positions = [text.index(f"─ {panel} ─") for panel in PANELS]
    assert positions == sorted(positions)
    sampling = text[text.index("─ Sampling ─") : text.index("─ Output ─")]
    assert "--temperature" in sampling and "--device-map" not in sampling
    assert text.index("--temperature") < text.index("--device-map")  # samplers before device maps


@pytest.mark.parametrize("name", ["chat", "serve", "batch"])
def test_a_flag_the_command_refuses_is_not_listed(name: str) -> None:
    assert "--compare" not in help_of(name)
    result = CliRunner().invoke(main, [name, "--compare"])
    assert result.exit_code == 2 and "No such option '--compare'" in result.output


def test_the_command_list_has_whole_summaries() -> None:
    text = " ".join(help_of().replace("│", " ").split())
    for name, command in top_level().items():
        summary = " ".join((command.help or "").split("\n\n")[0].split())
        assert summary and summary in text, name


@pytest.mark.parametrize(
    ("typed", "suggested"),
    [("--temprature", ["--temperature"]), ("--top_k", ["--top-k"]), ("--jsonschema", ["--json-schema"]),
     ("--temp", ["--temperature"]), ("--zzz", [])],
)  # fmt: skip
def test_suggestions_are_near_misses_of_the_commands_own_flags(typed: str, suggested: list[str]) -> None:
    result = CliRunner().invoke(main, ["generate", typed, "1", "-p", "x"])
    assert result.exit_code == 2
    line = result.output.strip()
    offered = [word.strip("'?,.()") for word in line.split("mean", 1)[-1].split()] if "mean" in line else []
    assert [o for o in offered if o.startswith("--")][: len(suggested)] == suggested
    assert "--compare" not in line
