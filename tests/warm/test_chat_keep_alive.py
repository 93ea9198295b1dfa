"""A chat that waits longer than its engine's keep-alive: the engine stops by itself, and the next
line starts it again (one line saying so) and is answered, the transcript the in-process one; a
server given by ``--host`` that has gone ends the chat in one line saying how to go on."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmsample.client import registry
from tests.conftest import cli_env
from tests.serve.conftest import start_server
from tests.warm.conftest import Engine, start_engine

pytestmark = pytest.mark.slow


def wait_until_gone(pid: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while registry.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not registry.alive(pid), "the engine outlived its keep-alive"


def test_a_line_after_the_keep_alive_starts_the_engine_again(chat_model: Path) -> None:
    engine: Engine = start_engine(chat_model, "--keep-alive", "2s")
    args = ("chat", *engine.load_args, "--seed", "4", "-n", "6", "-q")
    command = [sys.executable, "-m", "llmsample", *args]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=engine.env)  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(b"w3\n")
        proc.stdin.flush()
        first = proc.stdout.readline()
        wait_until_gone(engine.record()["pid"])  # idle past its keep-alive while the chat waits
        rest, err = proc.communicate(b"w4 w5\n", timeout=300)
    finally:
        proc.kill()
        engine.cli("stop", "--all")
    assert proc.returncode == 0, err.decode()
    note = ("llmsample: the engine for {} has stopped (its keep-alive: 2s without work; or llmsample stop); "
            "starting it again")  # fmt: skip
    notes = err.decode().splitlines()
    assert notes and all(line == note.format(chat_model) for line in notes), notes  # at least the second line's
    local = engine.cli(*args, "--local", "--no-log", input="w3\nw4 w5\n")
    assert (first + rest).decode() == local.stdout and local.stdout.count("\n") == 2


def test_a_host_that_has_gone_says_how_to_go_on(chat_model: Path) -> None:
    server = start_server(chat_model, chat_model.parent / "server-stderr")
    command = [sys.executable, "-m", "llmsample", "chat", "--host", server.url, "-n", "4", "-q"]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=cli_env())  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(b"w3\n")
        proc.stdin.flush()
        assert proc.stdout.readline()
        server.stop()
        out, err = proc.communicate(b"w4\nw5\n", timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 1 and out == b""
    assert err.decode().splitlines() == [
        f"Error: cannot reach the engine at {server.url} (Connection refused); this line was not answered; "
        "`llmsample chat -c` continues the conversation"
    ]
