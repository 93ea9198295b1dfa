"""``llmsample sweep`` end to end in real processes on a tiny model: its records are ``batch``'s
for the same lines, a killed sweep resumes without duplicates, the judge's figure is ``explain
--continuation``'s, the plot is written, and the page's points show their samples in chromium."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from llmsample.sweep.samples import SWEEP_KEYS
from tests.conftest import cli_env, make_tiny_model, with_chat_template
from tests.serve.page.browser import chromium
from tests.warm.test_contract import CLOCKS, WHERE

TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return with_chat_template(make_tiny_model(tmp_path_factory.mktemp("sweep")), TEMPLATE)


def cli(model: Path, *args: str, cwd: Path, **kwargs: Any) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "llmsample", *args[:1], "-m", str(model), "--device", "cpu", "--dtype",
               "float32", *args[1:]]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, env=cli_env(), cwd=cwd, timeout=300, **kwargs)


def prompts(folder: Path) -> Path:
    path = folder / "prompts.txt"
    path.write_text("w3 w4 w5\nw6 w7\n")
    return path


def records(path: Path) -> list[dict[str, Any]]:
    """The file's records without their clocks and where they ran."""
    found = [json.loads(line) for line in path.read_text().splitlines()]
    for record in found:
        for key in (*CLOCKS, *WHERE):
            record.pop(key, None)
    return found


GRID = ("--vary", "temperature=0.7,1.3", "--vary", "min_p=0,0.2", "--seeds", "3", "-n", "12")


