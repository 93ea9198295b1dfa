"""``llmsample start``, ``ps`` and ``stop`` in real processes: a second start reuses the engine,
the socket and its directory are the user's alone, an idle engine exits after its keep-alive,
stale records are cleaned up, and a version mismatch is one line."""

from __future__ import annotations

import json
import stat
import subprocess
import time
from pathlib import Path

from llmsample.client import registry
from llmsample.client.connection import Target, UnixConnection, get_json
from tests.warm.conftest import Engine, start_engine


def test_start_again_reuses_and_ps_lists(engine: Engine) -> None:
    record = engine.record()
    again = engine.cli("start", *engine.load_args, "-q")
    assert again.returncode == 0 and f"pid {record['pid']}" in again.stdout and "already running" in again.stdout
    listed = engine.cli("ps")
    assert listed.returncode == 0
    header, row = listed.stdout.splitlines()
    assert header.split()[:6] == ["MODEL", "BACKEND", "DTYPE", "MODE", "ROWS", "MEMORY"]
    assert row.split()[:5] == [str(engine.model), "transformers", "float32", "batched", "0"]
    assert row[header.index("KEEP-ALIVE") :].split()[0] == "10m"  # as start was given it, not 600s
    assert record["version"] and record["spec"]["model"] == str(engine.model.resolve())


def test_the_socket_is_the_users_alone(engine: Engine) -> None:
    socket = Path(engine.record()["socket"])
    assert stat.S_ISSOCK(socket.stat().st_mode) and stat.S_IMODE(socket.stat().st_mode) == 0o600
    assert stat.S_IMODE(socket.parent.stat().st_mode) == 0o700


def test_version_mismatch_is_one_line(engine: Engine) -> None:
    path = next((engine.runtime / "llmsample").glob("*.json"))
    original = path.read_text()
    path.write_text(json.dumps({**json.loads(original), "version": "0.0.1"}))
    try:
        done = engine.generate("-p", "w3", "-n", "2")
    finally:
        path.write_text(original)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "runs llmsample 0.0.1" in done.stderr
    # The engine checks too: a client of another version gets a 409 naming both.
    connection = UnixConnection(engine.record()["socket"], 10)
    connection.request("GET", "/llmsample/v1/engine", headers={"X-Llmsample-Version": "0.0.1"})
    answer = connection.getresponse()
    assert answer.status == 409 and b"the client is 0.0.1" in answer.read()


def test_keep_alive_expiry(chat_model: Path) -> None:
    engine = start_engine(chat_model, "--keep-alive", "5s")
    pid, socket = engine.record()["pid"], Path(engine.record()["socket"])
    assert get_json(Target(f"unix:{socket}"), "/llmsample/v1/engine")["pid"] == pid
    deadline = time.monotonic() + 60
    while registry.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not registry.alive(pid)
    assert list((engine.runtime / "llmsample").glob("*.json")) == [] and not socket.exists()
    assert "no engines running" in engine.cli("ps").stderr


def test_a_stale_record_is_no_engine(engine: Engine, tmp_path: Path) -> None:
    runtime = Path(engine.env["XDG_RUNTIME_DIR"]).parent / (Path(engine.env["XDG_RUNTIME_DIR"]).name + "-stale")
    directory = runtime / "llmsample"
    directory.mkdir(parents=True, mode=0o700)
    gone = subprocess.Popen(["true"])
    gone.wait()
    spec = registry.spec_of({"model": str(engine.model), "device": "cpu", "dtype": "float32"})
    ident = registry.engine_id(spec)
    stray = registry.socket_path(directory, ident)
    stray.touch()
    record = registry.EngineRecord(ident, gone.pid, spec, str(engine.model), "transformers", "float32", "cpu",
                                   str(stray), "0.1.0", None, time.time())  # fmt: skip
    registry.write_record(directory, record)
    stale = Engine(engine.model, {**engine.env, "XDG_RUNTIME_DIR": str(runtime)}, runtime)
    done = stale.generate("-p", "w3", "-n", "3", "--seed", "1")
    assert done.returncode == 0 and "engine" not in done.stderr  # ran in-process
    assert not stray.exists() and list(directory.glob("*.json")) == []


def test_stop_names_what_is_not_running(engine: Engine) -> None:
    done = engine.cli("stop", "no-such-model")
    assert done.returncode == 2 and "no engine runs 'no-such-model'" in done.stderr and done.stdout == ""
