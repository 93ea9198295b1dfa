"""``make gpu-check``, rehearsed on the CPU (``DEVICE=cpu``: the same steps on tiny shapes), and
its bookkeeping: a failing step fails the check, loudly, and the summary says which."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, cli_env

SCRIPT = REPO / "tools" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_make_gpu_check_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "results"
    if shutil.which("make"):
        args = ["make", "-s", "gpu-check", "DEVICE=cpu", f"CHECK_PYTHON={sys.executable}"]
    else:
        args = [sys.executable, str(SCRIPT), "--device", "cpu"]
    # Its own process group: a timeout ends the script and its children, not only make.
    with subprocess.Popen(args, cwd=REPO, env=cli_env(OUT=str(out)), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True) as done:  # fmt: skip
        try:
            output, _ = done.communicate(timeout=600)  # ~40 s on an idle 2-core machine
        except subprocess.TimeoutExpired:
            os.killpg(done.pid, signal.SIGKILL)
            raise
    assert done.returncode == 0, output[-5000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and summary["device"] == "cpu"
    steps = {step["name"]: step for step in summary["steps"]}
    assert list(steps) == ["versions", "nvidia-smi", "models", "pytest", "bench-eager-tiny", "batch-tiny",
                           "bench-compile-tiny"]  # fmt: skip
    assert steps["nvidia-smi"]["status"] == "skipped"
    assert all(step["status"] == "ok" for name, step in steps.items() if name != "nvidia-smi")
    assert "1 passed" in steps["pytest"]["detail"]
    for step in summary["steps"]:
        assert all((out / name).is_file() for name in step["files"]), step
    environment = json.loads((out / "environment.json").read_text())
    assert environment["packages"]["torch"]["minimum"] == "2.4" and environment["cuda_available"] is False
    benches = [json.loads(path.read_text()) for path in sorted((out / "bench").glob("bench-cpu-*.json"))]
    assert sorted(b["compile"] for b in benches) == [False, True]
    assert all(b["new_tokens"] == 8 and b["generate"][0]["ratio"] > 0 for b in benches)
    eager = next(b for b in benches if not b["compile"])
    assert eager["defaults"] and eager["defaults"][0]["ours_dtype"] == eager["dtype"]  # a bf16 checkpoint
    batch = json.loads((out / "batch-tiny.json").read_text())
    assert [row["batch_size"] for row in batch["rows"]] == [1, 8, 32, 64]
    assert all(row["ours_tok_s"] > 0 and row["reference_tok_s"] > 0 for row in batch["rows"])
    assert "gpu-check on cpu: OK" in (out / "summary.txt").read_text()


def test_a_failing_step_fails_the_check(tmp_path: Path) -> None:
    gpu_check = load_script()
    check = gpu_check.Check(tmp_path, budget_s=60)
    check.run("fine", lambda step: None)
    check.run("broken", lambda step: 1 / 0)
    assert check.write_summary("cpu") is False
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(s["name"], s["status"]) for s in summary["steps"]] == [("fine", "ok"), ("broken", "failed")]
    assert "ZeroDivisionError" in summary["steps"][1]["detail"] and (tmp_path / "broken.error.txt").is_file()
    assert "FAILED" in (tmp_path / "summary.txt").read_text()
    spent = gpu_check.Check(tmp_path, budget_s=0)
    assert spent.run("late", lambda step: None).status == "failed"  # out of time is a failure too


@pytest.mark.slow  # the versions step asks the platform (`uname -p`)
def test_versions_below_the_minimums_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu_check = load_script()
    python_min, packages = gpu_check.minimums()
    assert python_min == "3.11" and packages["transformers"] == "4.56" and packages["pytest"] == "8"
    step = gpu_check.Step("versions")
    gpu_check.check_versions(step, tmp_path, "cpu")  # this environment passes
    assert gpu_check.version_tuple("2.11.0+cu128") == (2, 11, 0) > gpu_check.version_tuple("2.4")
    monkeypatch.setattr(gpu_check, "minimums", lambda: ("3.11", {**packages, "torch": "99.0", "nonexistent-pkg": "1"}))
    with pytest.raises(RuntimeError, match=r"torch .* < 99.0; nonexistent-pkg missing"):
        gpu_check.check_versions(step, tmp_path, "cpu")


def test_the_bench_vocabulary_holds_every_prompt_word() -> None:
    gpu_check = load_script()
    vocab = gpu_check.vocabulary(1024)
    assert len(vocab) == len(set(vocab.values())) == 1024 and vocab["<eos>"] == 1
    with pytest.raises(ValueError, match="cannot hold"):
        gpu_check.vocabulary(64)
