"""An engine that takes a job and says nothing (stopped with SIGSTOP, or a server that hangs):
the client waits for it without a limit, but says so once after a while, naming a stopped engine
of this user's and the way to resume it. In process: a socket that never answers, and a stopped
process as its engine."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmsample import __version__
from llmsample.client import connection, registry
from llmsample.client.connection import EngineGone, Target, stream_job
from llmsample.jobs import Job
from llmsample.sampling.config import SamplingConfig


@pytest.fixture
def silent(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[socket.socket, Path]]:
    """A listening socket in a short runtime directory of its own, never accepting."""
    runtime = Path(tempfile.mkdtemp(prefix="ls-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setattr(connection, "SILENCE_S", 0.3)
    path = registry.runtime_dir() / "silent.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    yield listener, path
    listener.close()


def notices(target: Target, listener: socket.socket) -> list[str]:
    """What the client says while the job waits; the listener closed after the first, which ends it."""
    told: list[str] = []
    failed: list[BaseException] = []

    def ask() -> None:
        try:
            list(stream_job(target, Job("w3", SamplingConfig(), "balanced"), told.append))
        except EngineGone as exc:
            failed.append(exc)

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not told and time.monotonic() < deadline:
        time.sleep(0.05)
    listener.close()  # the pending connection is reset: the client stops waiting
    thread.join(30)
    assert not thread.is_alive() and failed
    return told


@pytest.mark.slow  # a stopped process of its own
def test_a_stopped_engine_is_named_with_the_way_to_resume_it(silent: tuple[socket.socket, Path]) -> None:
    listener, path = silent
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        os.kill(sleeper.pid, signal.SIGSTOP)
        record = registry.EngineRecord("silent", sleeper.pid, {}, "tiny", "torch", "float32", "cpu", str(path),
                                       __version__, None, time.time())  # fmt: skip
        registry.write_record(registry.runtime_dir(), record)
        told = notices(Target(record.where), listener)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert told == [
        f"the engine for tiny (pid {sleeper.pid}) is stopped (SIGSTOP, Ctrl-Z or a debugger): `kill -CONT "
        f"{sleeper.pid}` resumes it, `llmsample stop` ends it; waiting for it (Ctrl-C stops)"
    ]


def test_a_silent_engine_is_said_once(silent: tuple[socket.socket, Path]) -> None:
    listener, path = silent
    told = notices(Target(f"unix:{path}"), listener)
    assert told == [f"no answer from the engine at unix:{path} for 0.3 s; waiting for it (Ctrl-C stops)"]
