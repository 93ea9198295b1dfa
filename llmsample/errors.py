"""Errors a user can fix (exit 2) and runtime failures (exit 1), each shown as one line."""

from __future__ import annotations


class UserError(Exception):
    """Something the user asked for that cannot be done; the message says how to fix it."""

    exit_code = 2


class RuntimeFailure(Exception):
    """The run itself failed (out of memory, non-finite logits): exit 1, still one line."""

    exit_code = 1


class Interrupted(Exception):
    """SIGTERM, turned into an exception so the running command can finish its output."""

    exit_code = 143
