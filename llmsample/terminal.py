"""Where output goes: data on stdout, everything else on stderr; colour only on a terminal.
Standard streams that are closed or fail are handled here, so no command meets them raw."""

from __future__ import annotations

import errno
import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

from llmsample.errors import OutputFailed

if TYPE_CHECKING:  # imported when a console is made: a piped warm run never needs one
    from rich.console import Console


def use_color(no_color_flag: bool = False) -> bool:
    """Colour only when stdout is a terminal; NO_COLOR (non-empty) and --no-color turn it off
    and win over FORCE_COLOR, which only overrides a dumb TERM."""
    if no_color_flag or os.environ.get("NO_COLOR"):
        return False
    if not sys.stdout.isatty():
        return False
    return bool(os.environ.get("FORCE_COLOR")) or os.environ.get("TERM") != "dumb"


def stdout_console(color: bool) -> Console:
    from rich.console import Console

    return Console(
        file=sys.stdout,
        color_system="auto" if color else None,
        force_terminal=color or None,
        no_color=not color,
        highlight=False,
        soft_wrap=True,
    )


def stderr_console() -> Console:
    from rich.console import Console

    color = not os.environ.get("NO_COLOR") and sys.stderr.isatty()
    return Console(file=sys.stderr, color_system="auto" if color else None, highlight=False, soft_wrap=True)


class _GuardedStdout:
    """sys.stdout whose write failures become one ``OutputFailed`` the CLI reports in a line,
    wherever the write happened (a renderer, rich, click)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError as exc:
            raise _failure(exc) from exc

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as exc:
            raise _failure(exc) from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


class _QuietStderr:
    """sys.stderr that goes silent when it cannot be written (``2>/dev/full``): progress and
    summaries are optional, and failing on them would cost the data on stdout."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError:
            silence(self.stream)
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError:
            silence(self.stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _failure(exc: OSError) -> OutputFailed:
    if exc.errno == errno.EPIPE:
        return OutputFailed("stdout was closed by its reader", quiet=True)
    return OutputFailed(f"cannot write to stdout ({exc.strerror or exc}); the output is incomplete")


def silence(stream: TextIO) -> None:
    """Point a failed stream's descriptor at /dev/null, so what it still buffers is flushed
    there at exit instead of raising 'Exception ignored' noise."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):  # not a real file (tests' in-memory streams)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def prepare_streams() -> bool:
    """Give a closed standard stream (``>&-``, ``<&-``, ``2>&-``; Python makes it None) a
    /dev/null descriptor, so no file opened later lands on fd 0-2, and guard stdout and stderr.
    A closed stderr just discards diagnostics; a closed stdin stays None (``read_prompt`` says
    so). Returns whether stdout is open: without it there is nowhere to put the data."""
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        if getattr(sys, name) is None:
            try:
                os.fstat(fd)
            except OSError:
                devnull = os.open(os.devnull, os.O_RDWR)
                if devnull != fd:
                    os.dup2(devnull, fd)
                    os.close(devnull)
    stdout_open = sys.stdout is not None
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - lives as long as the process
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115
    if not isinstance(sys.stdout, _GuardedStdout):
        sys.stdout = _GuardedStdout(sys.stdout)  # type: ignore[assignment]
    if not isinstance(sys.stderr, _QuietStderr):
        sys.stderr = _QuietStderr(sys.stderr)  # type: ignore[assignment]
    return stdout_open
