"""A deterministic engine (``llmsample start --deterministic``): part of the engine's identity
(``ps`` shows it, a plain engine of the same model runs beside it), it takes the commands run
with ``--deterministic`` and only those, and every row it decodes is computed alone, so
``batch --deterministic`` prints the in-process run's bytes at any batch size (rows joining and
leaving), and so does ``compare-presets --deterministic``, figures to the bit."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.warm.conftest import Engine, start_engine
from tests.warm.test_batch import comparable

LINES = [
    json.dumps({"custom_id": f"r{i}", "prompt": f"w{3 + i % 5} w{4 + i % 3}", "seed": i, "max_tokens": 4 + 3 * (i % 4),
                **({"preset": "creative"} if i % 3 == 0 else {})})
    for i in range(9)
]  # fmt: skip
"""Nine rows of four lengths: on an engine of three rows, rows leave and the next ones join mid-run."""


@pytest.fixture(scope="module")
def engines(chat_model: Path) -> Iterator[Engine]:
    """A deterministic engine of three rows, and a plain one of the same model beside it."""
    engine = start_engine(chat_model, "--deterministic", "--batch-size", "3")
    plain = engine.cli("start", *engine.load_args, "-q")
    assert plain.returncode == 0, plain.stderr
    yield engine
    engine.cli("stop", "--all")


def test_ps_shows_the_mode_and_the_two_engines_stand_apart(engines: Engine) -> None:
    listed = engines.cli("ps")
    header, *rows = listed.stdout.splitlines()
    assert header.split()[:5] == ["MODEL", "BACKEND", "DTYPE", "MODE", "ROWS"]
    assert sorted(row.split()[3] for row in rows) == ["batched", "deterministic"]
    again = engines.cli("start", *engines.load_args, "--deterministic", "-q")
    assert again.returncode == 0 and "already running" in again.stdout and "deterministic" in again.stdout


def test_only_deterministic_commands_go_to_it(engines: Engine) -> None:
    """The summary says which engine decoded: the deterministic one computes rows alone."""
    exact = json.loads(engines.generate("-p", "w3", "-n", "3", "--deterministic", "--format", "jsonl").stdout
                       .splitlines()[-1])  # fmt: skip
    plain = json.loads(engines.generate("-p", "w3", "-n", "3", "--format", "jsonl").stdout.splitlines()[-1])
    assert exact["warm"] is True and exact["deterministic"] is True
    assert plain["warm"] is True and "deterministic" not in plain and plain["engine"] != exact["engine"]


@pytest.mark.parametrize("tokens", ["full", "ids", "none"])
def test_batch_prints_the_in_process_bytes_at_any_batch_size(engines: Engine, tmp_path: Path, tokens: str) -> None:
    source = tmp_path / "requests.jsonl"
    source.write_text("\n".join(LINES) + "\n")
    args = ("batch", str(source), *engines.load_args, "-n", "16", "--top-n", "3", "--tokens", tokens, "--no-log",
            "--deterministic")  # fmt: skip
    warm, local = engines.cli(*args), engines.cli(*args, "--local", "--batch-size", "4")
    assert warm.returncode == local.returncode == 0, warm.stderr + local.stderr
    warm_records, local_records = comparable(warm.stdout), comparable(local.stdout)
    for record in warm_records:
        assert record.pop("engine").startswith("unix:") and record.pop("warm") is True
    assert warm_records == local_records and len(warm_records) == 9
    assert all(record["deterministic"] is True for record in warm_records)
    assert len({record["tokens"] for record in warm_records}) > 1  # rows of different lengths left and joined


def test_compare_presets_deterministic_on_such_an_engine_is_the_in_process_run(engines: Engine) -> None:
    args = ("compare-presets", *engines.load_args, "-p", "w3 w4", "--presets", "creative,balanced", "--samples", "3",
            "--seed", "6", "-n", "10", "--format", "jsonl", "-q", "--deterministic")  # fmt: skip
    warm, local = engines.cli(*args), engines.cli(*args, "--local")
    assert warm.returncode == local.returncode == 0, warm.stderr + local.stderr
    records, local_records = (
        [json.loads(line) for line in warm.stdout.splitlines()],
        [json.loads(line) for line in local.stdout.splitlines()],
    )
    for record in (*records, *local_records):
        record.pop("tokens_per_s")
    assert records == local_records and len(records) == 6  # the figures too, to the last bit


def test_a_plain_server_refuses_deterministic_in_one_line(engines: Engine) -> None:
    plain = next(r for r in map(json.loads, map(Path.read_text, (engines.runtime / "llmsample").glob("*.json")))
                 if not r["spec"]["deterministic"])  # fmt: skip
    for command in ("generate", "batch"):
        args = ("-p", "w3") if command == "generate" else ("-",)
        done = engines.cli(command, *args, *engines.load_args, "--deterministic", "--host", f"unix:{plain['socket']}",
                           input="w3\n")  # fmt: skip
        assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
        assert "--deterministic needs an engine started with --deterministic" in done.stderr


def test_explain_on_a_deterministic_server_is_the_in_process_explain(engines: Engine) -> None:
    """explain has no deterministic mode: such an engine answers it as a plain model, to the bit."""
    exact = next(r for r in map(json.loads, map(Path.read_text, (engines.runtime / "llmsample").glob("*.json")))
                 if r["spec"]["deterministic"])  # fmt: skip
    args = ("explain", *engines.load_args, "-p", "w4 w6 w3", "--continuation", " w7 w3 w5 w9", "--format", "jsonl")
    there = engines.cli(*args, "--host", f"unix:{exact['socket']}")
    assert there.returncode == 0 and there.stdout == engines.cli(*args, "--local").stdout, there.stderr


def test_chat_replay_is_refused_on_a_deterministic_engine(engines: Engine) -> None:
    """--replay turns --deterministic on, so a deterministic engine would run it: one line."""
    done = engines.cli("chat", *engines.load_args, "--replay", "-c")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "--replay does not run on the warm engine" in done.stderr
