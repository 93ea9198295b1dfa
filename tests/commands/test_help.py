"""``--help`` that guides: options under the same headings in every command, full command summaries,
no flag where it is refused, and suggestions only for near misses."""

from __future__ import annotations

import re
import subprocess
import sys

import click
import pexpect
import pytest
from click.testing import CliRunner

from llmsample.cli import main
from llmsample.commands.help import PANELS, GroupedCommand
from tests.conftest import REPO, cli_env


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


def help_screen(*path: str) -> list[str]:
    """``llmsample PATH --help`` as a 120-column terminal shows it: its lines, colour and trailing spaces off."""
    child = pexpect.spawn(sys.executable, ["-m", "llmsample", *path, "--help"], env=cli_env(TERM="xterm-256color"),
                          encoding="utf-8", timeout=60, dimensions=(50, 120))  # fmt: skip
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    return [re.sub(r"\x1b\[[0-9;]*m", "", line).rstrip() for line in child.before.splitlines()]


def panel_options(screen: list[str], panel: str) -> list[str]:
    """The long flags listed under a ``--help`` heading, in order."""
    start = next(i for i, line in enumerate(screen) if f"─ {panel} ─" in line)
    end = next(i for i in range(start, len(screen)) if screen[i].startswith("╰"))
    return [found.group(1) for line in screen[start + 1 : end] if (found := re.match(r"│ (--[\w-]+)", line))]


def test_generate_help_leads_with_the_common_samplers_and_groups_the_rest() -> None:
    screen = help_screen("generate")
    assert panel_options(screen, "Sampling") == [
        "--preset", "--preset-file", "--temperature", "--top-k", "--top-p", "--min-p", "--seed", "--max-tokens",
    ]  # fmt: skip
    assert {"--repetition-penalty", "--dry-multiplier"} <= set(panel_options(screen, "Penalties"))
    assert {"--typical-p", "--top-n-sigma", "--p-less"} <= set(panel_options(screen, "Truncation"))
    assert {"--xtc-probability", "--mirostat", "--samplers"} <= set(panel_options(screen, "More samplers"))
    blank_runs = [i for i in range(1, len(screen)) if not screen[i] and not screen[i - 1]]
    assert blank_runs == [], screen[: max(blank_runs, default=0) + 1]


# batch's own two options: llmsample/commands/batch.py belongs to the batch change under way (issue 60)
def test_every_option_has_a_help_line() -> None:
    missing = {(name, param.opts[0]) for name, command in commands().items() for param in command.params
               if isinstance(param, click.Option) and not param.hidden and not param.help}  # fmt: skip
    assert missing == set()


def test_a_mistyped_command_gets_the_near_ones() -> None:
    done = subprocess.run([sys.executable, "-m", "llmsample", "genrate", "-p", "x"], capture_output=True,
                          text=True, env=cli_env(), timeout=60)  # fmt: skip
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert "No such command 'genrate'. Did you mean 'generate'?" in done.stderr


@pytest.mark.parametrize(
    ("typed", "suggested"),
    [(["genrate"], ["generate"]), (["comp"], ["compare-models", "compare-presets"]), (["stat"], ["start"]),
     (["presets", "shw"], ["show"]), (["zzz"], [])],
)  # fmt: skip
def test_command_suggestions_are_near_misses(typed: list[str], suggested: list[str]) -> None:
    result = CliRunner().invoke(main, typed)
    assert result.exit_code == 2
    line = result.output.strip()
    offered = re.findall(r"'([\w-]+)'", line.split("mean", 1)[1]) if "mean" in line else []
    assert offered[: len(suggested)] == suggested, line


def readme_comment(command: str) -> str:
    """The README's comment above its example of ``llmsample COMMAND`` (the everyday-use tour)."""
    lines = (REPO / "README.md").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"llmsample {command}"))
    above: list[str] = []
    for line in reversed(lines[:at]):
        if not line.startswith("#"):
            break
        above.insert(0, line.lstrip("#"))
    return re.sub(r"^\s*\d+\.", "", " ".join(above))


def words(text: str) -> set[str]:
    return set(re.findall(r"[\w-]+", text))


NAMED = {"OpenAI", "Anthropic", "completions", "responses", "messages"}
"""The APIs a summary names, beside the commands."""


@pytest.mark.parametrize("command", ["serve", "start"])
def test_help_summaries_name_what_the_readme_names(command: str) -> None:
    summary = (top_level()[command].help or "").split("\n\n")[0]
    assert words(readme_comment(command)) & (set(top_level()) | NAMED) <= words(summary)
