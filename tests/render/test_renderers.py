"""Renderers and terminal behaviour: colour bands, a real pseudo-terminal, HTML in a real
browser, ``| head`` and Ctrl-C through real subprocesses."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pexpect
import pytest

from llmsample.render.bands import BANDS, band_for
from llmsample.render.inspect import visible
from tests.conftest import cli_env


@pytest.mark.parametrize(
    ("prob", "label"),
    [(1.0, ">90%"), (0.9, ">90%"), (0.8999, "60-90%"), (0.6, "60-90%"), (0.45, "30-60%"), (0.3, "30-60%"),
     (0.29, "10-30%"), (0.1, "10-30%"), (0.0999, "<10%"), (0.0, "<10%")],
)  # fmt: skip
def test_colour_bands(prob: float, label: str) -> None:
    assert band_for(prob).label == label


def test_bands_are_distinct_and_ordered() -> None:
    assert len({b.style for b in BANDS}) == len(BANDS)
    assert [b.low for b in BANDS] == sorted((b.low for b in BANDS), reverse=True)


def test_visible_whitespace() -> None:
    assert visible(" a\tb\n") == "·a→b↵"
    assert visible("\x07") == "\\x07"
    assert visible("") == "∅"


def generate_args(model: Path, *extra: str) -> list[str]:
    return ["-m", "llmsample", "generate", "-m", str(model), "--raw", "-p", "w3 w4", "-n", "30", "--seed", "1",
            "--ignore-eos", "--device", "cpu", *extra]  # fmt: skip


def run_in_pty(args: list[str], **env: str) -> str:
    """Stdout and stderr share the terminal: --quiet keeps the spinner and legend out of it."""
    child = pexpect.spawn(
        sys.executable, [*args, "--quiet"], env=cli_env(**env), encoding="utf-8", timeout=120, dimensions=(40, 120)
    )
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    return child.before


def test_terminal_gets_colour_and_no_color_turns_it_off(tiny_model_dir: Path) -> None:
    coloured = run_in_pty(generate_args(tiny_model_dir), TERM="xterm-256color")
    assert "\x1b[" in coloured
    plain = run_in_pty(generate_args(tiny_model_dir), TERM="xterm-256color", NO_COLOR="1")
    assert "\x1b[" not in plain and "w" in plain
    flag = run_in_pty(generate_args(tiny_model_dir, "--no-color"), TERM="xterm-256color", FORCE_COLOR="1")
    assert "\x1b[" not in flag


def test_no_color_wins_over_force_color(tiny_model_dir: Path) -> None:
    out = run_in_pty(generate_args(tiny_model_dir), TERM="xterm-256color", NO_COLOR="1", FORCE_COLOR="1")
    assert "\x1b[" not in out


def test_inspect_table_and_jsonl_agree(tiny_model_dir: Path) -> None:
    jsonl = subprocess.run([sys.executable, *generate_args(tiny_model_dir, "--format", "jsonl")],
                           capture_output=True, text=True, env=cli_env(), check=True).stdout  # fmt: skip
    table = subprocess.run([sys.executable, *generate_args(tiny_model_dir, "--inspect")],
                           capture_output=True, text=True, env=cli_env(), check=True).stdout  # fmt: skip
    events = [json.loads(line) for line in jsonl.splitlines()][:-1]
    for event in events:
        assert f"{event['prob']:.3f}" in table and f"{event['model_prob']:.3f}" in table
    assert "\x1b" not in table


def test_the_summary_line_counts_the_load_and_the_first_token_from_the_start(tiny_model_dir: Path) -> None:
    """The wait a user sees: the model's load named, the first token counted from the command's
    start (the load in it), not from the row's."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, *generate_args(tiny_model_dir)], capture_output=True, text=True,
                          env=cli_env(), timeout=120)  # fmt: skip
    waited = time.perf_counter() - started
    assert done.returncode == 0, done.stderr
    line = done.stderr.splitlines()[-1]
    load, first = re.search(r"load (\d+\.\d+) s", line), re.search(r"first token (\d+\.\d+) s", line)
    assert load and first, line
    assert 0 < float(load[1]) <= float(first[1]) < waited


