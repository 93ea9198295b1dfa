"""Where a chat's turns come from: a terminal (prompt_toolkit: line editing, history under the
XDG state directory, bracketed paste) or a pipe, each line a user turn. In both, a message may
span lines between lines of ``\"\"\"``, and a line starting with ``/`` is a command."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from llmsample.chat.slash import EXIT, run_command
from llmsample.chat.talk import Chat
from llmsample.client.connection import EngineGone
from llmsample.errors import OutputFailed, RuntimeFailure, UserError

QUOTES = '"""'
PROMPT, MORE = ">>> ", "... "


def history_path() -> Path:
    """``$XDG_STATE_HOME/llmsample/chat_history`` (``~/.local/state`` when unset)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "llmsample" / "chat_history"


def terminal_reader() -> Callable[[str], str | None]:
    """A line from the terminal, None at Ctrl-D; Ctrl-C at the prompt clears the line."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory, InMemoryHistory

    path = history_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        history = FileHistory(str(path))
    except OSError:
        history = InMemoryHistory()  # a read-only home: no history kept, the chat still works
    session: PromptSession[str] = PromptSession(history=history, enable_open_in_editor=False)

    def read(prompt: str) -> str | None:
        while True:
            try:
                return session.prompt(prompt)
            except KeyboardInterrupt:
                continue
            except EOFError:
                return None

    return read


def piped_reader() -> Callable[[str], str | None]:
    """A line of stdin (without its newline), None at its end; a line that is not UTF-8 is
    skipped with a note."""
    stream = sys.stdin.buffer if sys.stdin is not None else None

    def read(prompt: str) -> str | None:
        while stream is not None:
            data = stream.readline()
            if not data:
                return None
            try:
                return data.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                print(f"skipped a line that is not valid UTF-8 (byte {exc.start})", file=sys.stderr)
        return None

    return read


def read_message(read: Callable[[str], str | None]) -> str | None:
    """One message: a line, or the lines between a line starting with ``\"\"\"`` and one
    ending with it; None when the input ends."""
    line = read(PROMPT)
    if line is None or not line.lstrip().startswith(QUOTES):
        return line
    first = line.lstrip()[len(QUOTES) :]
    if first.rstrip().endswith(QUOTES):  # """one line"""
        return first.rstrip()[: -len(QUOTES)]
    lines = [first] if first else []
    while (more := read(MORE)) is not None:
        if more.rstrip().endswith(QUOTES):
            lines.append(more.rstrip()[: -len(QUOTES)])
            break
        lines.append(more)
    return "\n".join(lines).strip("\n")


def converse(chat: Chat, interactive: bool) -> None:
    """Turns until the input ends or ``/exit``."""
    read = terminal_reader() if interactive else piped_reader()
    if interactive:
        chat.note('/help lists the commands; """ starts a message of several lines; Ctrl-D leaves')
    while (message := read_message(read)) is not None:
        if not message.strip():
            continue
        try:
            if interactive and message.strip().lower() in ("exit", "quit"):  # as llm chat and Python's REPL
                return
            if message.startswith("/"):
                if run_command(chat, message) is EXIT:
                    return
            else:
                chat.say(message)
        except (OutputFailed, EngineGone):  # stdout's reader left (| head), or the engine that answered did
            raise
        except (UserError, RuntimeFailure) as exc:
            chat.note(str(exc))
        except KeyboardInterrupt:  # outside a reply (a prefill before it, /explain): back to the prompt
            chat.note("interrupted")
