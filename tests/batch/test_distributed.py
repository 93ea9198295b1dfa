"""``torchrun -m llmsample batch``: two CPU processes (gloo) give the single-process output,
merged in input order; a run killed mid-way loses only what was in flight, and a rerun (with
any number of ranks) completes it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil  # accelerate's dependency

from llmsample.batch.distributed import Ranks, my_share, part_path
from tests.conftest import cli_env


def outcome(path: Path) -> list[tuple]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [(r["custom_id"], r.get("text"), [t["token_id"] for t in r.get("per_token", [])]) for r in records]


def batch_command(model: Path, source: Path, out: Path, ranks: int, *extra: str) -> list[str]:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "-m", "llmsample"]
    single = [sys.executable, "-m", "llmsample"]
    return [*(launcher if ranks > 1 else single), "batch", str(source), "-o", str(out), "-m", str(model),
            "--device", "cpu", "--raw", "-q", "--tokens", "ids", *extra]  # fmt: skip


def test_shares_are_disjoint_and_cover_the_input() -> None:
    items = list(range(11))
    shares = [my_share(items, Ranks(rank, 3)) for rank in range(3)]  # type: ignore[arg-type]
    assert sorted(x for share in shares for x in share) == items and all(len(share) in (3, 4) for share in shares)
    assert part_path(Path("out.jsonl"), Ranks(1, 3)).name == "out.jsonl.part-1-of-3"


def test_two_ranks_equal_one_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    lines = [f"w{3 + i} w{5 + i}" for i in range(9)]
    lines.insert(4, json.dumps({"prompt": "w7", "custom_id": "x", "temperature": 0, "max_tokens": 3}))
    source.write_text("\n".join(lines) + "\n")
    alone, together = tmp_path / "alone.jsonl", tmp_path / "together.jsonl"
    args = ("-n", "5", "--seed", "3")
    first = subprocess.run(batch_command(tiny_model_dir, source, alone, 1, *args), env=cli_env(), timeout=300)
    second = subprocess.run(
        batch_command(tiny_model_dir, source, together, 2, *args), env=cli_env(), timeout=300, capture_output=True
    )
    assert first.returncode == 0 and second.returncode == 0, second.stderr[-2000:]
    assert outcome(together) == outcome(alone)
    assert [r[0] for r in outcome(together)][:6] == ["line-1", "line-2", "line-3", "line-4", "x", "line-6"]
    assert not list(tmp_path.glob("together.jsonl.part-*")) and not (tmp_path / "together.jsonl.lock").exists()


def test_a_killed_run_is_completed_by_a_rerun(tiny_model_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    # Enough work that the kill lands mid-run: the decoding after the first records takes seconds,
    # while the wait polls every 20 ms (with a few requests the run could finish between polls).
    requests = 600
    source.write_text("".join(f"w{3 + i % 25} w{4 + i % 20}\n" for i in range(requests)))
    reference, out = tmp_path / "reference.jsonl", tmp_path / "out.jsonl"
    args = ("-n", "6", "--seed", "5", "--batch-size", "2")
    process = subprocess.Popen(
        batch_command(tiny_model_dir, source, out, 2, *args), env=cli_env(), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and sum(p.stat().st_size for p in tmp_path.glob("out.jsonl.part-*")) < 2000:
        time.sleep(0.02)
    # torchrun starts each rank in a session of its own: killing the launcher's group leaves them
    # running, so each rank is killed too, as a machine going down would.
    ranks = psutil.Process(process.pid).children(recursive=True)
    os.killpg(process.pid, signal.SIGKILL)
    for rank in ranks:
        with contextlib.suppress(psutil.NoSuchProcess):
            rank.kill()
    process.wait(timeout=60)
    psutil.wait_procs(ranks, timeout=60)
    parts = list(tmp_path.glob("out.jsonl.part-*"))
    assert parts and not out.exists()
    kept = sum(len(p.read_text().splitlines()) for p in parts)
    assert 0 < kept < requests
    # The rerun uses one process: whatever the number of ranks, the parts are taken over.
    rerun = subprocess.run(batch_command(tiny_model_dir, source, out, 1, *args), env=cli_env(), timeout=600)
    assert rerun.returncode == 0
    assert subprocess.run(batch_command(tiny_model_dir, source, reference, 1, *args), env=cli_env()).returncode == 0
    assert outcome(out) == outcome(reference)  # every request once, in input order (not parts first)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.jsonl", "reference.jsonl"]
