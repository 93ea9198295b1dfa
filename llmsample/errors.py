"""Errors a user can fix (exit 2) and runtime failures (exit 1), each shown as one line."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class UserError(Exception):
    """Something the user asked for that cannot be done; the message says how to fix it."""

    exit_code = 2


class RuntimeFailure(Exception):
    """The run itself failed (out of memory, non-finite logits): exit 1, still one line."""

    exit_code = 1


class NoRoom(RuntimeFailure):
    """A forward pass found no room in the backend's cache (llama.cpp's, sized when it opened),
    which holds what it held before the pass: the decoding loop then holds joining rows back
    until rows leave, or ends the row that holds the most positions, not every row."""


class OutputFailed(RuntimeFailure):
    """Writing the data failed (disk full, closed descriptor): exit 1. A reader that went away
    (``| head``) is ``quiet``: it asked for no more, so there is nothing to report."""

    def __init__(self, message: str, quiet: bool = False) -> None:
        super().__init__(message)
        self.quiet = quiet


class Interrupted(Exception):
    """SIGTERM or SIGHUP, turned into an exception so the running command can finish its
    output; it exits 128 + the signal number, as a shell reports a process killed by it."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


# Signals that end a run with its summary (SIGHUP: the terminal went away; not on Windows).
ENDING_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


def ignore_further_interrupts() -> None:
    """Once a run is shutting down, another Ctrl-C or SIGTERM must not cut its summary short
    (or print a traceback): from here on they are ignored."""
    for signum in ENDING_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


_deferred: list[int] | None = None  # signals that arrived while a token was being printed


def raise_interrupted(signum: int, frame: object = None) -> None:
    """The handler of SIGTERM and SIGHUP (and SIGINT while deferred): raise, or keep it for later."""
    if _deferred is not None:
        _deferred.append(signum)
        return
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Interrupted(signum)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold the ending signals for a moment (printing one token and counting it), so an
    interrupt lands between tokens and the summary counts exactly what was printed. Python-level,
    since a signal may reach any of torch's threads: a thread mask would not hold it."""
    global _deferred
    if threading.current_thread() is not threading.main_thread() or _deferred is not None:
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.default_int_handler:
        signal.signal(signal.SIGINT, raise_interrupted)
    _deferred = []
    try:
        yield
    finally:
        pending, _deferred = _deferred, None
        if previous is signal.default_int_handler:
            signal.signal(signal.SIGINT, previous)
        if pending:
            raise_interrupted(pending[0])


def first_line(exc: BaseException) -> str:
    """What a wrapped library error says, in one line (its name when it says nothing)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
