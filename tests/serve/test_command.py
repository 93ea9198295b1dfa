"""``llmsample serve``'s own failures: one line, exit 2, before the model loads."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.conftest import cli_env


def serve(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "llmsample", "serve", "--device", "cpu", *args]
    return subprocess.run(command, capture_output=True, text=True, env=cli_env(), timeout=120, stdin=subprocess.DEVNULL)


def one_line_exit_2(done: subprocess.CompletedProcess, *words: str) -> None:
    assert done.returncode == 2 and done.stdout == ""
    lines = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert all(word in lines[0] for word in words), lines[0]


def test_a_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        one_line_exit_2(serve("--port", port), port, "--port")


@pytest.mark.parametrize(
    ("args", "words"),
    [(["--compile"], ["--compile"]), (["--temperature", "-1"], ["--temperature"]), (["--preset", "nope"], ["nope"])],
)
def test_bad_flags_fail_before_loading(args: list[str], words: list[str]) -> None:
    one_line_exit_2(serve("-m", "/nonexistent/model", *args), *words)
