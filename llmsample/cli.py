"""The ``llmsample`` command group: every failure a user can cause is one line and exit 2."""

from __future__ import annotations

import gc
import importlib
import signal
import sys
import time
from typing import Any

import click
from rich_click import RichGroup

from llmsample.commands.clock import STARTED
from llmsample.errors import (
    ENDING_SIGNALS,
    Interrupted,
    OutputFailed,
    RuntimeFailure,
    UserError,
    ignore_further_interrupts,
    raise_interrupted,
)
from llmsample.terminal import prepare_streams, silence
from llmsample.version import __version__


def leave_objects_to_the_exit() -> None:
    """A process of its own is about to end: the interpreter's last collections would walk every
    object torch and transformers made (0.4-0.6 s of every command's exit on a slow CPU) to free
    memory the process gives back at once. Frozen, they are skipped; embedded callers keep theirs.
    So whatever a command writes is closed by the command, never left to a collection at exit."""
    gc.freeze()


def near_misses(exc: click.NoSuchOption | click.NoSuchCommand) -> list[str]:
    """The command's own flags (or the group's commands) that the mistyped one is near. Click
    offers only commands already imported (none here: they load when run), and difflib's 0.6
    cutoff, click's, offers --compare for --temprature; a close spelling or a prefix (--temp,
    comp) is what a user meant."""
    if exc.ctx is None:
        return list(exc.possibilities or [])
    import difflib

    if isinstance(exc, click.NoSuchCommand):
        typed, names = exc.command_name, exc.ctx.command.list_commands(exc.ctx)  # type: ignore[attr-defined]
    else:
        typed = exc.option_name
        flags = [name for param in exc.ctx.command.get_params(exc.ctx) for name in (*param.opts, *param.secondary_opts)]
        if typed.replace("_", "-") in flags:  # --top_k: the config key's spelling
            return [typed.replace("_", "-")]
        names = [name for name in flags if name.startswith("--")]
    near = difflib.get_close_matches(typed, names, n=3, cutoff=0.75)
    prefixed = [n for n in names if len(typed.lstrip("-")) >= 3 and n.startswith(typed) and n not in near]
    return near + prefixed[: 3 - len(near)]


COMMANDS = {
    "generate": "generate:generate",
    "chat": "chat:chat",
    "speculate": "speculate:speculate",
    "explain": "explain:explain",
    "compare-presets": "compare_presets:compare_presets",
    "batch": "batch:batch",
    "sweep": "sweep:sweep",
    "compare-models": "compare_models:compare_models",
    "presets": "presets:presets",
    "models": "models:models",
    "bench": "bench:bench",
    "serve": "serve:serve",
    "start": "engines:start",
    "ps": "engines:ps",
    "stop": "engines:stop",
    "logs": "logs:logs",
}
"""Each subcommand's module under ``llmsample.commands``, imported when the command runs: a
command's start-up pays for its own imports only (a warm ``generate`` answers in a fraction of
a second; ``batch`` and ``bench`` alone cost it a quarter of one)."""


class LlmsampleGroup(RichGroup):
    def list_commands(self, ctx: click.Context | None) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context | None, name: str) -> click.Command | None:
        if name not in self.commands and name in COMMANDS:
            module, attribute = COMMANDS[name].split(":")
            self.add_command(getattr(importlib.import_module(f"llmsample.commands.{module}"), attribute), name)
        return super().get_command(ctx, name)  # type: ignore[arg-type]

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        """The context, holding when the command started (shared with the subcommand's)."""
        started = time.perf_counter()
        ctx = super().make_context(info_name, args, parent, **extra)
        ctx.meta[STARTED] = started
        return ctx

    def main(self, args: Any = None, *rest: Any, **kwargs: Any) -> Any:
        """Run the command, then report how it ended in at most one line on stderr; from then
        on interrupts are ignored, so a second Ctrl-C cannot turn the ending into a traceback.
        Called with explicit arguments (embedded, tests) it gives the caller's handlers back."""
        previous = {signum: signal.getsignal(signum) for signum in ENDING_SIGNALS}
        stdout_open = prepare_streams()
        for signum in ENDING_SIGNALS:
            if signum != signal.SIGINT:  # SIGINT stays Python's KeyboardInterrupt
                signal.signal(signum, raise_interrupted)
        if stdout_open:
            message, code = self._outcome(args, *rest, **kwargs)
        else:
            message, code = "stdout is closed; redirect it (e.g. > /dev/null) instead of closing it", 1
        ignore_further_interrupts()
        if args is None:
            leave_objects_to_the_exit()
        try:
            if message:
                click.echo(f"Error: {message}", err=True)
            sys.exit(code)
        finally:
            if args is not None:
                for signum, handler in previous.items():
                    if handler is not None:
                        signal.signal(signum, handler)

    def _outcome(self, *args: Any, **kwargs: Any) -> tuple[str | None, int]:
        kwargs["standalone_mode"] = False
        try:
            try:
                code = super().main(*args, **kwargs)
            except click.exceptions.NoArgsIsHelpError as exc:
                click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
                code = 0
            sys.stdout.flush()
            return None, code if isinstance(code, int) else 0
        except OutputFailed as exc:
            silence(sys.stdout)
            return None if exc.quiet else str(exc), exc.exit_code
        except click.UsageError as exc:
            if isinstance(exc, click.NoSuchOption | click.NoSuchCommand):
                exc.possibilities = near_misses(exc)
            command = exc.ctx.command_path if exc.ctx else "llmsample"
            return f"{exc.format_message()} (see '{command} --help')", exc.exit_code
        except click.ClickException as exc:
            return exc.format_message(), exc.exit_code
        except (UserError, RuntimeFailure) as exc:
            return str(exc), exc.exit_code
        except (click.exceptions.Abort, KeyboardInterrupt):
            return None, 130
        except Interrupted as exc:
            return None, exc.exit_code


HELP = {
    "help_option_names": ["-h", "--help"],
    # rich-click: a blank line after the summary and between paragraphs, as plain click prints them
    "rich_help_config": {"text_paragraph_linebreaks": "\n\n", "padding_helptext_first_line": (0, 0, 1, 0)},
}


@click.group(cls=LlmsampleGroup, context_settings=HELP)
@click.version_option(__version__, prog_name="llmsample")
def main() -> None:
    """Generate text with a Hugging Face causal LM and see how every token was sampled."""