def test_head_closes_the_pipe_quietly(tiny_model_dir: Path) -> None:
    args = ["-m", "llmsample", "generate", "-m", str(tiny_model_dir), "--raw", "-p", "w3", "-n", "2000", "--ignore-eos",
            "--format", "jsonl"]  # fmt: skip
    command = f"{sys.executable} {' '.join(args)} | head -c 20"
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=cli_env(), timeout=120)
    assert len(result.stdout) == 20
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr
    assert "Broken pipe" not in result.stderr


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_keeps_output_and_ends_with_a_summary(tiny_model_dir: Path, sig: int, code: int) -> None:
    args = ["-m", "llmsample", "generate", "-m", str(tiny_model_dir), "--raw", "-p", "w3", "-n", "100000",
            "--ignore-eos", "--format", "jsonl"]  # fmt: skip
    # Unbuffered: a buffered readline reads ahead, and communicate() then skips what it buffered.
    proc = subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(), bufsize=0
    )
    first = proc.stdout.readline().decode()
    assert json.loads(first)["type"] == "token"
    proc.send_signal(sig)
    out, err = (stream.decode() for stream in proc.communicate(timeout=60))
    lines = [first, *out.splitlines()]
    summary = json.loads(lines[-1])
    assert proc.returncode == code
    assert summary["type"] == "summary" and summary["stop_reason"] == "interrupted"
    assert summary["tokens"] == len(lines) - 1
    assert "".join(json.loads(line)["text"] for line in lines[:-1]) == summary["text"]
    assert "Traceback" not in err and "interrupted" in err


# --- HTML in a real browser ----------------------------------------------------------------------


class TokenSpans(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tokens: list[dict[str, str]] = []
        self.probs: list[str] = []
        self._in_prob = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        attributes = dict(attrs)
        if tag == "span" and "tok" in (attributes.get("class") or "").split():
            self.tokens.append(attributes)
        self._in_prob = tag == "b" and attributes.get("class") == "prob"

    def handle_data(self, data: str) -> None:
        if self._in_prob:
            self.probs.append(data)
            self._in_prob = False


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


@pytest.mark.skipif(chromium() is None, reason="no chromium (make test installs Debian's where apt is available)")
def test_html_view_in_a_real_browser(tiny_model_dir: Path, tmp_path: Path) -> None:
    page = tmp_path / "run.html"
    result = subprocess.run([sys.executable, *generate_args(tiny_model_dir, "--format", "jsonl", "--html", str(page))],
                            capture_output=True, text=True, env=cli_env(), check=True)  # fmt: skip
    events = [json.loads(line) for line in result.stdout.splitlines()][:-1]
    profile = tmp_path / "profile"
    flags = [*BROWSER_FLAGS, f"--user-data-dir={profile}"]
    dom = subprocess.run([chromium(), *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    parser = TokenSpans()
    parser.feed(dom.stdout)
    assert len(parser.tokens) == len(events) == 30
    for span, tip_prob, event in zip(parser.tokens, parser.probs, events, strict=True):
        assert int(span["data-token-id"]) == event["token_id"]
        assert float(tip_prob) == pytest.approx(event["prob"], abs=5e-5)
    shot = tmp_path / "shot.png"
    subprocess.run([chromium(), *flags, f"--screenshot={shot}", "--window-size=900,600", page.as_uri()],
                   capture_output=True, timeout=120)  # fmt: skip
    assert shot.exists() and shot.stat().st_size > 1000
    assert "http" not in page.read_text().replace("http-equiv", "")  # self-contained: no external assets
    os.environ.get("KEEP_SCREENSHOT") and shutil.copy(shot, os.environ["KEEP_SCREENSHOT"])


# --- the newer stages in every view --------------------------------------------------------------


def test_new_stages_reach_jsonl_inspect_and_html(tiny_model_dir: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from llmsample.cli import main

    page = tmp_path / "view.html"
    args = ["generate", "-m", str(tiny_model_dir), "--raw", "-p", "w4 w5 w6 w4 w5", "-n", "12", "--seed", "3",
            "--device", "cpu", "-q", "--ignore-eos", "--preset", "fiction", "--typical-p", "0.95",
            "--top-n-sigma", "2", "--ban", "w6 w4", "--min-tokens", "3", "--logit-bias", "w9=1.5"]  # fmt: skip
    jsonl = CliRunner().invoke(main, [*args, "--format", "jsonl", "--html", str(page)])
    assert jsonl.exit_code == 0, jsonl.output
    events = [json.loads(line) for line in jsonl.stdout.splitlines()][:-1]
    assert set(events[0]["removed"]) == {"ban", "min_tokens", "top_n_sigma", "top_k", "top_p", "typical_p",
                                         "min_p", "xtc"}  # fmt: skip
    assert any(e["removed"]["min_tokens"] for e in events[:3]) and not any(
        e["removed"]["min_tokens"] for e in events[3:]
    )
    assert "w6 w4" not in "".join(e["text"] for e in events)
    assert "removed: " in page.read_text() and "XTC" in page.read_text()
    table = CliRunner().invoke(main, [*args, "--inspect"])
    assert table.exit_code == 0, table.output
    assert "XTC, when it fires (x)" in table.stdout and "typical-p (t)" in table.stdout