def test_the_records_are_batchs_for_the_same_lines(model: Path, tmp_path: Path) -> None:
    plan = cli(model, "sweep", str(prompts(tmp_path)), *GRID, "--plan", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    (tmp_path / "lines.jsonl").write_text(plan.stdout)
    swept = cli(model, "sweep", "prompts.txt", *GRID, "-o", "swept.jsonl", "--format", "jsonl", cwd=tmp_path)
    batched = cli(model, "batch", "lines.jsonl", "-o", "batched.jsonl", cwd=tmp_path)
    assert swept.returncode == batched.returncode == 0, swept.stderr + batched.stderr
    mine, theirs = records(tmp_path / "swept.jsonl"), records(tmp_path / "batched.jsonl")
    assert len(mine) == 4 * 2 * 3
    assert [{k: v for k, v in r.items() if k not in SWEEP_KEYS} for r in mine] == theirs
    settings = [json.loads(line) for line in swept.stdout.splitlines()]
    assert [s["setting"] for s in settings] == ["temperature=0.7 min_p=0", "temperature=0.7 min_p=0.2",
                                                "temperature=1.3 min_p=0", "temperature=1.3 min_p=0.2"]  # fmt: skip
    assert all(s["samples"] == 6 and s["metrics"]["distinct_2"]["n"] == 2 for s in settings)
    first = [r for r in mine if r["setting"] == settings[0]["setting"]]
    logprob = sum(r["metrics"]["logprob"] for r in first) / len(first)
    assert settings[0]["metrics"]["logprob"]["mean"] == pytest.approx(logprob)
    assert any(s["pareto"] for s in settings)


def test_a_killed_sweep_resumes_without_duplicates(model: Path, tmp_path: Path) -> None:
    args = ("sweep", str(prompts(tmp_path)), "--vary", "temperature=0.5,1.0", "--seeds", "6", "-n", "60",
            "--batch-size", "1")  # fmt: skip
    whole = cli(model, *args, "-o", "whole.jsonl", cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr
    command = [sys.executable, "-m", "llmsample", args[0], "-m", str(model), "--device", "cpu", "--dtype", "float32",
               *args[1:], "-o", "killed.jsonl"]  # fmt: skip
    proc = subprocess.Popen(command, env=cli_env(), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = tmp_path / "killed.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not out.exists() or out.read_text().count("\n") < 3):
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    written = out.read_text().count("\n")
    assert 3 <= written < 24, "the sweep ended before it was killed"
    resumed = cli(model, *args, "-o", "killed.jsonl", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    again = records(out)
    assert len({r["custom_id"] for r in again}) == len(again) == 24
    assert again == records(tmp_path / "whole.jsonl")


def test_the_judges_figure_is_explains_score_of_the_text(model: Path, tmp_path: Path) -> None:
    done = cli(model, "sweep", str(prompts(tmp_path)), "--vary", "temperature=1.0", "--seeds", "2", "-n", "8",
               "--judge", str(model), "-o", "judged.jsonl", "--format", "jsonl", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    record = records(tmp_path / "judged.jsonl")[1]
    prompt = "w3 w4 w5" if record["prompt_index"] == 0 else "w6 w7"
    explained = cli(model, "explain", "-p", prompt, "--continuation", record["text"], "--format", "jsonl", cwd=tmp_path)
    scored = [json.loads(line) for line in explained.stdout.splitlines()]
    by_explain = sum(math.log(token["model_prob"]) for token in scored) / len(scored)
    assert record["metrics"]["judge_logprob"] == pytest.approx(by_explain, rel=1e-6)
    assert json.loads(done.stdout.splitlines()[0])["metrics"]["judge_logprob"]["n"] == 4


def test_mistakes_are_one_line(model: Path, tmp_path: Path) -> None:
    for args, words in (((), "nothing to sweep"), (("--vary", "temprature=1"), "did you mean temperature?"),
                        (("--vary", "temperature=1", "--y", "judge_logprob"), "--y judge_logprob needs --judge"),
                        (("--vary", "temperature=1", "--plot", "p.gif"), "write .svg, .png, .pdf, or .html"),
                        (("--vary", "temperature=1", "--x", "judge_logprob"), "--x judge_logprob needs --judge"),
                        (("--vary", "temperature=1", "--plan", "-o", "x.jsonl"), "leave out -o")):  # fmt: skip
        done = cli(model, "sweep", str(prompts(tmp_path)), *args, cwd=tmp_path)
        assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, (args, done.stderr)
        assert words in done.stderr


def test_the_plot_and_the_page_whose_points_show_their_samples(model: Path, tmp_path: Path) -> None:
    if chromium() is None:
        pytest.skip("no chromium (make test installs Debian's where apt is available)")
    from playwright.sync_api import sync_playwright

    done = cli(model, "sweep", str(prompts(tmp_path)), *GRID, "--plot", "s.svg", "--html", "s.html", "-o", "s.jsonl",
               cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    tokens = sum(r["tokens"] for r in records(tmp_path / "s.jsonl") if r["setting"] == "temperature=1.3 min_p=0")
    assert '<g id="setting-3"' in (tmp_path / "s.svg").read_text()
    png = cli(model, "sweep", str(prompts(tmp_path)), "--vary", "top_k=5,50", "-n", "4", "--plot", "s.png", cwd=tmp_path)
    assert png.returncode == 0 and (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = cli(model, "sweep", str(prompts(tmp_path)), "--vary", "top_k=5,50", "-n", "4", "--plot", "p.html", cwd=tmp_path)
    assert page.returncode == 0 and '<section class="samples" data-setting="1" hidden>' in (tmp_path / "p.html").read_text()
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium(), args=["--no-sandbox", "--disable-gpu"])
        tab = browser.new_page()
        errors: list[str] = []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.goto((tmp_path / "s.html").as_uri())
        assert not tab.is_visible('section.samples[data-setting="2"]')
        tab.click('g[id="setting-2"]')
        shown = tab.locator('section.samples[data-setting="2"]')
        assert shown.is_visible() and shown.locator("h2").inner_text() == "temperature=1.3 min_p=0"
        assert shown.locator(".sample").count() == 6 and shown.locator(".tok").count() == tokens
        assert not tab.is_visible('section.samples[data-setting="0"]')
        tab.click('tr[data-setting="0"]')
        assert tab.is_visible('section.samples[data-setting="0"]') and not shown.is_visible()
        assert errors == []
        browser.close()


@pytest.mark.slow
def test_bench_sweep_times_a_sweep_against_batch_on_its_rows(model: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from llmsample.cli import main

    args = ["bench", "--sweep", "-m", str(model), "--runs", "1", "--tokens", "8", "--out", str(tmp_path)]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("bench-sweep-*.json")
    document = json.loads(path.read_text())
    assert document["rows"] == 4 * 8 * 2 and document["tokens"] == 8
    assert len(document["sweep_tok_s"]) == len(document["batch_tok_s"]) == 1 and document["ratio"] > 0
    assert "sweep / batch" in result.stdout
