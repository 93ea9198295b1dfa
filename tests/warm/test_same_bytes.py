"""The same command through a warm engine as in-process, beyond the engine interface's contract
(tests/warm/test_contract.py: every command and format, byte for byte): a user error, a prompt
asked again, speculation's summary, ``--watch``'s refusal, flags an engine cannot honour."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from tests.warm.conftest import Engine

TIMING = ("ttft_s", "tokens_per_s", "elapsed_s", "load_s")


def both(engine: Engine, *args: str) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """The command on the engine, then in-process."""
    warm = engine.generate(*args)
    local = engine.generate(*args, "--local")
    return warm, local


def test_a_prompt_asked_again_is_prefilled_whole(engine: Engine) -> None:
    """The engine keeps a finished row's prompt in its prompt cache; a one-shot command asked again
    must not start from it (a prefix prefilled apart rounds apart), or its numbers would drift."""
    args = ("-p", "w5 w3 w7 w3 w9 w4 w6", "--system", "w8", "--seed", "3", "-n", "12", "--format", "jsonl")
    first, again = engine.generate(*args), engine.generate(*args)
    local = engine.generate(*args, "--local")
    assert first.returncode == again.returncode == local.returncode == 0, again.stderr
    tokens = [run.stdout.splitlines()[:-1] for run in (first, again, local)]
    assert tokens[0] == tokens[1] == tokens[2] and len(tokens[2]) == 12
    assert json.loads(again.stdout.splitlines()[-1]).get("cache") is None  # nothing taken from the cache


def in_terminal(engine: Engine, *args: str, command: str = "generate") -> bytes:
    """``command``'s stdout through a pseudo-terminal (colour on), stderr apart."""
    leader, follower = pty.openpty()
    argv = [sys.executable, "-m", "llmsample", command, *engine.load_args, *args]
    env = {**engine.env, "TERM": "xterm-256color", "COLUMNS": "100"}
    proc = subprocess.Popen(argv, stdout=follower, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert proc.wait(300) == 0, proc.stderr.read() if proc.stderr else ""
    return out


@pytest.mark.parametrize("prompt", ["   "])
def test_a_user_error_is_the_same_line(engine: Engine, prompt: str) -> None:
    warm, local = both(engine, "-p", prompt)
    assert warm.returncode == local.returncode == 2
    assert warm.stdout == local.stdout == ""
    assert warm.stderr == local.stderr and len(warm.stderr.splitlines()) == 1


def comparable(stdout: str) -> tuple[list[str], dict]:
    """JSONL's token records, and its summary without the clocks and where it ran."""
    *tokens, last = stdout.splitlines()
    summary = json.loads(last)
    for key in (*TIMING, "engine", "warm", "plain_tokens_per_s", "plain_elapsed_s", "speedup"):
        summary.pop(key, None)
    return tokens, summary


def test_speculation_with_ngram_drafts_on_the_engine(engine: Engine) -> None:
    args = ("speculate", *engine.load_args, "-p", "w3 w4 w5 w3 w4 w5 w3 w4", "--raw", "--seed", "4", "-n", "30",
            "--draft-tokens", "3", "--format", "jsonl", "--compare")  # fmt: skip
    warm, local = engine.cli(*args), engine.cli(*args, "--local")
    assert warm.returncode == local.returncode == 0, warm.stderr + local.stderr
    assert comparable(warm.stdout) == comparable(local.stdout)
    summary = json.loads(warm.stdout.splitlines()[-1])
    assert summary["engine"].startswith("unix:") and summary["drafted"] > 0
    assert summary["plain_tokens_per_s"] > 0


def test_watch_on_the_engine(engine: Engine, tmp_path: Path) -> None:
    """``--watch`` is the row's own on the engine: the records, the table and the page's plot
    are the in-process run's; a text that is no token is the same one line."""
    args = ("-p", "w3 w4", "--seed", "2", "-n", "12", "--watch", "w6", "--watch", "<eos>", "--inspect")
    warm = engine.generate(*args, "--html", str(tmp_path / "warm.html"))
    local = engine.generate(*args, "--html", str(tmp_path / "local.html"), "--local")
    assert warm.returncode == local.returncode == 0, warm.stderr + local.stderr
    assert warm.stdout == local.stdout and "w6" in warm.stdout
    assert (tmp_path / "warm.html").read_bytes() == (tmp_path / "local.html").read_bytes()
    bad = [engine.generate("-p", "w3", "--watch", "w4 w5", *where) for where in ((), ("--local",))]
    assert bad[0].returncode == bad[1].returncode == 2 and bad[0].stdout == ""
    assert bad[0].stderr == bad[1].stderr and bad[0].stderr.count("\n") == 1 and "--watch" in bad[0].stderr


def test_a_flag_the_engine_cannot_honour_is_refused(engine: Engine) -> None:
    done = engine.generate("-p", "w3", "--reference")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("Error: --reference does not run on the warm engine")
    assert len(done.stderr.strip().splitlines()) == 1
    exact = engine.generate("-p", "w3", "-n", "3", "--deterministic", "--format", "jsonl")
    assert exact.returncode == 0, exact.stderr  # a plain engine's rows share their passes: this one ran here
    assert "engine" not in json.loads(exact.stdout.splitlines()[-1])
