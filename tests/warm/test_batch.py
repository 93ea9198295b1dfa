"""``batch`` on a warm engine: every request a row of the engine's batch, the same records as
the in-process run (clocks and where it ran aside), flags the engine cannot honour refused in
one line, and the engine's death mid-run: what was written stays, one line, exit 1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.warm.conftest import Engine, start_engine

TIMING = ("ttft_s", "tokens_per_s", "elapsed_s")
REQUESTS = [
    "w3 w4 w5",
    json.dumps({"custom_id": "sys", "prompt": "w6 w7", "system": "w9", "seed": 4, "max_tokens": 12}),
    json.dumps({"custom_id": "msgs", "messages": [{"role": "user", "content": "w5"},
                {"role": "assistant", "content": "w6"}, {"role": "user", "content": "w7 w8"}], "stop": ["w4"]}),
    json.dumps({"custom_id": "raw", "prompt": "w4 w4", "raw": True, "preset": "creative", "min_p": 0.05}),
    '{"prompt": "w3", "temperature": "hot"}',  # a line that cannot run: its error record, in its place
    json.dumps({"custom_id": "topk", "prompt": "w3", "top_k": 4, "temperature": 1.4}),
]  # fmt: skip


def batch(engine: Engine, source: Path, *args: str) -> subprocess.CompletedProcess:
    return engine.cli("batch", str(source), *engine.load_args, "--seed", "3", "-n", "10", *args)


def comparable(stdout: str) -> list[dict]:
    """The records without their clocks (each checked to be there first)."""
    records = [json.loads(line) for line in stdout.splitlines()]
    for record in records:
        for key in TIMING if "error" not in record else ():
            record.pop(key)
    return records


@pytest.fixture
def requests_file(tmp_path: Path) -> Path:
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(REQUESTS) + "\n")
    return path


@pytest.fixture(scope="module")
def serial(chat_model: Path) -> Iterator[Engine]:
    """An engine decoding one row at a time: its floats are then the in-process run's one row at
    a time (``--batch-size 1``) to the last bit; in a batch, a product's rounding follows its shape."""
    engine = start_engine(chat_model, "--batch-size", "1")
    yield engine
    engine.cli("stop", "--all")


ONE_AT_A_TIME = ("--local", "--batch-size", "1", "--prompt-cache-mb", "0")


@pytest.mark.parametrize("tokens", ["full", "ids", "none"])
def test_the_same_records_as_in_process(serial: Engine, requests_file: Path, tokens: str) -> None:
    warm = batch(serial, requests_file, "--tokens", tokens, "--top-n", "3", "--no-log")
    local = batch(serial, requests_file, "--tokens", tokens, "--top-n", "3", "--no-log", *ONE_AT_A_TIME)
    assert warm.returncode == local.returncode == 1, warm.stderr + local.stderr  # the bad line fails the run
    warm_records, local_records = comparable(warm.stdout), comparable(local.stdout)
    assert [r["custom_id"] for r in warm_records] == ["line-1", "sys", "msgs", "raw", "line-5", "topk"]
    for record in warm_records:
        if "error" not in record:
            assert record.pop("engine").startswith("unix:") and record.pop("warm") is True
    assert warm_records == local_records
    assert "on the engine at unix:" in warm.stderr
    assert (tokens == "none") == all("per_token" not in record for record in warm_records)


def test_ignore_eos_runs_on_the_engine_as_in_process(serial: Engine, requests_file: Path) -> None:
    """A row of the engine's batch runs past its end of text as the in-process row does (without
    the flag, a row of these ends at its end of text: the flag is seen)."""
    args = ("--tokens", "ids", "--no-log", "-n", "40")
    warm = comparable(batch(serial, requests_file, *args, "--ignore-eos").stdout)
    local = comparable(batch(serial, requests_file, *args, "--ignore-eos", *ONE_AT_A_TIME).stdout)
    plain = comparable(batch(serial, requests_file, *args).stdout)
    for record in warm + plain:
        if "error" not in record:
            assert record.pop("engine").startswith("unix:") and record.pop("warm") is True
    assert warm == local
    stops = lambda records: [record["stop_reason"] for record in records if "error" not in record]  # noqa: E731
    assert "eos" not in stops(warm) and "eos" in stops(plain)


def test_rows_decoded_together_draw_the_same_tokens(engine: Engine, requests_file: Path) -> None:
    """In the engine's batch and in this process's, the same tokens; figures to float32 rounding."""
    warm = comparable(batch(engine, requests_file, "--tokens", "full", "--no-log").stdout)
    local = comparable(batch(engine, requests_file, "--tokens", "full", "--no-log", "--local").stdout)
    assert [r.get("text") for r in warm] == [r.get("text") for r in local] and len(warm) == 6
    for warm_record, local_record in zip(warm, local, strict=True):
        for ours, theirs in zip(warm_record.get("per_token", []), local_record.get("per_token", []), strict=True):
            assert ours["token_id"] == theirs["token_id"]
            assert ours["prob"] == pytest.approx(theirs["prob"], rel=1e-4, abs=1e-6)


