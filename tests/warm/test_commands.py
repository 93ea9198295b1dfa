"""``compare-presets`` on a warm engine: a preset's samples go as jobs sent together and print
what the in-process run prints (the records without their clocks, the HTML page byte for byte)."""

from __future__ import annotations

import json
from pathlib import Path

from llmsample.client.connection import Target, get_json
from llmsample.client.wire import ENGINE_PATH
from tests.warm.conftest import Engine


def finished(engine: Engine) -> int:
    """Rows the engine has finished so far."""
    return get_json(Target("unix:" + engine.record()["socket"]), ENGINE_PATH)["finished"]


def without_clocks(stdout: str) -> list[dict]:
    records = [json.loads(line) for line in stdout.splitlines()]
    for record in records:
        assert record.pop("tokens_per_s") is not None
    return records


def test_compare_presets_prints_the_same(engine: Engine, tmp_path: Path) -> None:
    args = ("compare-presets", *engine.load_args, "-p", "w3 w4", "--system", "w9", "--presets", "creative,balanced",
            "--samples", "3", "--seed", "6", "-n", "10", "--format", "jsonl", "-q")  # fmt: skip
    before = finished(engine)
    warm = engine.cli(*args, "--html", str(tmp_path / "warm.html"))
    assert finished(engine) == before + 7  # the greedy reference and 2 x 3 samples ran there
    local = engine.cli(*args, "--html", str(tmp_path / "local.html"), "--local")
    assert warm.returncode == local.returncode == 0, warm.stderr + local.stderr
    records = without_clocks(warm.stdout)
    assert records == without_clocks(local.stdout) and len(records) == 6
    assert len({record["text"] for record in records}) > 1  # the seeds differ, and so do the samples
    assert (tmp_path / "warm.html").read_bytes() == (tmp_path / "local.html").read_bytes()
