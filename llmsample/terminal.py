"""Where output goes: data on stdout, everything else on stderr; colour only on a terminal."""

from __future__ import annotations

import os
import sys

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
    return Console(
        file=sys.stdout,
        color_system="auto" if color else None,
        force_terminal=color or None,
        no_color=not color,
        highlight=False,
        soft_wrap=True,
    )


def stderr_console() -> Console:
    color = not os.environ.get("NO_COLOR") and sys.stderr.isatty()
    return Console(file=sys.stderr, color_system="auto" if color else None, highlight=False, soft_wrap=True)
