"""``llmsample batch`` end to end: the three input formats, records equal to ``generate`` alone,
per-request errors, input order, resume, and exit codes (real subprocesses where it matters)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import cli_env

LINES = [
    "w4 w5 w6",
    json.dumps({"prompt": "w7 w8", "custom_id": "b", "temperature": 0, "max_tokens": 3}),
    json.dumps({"prompt": "w9", "top_p": 2}),  # out of range: an error record
    "{not json",
    json.dumps({"custom_id": "o1", "method": "POST", "url": "/v1/completions",
                "body": {"prompt": "w3 w4", "max_tokens": 4, "logprobs": 2}}),
    json.dumps({"prompt": "w10 w11", "preset": "nope"}),
    json.dumps({"prompt": "w12", "seed": 9, "stop": "w5", "presence_penalty": 1.5}),
]  # fmt: skip


def batch(*args: str, stdin: str | None = None, model: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "llmsample", "batch", *args, "-m", str(model), "--device", "cpu", "--raw", "-q"]
    return subprocess.run(command, input=stdin, capture_output=True, text=True, env=cli_env(), timeout=timeout)


def generate_alone(model: Path, prompt: str, *args: str) -> list[int]:
    command = [sys.executable, "-m", "llmsample", "generate", "-m", str(model), "--device", "cpu", "--raw", "-q",
               "-p", prompt, "--format", "jsonl", *args]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=cli_env(), timeout=120)
    return [json.loads(line)["token_id"] for line in result.stdout.splitlines()[:-1]]


def records(text: str) -> list[dict]:
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in the output")

    return [json.loads(line, parse_constant=refuse) for line in text.splitlines()]


def test_every_format_in_input_order_with_errors_per_request(tiny_model_dir: Path) -> None:
    result = batch("-n", "5", "--seed", "1", stdin="\n".join(LINES) + "\n", model=tiny_model_dir)
    assert result.returncode == 1, result.stderr  # some requests failed, the rest ran
    assert result.stderr == ""
    out = records(result.stdout)
    # An unreadable line has no custom_id: its record names the line.
    assert [r["custom_id"] for r in out] == ["line-1", "b", "line-3", None, "o1", "line-6", "line-7"]
    assert [r["line"] for r in out] == list(range(1, 8))
    errors = {r["line"]: r["error"]["message"] for r in out if "error" in r}
    assert set(errors) == {3, 4, 6}
    assert "top_p" in errors[3] and "nope" in errors[6]
    done = {r["custom_id"]: r for r in out if "error" not in r}
    assert done["b"]["tokens"] == 3 and done["o1"]["tokens"] == 4 and done["line-1"]["tokens"] == 5
    for record in done.values():
        assert "".join(t["text"] for t in record["per_token"]) == record["text"]


def test_a_request_equals_generate_alone(tiny_model_dir: Path) -> None:
    lines = ["w4 w5 w6", json.dumps({"prompt": "w12", "seed": 9, "presence_penalty": 1.5, "top_k": 9}), "w20 w3"]
    result = batch("-n", "6", "--seed", "1", "--batch-size", "2", stdin="\n".join(lines), model=tiny_model_dir)
    assert result.returncode == 0, result.stderr
    out = records(result.stdout)
    ids = [[t["token_id"] for t in r["per_token"]] for r in out]
    assert ids[0] == generate_alone(tiny_model_dir, "w4 w5 w6", "-n", "6", "--seed", "1")
    assert ids[1] == generate_alone(tiny_model_dir, "w12", "-n", "6", "--seed", "9", "--presence-penalty", "1.5",
                                    "--top-k", "9")  # fmt: skip
    assert ids[2] == generate_alone(tiny_model_dir, "w20 w3", "-n", "6", "--seed", "1")


def test_openai_output_format(tiny_model_dir: Path) -> None:
    line = {"custom_id": "c1", "method": "POST", "url": "/v1/completions",
            "body": {"prompt": "w3 w4", "max_tokens": 3, "logprobs": 2, "seed": 4}}  # fmt: skip
    bad = {"custom_id": "c2", "method": "POST", "url": "/v1/completions", "body": {"prompt": "w3", "best_of": 2}}
    result = batch("--format", "openai", stdin=f"{json.dumps(line)}\n{json.dumps(bad)}\n", model=tiny_model_dir)
    first, second = records(result.stdout)
    body = first["response"]["body"]
    assert first["custom_id"] == "c1" and first["error"] is None and body["object"] == "text_completion"
    assert body["usage"]["completion_tokens"] == 3 and len(body["choices"][0]["logprobs"]["tokens"]) == 3
    assert second["response"] is None and "best_of" in second["error"]["message"]
    assert result.returncode == 1


def test_resume_skips_what_is_done_and_repairs_a_torn_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("".join(f"w{i} w{i + 1}\n" for i in range(3, 9)))
    out = tmp_path / "out.jsonl"
    full = batch(str(source), "-o", str(out), "-n", "4", "--seed", "2", model=tiny_model_dir)
    assert full.returncode == 0 and full.stdout == ""
    complete = out.read_text().splitlines(keepends=True)
    assert len(complete) == 6
    # A killed run: three records and half of the fourth.
    out.write_text("".join(complete[:3]) + complete[3][:20])
    again = batch(str(source), "-o", str(out), "-n", "4", "--seed", "2", model=tiny_model_dir)
    assert again.returncode == 0, again.stderr
    resumed = records(out.read_text())
    assert [r["custom_id"] for r in resumed] == [f"line-{i}" for i in range(1, 7)]

    # The same tokens (their probabilities may differ in the last bits: other rows, other matmul shapes).
    def outcome(record: dict) -> tuple:
        return record["text"], record["seed"], [t["token_id"] for t in record["per_token"]]

    assert [outcome(r) for r in resumed] == [outcome(r) for r in records("".join(complete))]


def test_interrupt_keeps_finished_records_and_exits_130(tiny_model_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("".join(f"w{3 + i % 20}\n" for i in range(400)))
    out = tmp_path / "out.jsonl"
    command = [sys.executable, "-m", "llmsample", "batch", str(source), "-o", str(out), "-m", str(tiny_model_dir),
               "--device", "cpu", "--raw", "-q", "-n", "6", "--ignore-eos", "--batch-size", "2"]  # fmt: skip
    process = subprocess.Popen(command, env=cli_env(), stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not out.exists() or out.stat().st_size == 0):
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130 and "Traceback" not in stderr
    kept = out.read_text()
    assert kept.endswith("\n") and 1 <= len(records(kept)) < 400


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--compile",), "--compile decodes rows of one prompt in lockstep"),
        (("--temperature", "-1"), "--temperature"),
        (("--preset", "nope"), "unknown preset"),
        (("/nonexistent/requests.jsonl",), "cannot read /nonexistent/requests.jsonl"),
    ],
)
def test_run_level_errors_are_one_line_exit_2(tiny_model_dir: Path, args: tuple[str, ...], fragment: str) -> None:
    result = batch(*args, stdin="w3\n", model=tiny_model_dir)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and fragment in result.stderr
