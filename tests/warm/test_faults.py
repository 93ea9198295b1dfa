"""Faults between a client and its engine, in real processes: the engine killed mid-answer, a
Ctrl-C in the client (its row cancelled in the engine), a full engine (the client waits, saying
so), and a start after a killed engine (its stale socket replaced)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from llmsample.client import registry
from llmsample.client.connection import Target, get_json
from tests.warm.conftest import Engine, start_engine

LONG = ("-p", "w3 w4", "--seed", "4", "-n", "900", "--logit-bias", "1=-100", "-q")  # no <eos>: 900 tokens


def client(engine: Engine, *args: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "llmsample", "generate", *engine.load_args, *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=engine.env)


def first_output(proc: subprocess.Popen) -> bytes:
    assert proc.stdout is not None
    return os.read(proc.stdout.fileno(), 4096)


def health(engine: Engine) -> dict:
    return get_json(Target(f"unix:{engine.record()['socket']}"), "/health")


def test_ctrl_c_cancels_the_row_and_a_full_engine_makes_the_next_wait(chat_model: Path) -> None:
    engine = start_engine(chat_model, "--batch-size", "1", "--max-queue", "0")
    first = client(engine, *LONG)
    try:
        assert first_output(first)
        second = client(engine, "-p", "w5", "--seed", "1", "-n", "4", "-q")
        assert second.stderr is not None
        line = second.stderr.readline().decode()
        assert "is busy; waiting for a free row" in line
        first.send_signal(signal.SIGINT)
        assert first.wait(60) == 130
        out, err = second.communicate(timeout=120)
        assert second.returncode == 0, err
        assert out.strip() and err == b""  # the one line said it all
        deadline = time.monotonic() + 10
        while health(engine)["cancelled"] < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        figures = health(engine)
        assert figures["cancelled"] == 1 and figures["finished"] == 1 and figures["in_flight"] == 0
    finally:
        first.kill()
        stopped = engine.cli("stop", str(chat_model))
    assert stopped.returncode == 0 and list((engine.runtime / "llmsample").glob("*.json")) == []


def test_engine_killed_mid_answer(chat_model: Path) -> None:
    engine = start_engine(chat_model)
    pid = engine.record()["pid"]
    proc = client(engine, *LONG)
    printed = first_output(proc)
    assert printed
    os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    lines = err.decode().splitlines()
    assert len(lines) == 1 and "went away mid-answer" in lines[0]
    assert (printed + out).startswith(printed)  # what was printed stays printed
    # The dead engine's record and socket are stale: a new start replaces them.
    again = engine.cli("start", *engine.load_args, "-q")
    try:
        assert again.returncode == 0, again.stderr
        assert engine.record()["pid"] != pid and registry.alive(engine.record()["pid"])
    finally:
        engine.cli("stop", "--all")


def test_engine_killed_mid_chat(chat_model: Path, tmp_path: Path) -> None:
    """The chat ends there: the reply as far as it got stays printed, one line, exit 1."""
    engine = start_engine(chat_model)
    command = [sys.executable, "-m", "llmsample", "chat", *engine.load_args, "-n", "900", "--logit-bias", "1=-100",
               "-q", "--no-log"]  # fmt: skip
    (tmp_path / "session").write_text("w3 w4\nw5\n")
    with (tmp_path / "session").open("rb") as session:
        proc = subprocess.Popen(command, stdin=session, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=engine.env)
    printed = first_output(proc)
    where = f"unix:{engine.record()['socket']}"
    os.kill(engine.record()["pid"], signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    engine.cli("stop", "--all")
    assert printed and proc.returncode == 1
    assert err.decode().splitlines() == [f"Error: the engine at {where} went away mid-answer"]
    assert b"\n" not in (printed + out).rstrip(b"\n")  # the first reply only, as far as it got
