"""The ``llmsample`` command group: every failure a user can cause is one line and exit 2."""

from __future__ import annotations

import signal
import sys
from typing import Any

import click

from llmsample import __version__
from llmsample.commands import bench, compare, explain, generate, models, presets, speculate
from llmsample.errors import Interrupted, RuntimeFailure, UserError


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted()


def _fail(message: str, code: int) -> None:
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


class LlmsampleGroup(click.Group):
    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        signal.signal(signal.SIGTERM, _raise_interrupted)
        try:
            code = super().main(*args, **kwargs)
            sys.stdout.flush()
            sys.exit(code if isinstance(code, int) else 0)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
            sys.exit(0)
        except click.UsageError as exc:
            command = exc.ctx.command_path if exc.ctx else "llmsample"
            _fail(f"{exc.format_message()} (see '{command} --help')", exc.exit_code)
        except click.ClickException as exc:
            _fail(exc.format_message(), exc.exit_code)
        except (UserError, RuntimeFailure) as exc:
            _fail(str(exc), exc.exit_code)
        except click.exceptions.Abort:
            sys.exit(130)
        except Interrupted:
            sys.exit(143)


@click.group(cls=LlmsampleGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="llmsample")
def main() -> None:
    """Generate text with a Hugging Face causal LM and see how every token was sampled."""


main.add_command(generate.generate)
main.add_command(speculate.speculate)
main.add_command(explain.explain)
main.add_command(compare.compare_presets)
main.add_command(presets.presets)
main.add_command(models.models)
main.add_command(bench.bench)