def test_resuming_a_file_on_the_engine(serial: Engine, requests_file: Path, tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    first = batch(serial, requests_file, "--tokens", "ids", "-o", str(output), "--no-log", *ONE_AT_A_TIME)
    kept = output.read_text().splitlines()
    output.write_text("\n".join(kept[:2]) + "\n")  # a run that stopped after two records
    again = batch(serial, requests_file, "--tokens", "ids", "-o", str(output), "--no-log")
    assert first.returncode == again.returncode == 1
    resumed = comparable(output.read_text())
    assert [r.pop("engine", None) is not None for r in resumed] == [False, False, True, True, False, True]
    for record in resumed:
        record.pop("warm", None)
    assert resumed == comparable("\n".join(kept))


@pytest.mark.parametrize(
    ("flag", "named"),
    [(("--format", "openai"), "--format openai"), (("--batch-size", "2"), "--batch-size"),
     (("--prompt-cache-mb", "64"), "--prompt-cache-mb"), (("--draft", "suffix"), "--draft suffix")],
)  # fmt: skip
def test_a_flag_the_engine_cannot_honour_is_one_line(
    engine: Engine, requests_file: Path, flag: tuple[str, ...], named: str
) -> None:
    """A drafter the engine was not started with says how to get one (tests/warm/test_held_models.py)."""
    done = batch(engine, requests_file, *flag)
    assert done.returncode == 2 and done.stdout == ""
    started = f", or start it with {named}" if named.startswith("--draft") else ""
    assert done.stderr.strip().splitlines() == [
        f"Error: {named} does not run on the warm engine for {engine.model}; leave it out{started}, or pass "
        "--local to run here"
    ]


def test_the_engine_killed_mid_run(chat_model: Path, tmp_path: Path) -> None:
    """Its own engine (this one dies): the records written before stay, one line, exit 1."""
    engine = start_engine(chat_model, "--batch-size", "1", "--max-queue", "0")
    source = tmp_path / "many.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"w{3 + i % 5}", "min_tokens": 300, "max_tokens": 300}) + "\n" for i in range(12)))
    command = [sys.executable, "-m", "llmsample", "batch", str(source), *engine.load_args, "--tokens", "none",
               "--no-log", "-q"]  # fmt: skip
    where = f"unix:{engine.record()['socket']}"
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=engine.env)
    assert proc.stdout is not None
    first = proc.stdout.readline()  # one record out: the run is under way
    os.kill(engine.record()["pid"], signal.SIGKILL)
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert json.loads(first)["custom_id"] == "line-1"
    assert all(json.loads(line)["custom_id"] for line in rest.splitlines())  # whole records only
    assert err.strip().splitlines() == [f"Error: the engine at {where} went away mid-run"]


def test_a_warm_batch_runs_with_the_model_stack_blocked(serial: Engine, requests_file: Path) -> None:
    from tests.conftest import REPO
    from tests.warm.test_client import BLOCK

    args = ["batch", str(requests_file), *serial.load_args, "--seed", "3", "-n", "10", "--no-log", "-q"]
    code = f"{BLOCK}from llmsample.cli import main\nsys.argv = ['llmsample', *{args!r}]\nmain()\n"
    blocked = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=serial.env,
                             cwd=REPO, timeout=120)  # fmt: skip
    assert blocked.returncode == 1 and blocked.stderr == "", blocked.stderr  # the bad line's error record: exit 1
    assert comparable(blocked.stdout) == comparable(serial.cli(*args).stdout)


def test_ctrl_c_cancels_the_rows_in_flight(serial: Engine, tmp_path: Path) -> None:
    """Exit 130, and the engine ends the run's rows (decoding and queued) as cancelled."""
    from llmsample.client.connection import Target, get_json

    def health() -> dict:
        return get_json(Target(f"unix:{serial.record()['socket']}"), "/health")

    source = tmp_path / "long.jsonl"
    source.write_text("".join(json.dumps({"prompt": "w3", "min_tokens": 900, "max_tokens": 900}) + "\n" for _ in range(3)))
    before = health()
    command = [sys.executable, "-m", "llmsample", "batch", str(source), *serial.load_args, "--no-log", "-q"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=serial.env)
    deadline = time.monotonic() + 120
    while health()["in_flight"] < 2 and time.monotonic() < deadline:  # one row decoding, one queued
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and out == "", err
    while health()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    after = health()
    assert after["in_flight"] == 0 and after["cancelled"] - before["cancelled"] == 2
    assert after["finished"] == before["finished"]
