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


def test_compile_gives_the_eager_records(tiny_model_dir: Path) -> None:
    """``batch --compile`` (waves of --batch-size over one static cache, really compiled) writes
    the eager run's tokens in float32, request for request, with compile_s in each summary."""
    lines = ["w4 w5 w6 w7 w8", json.dumps({"prompt": "w12", "seed": 9, "presence_penalty": 1.5, "top_k": 9}),
             json.dumps({"prompt": "w20 w3", "temperature": 0, "max_tokens": 3}), "w9 w10",
             json.dumps({"prompt": "w14 w15 w16", "seed": 4, "top_p": 0.8, "max_tokens": 8})]  # fmt: skip
    args = ("-n", "6", "--seed", "1", "--batch-size", "2", "--dtype", "float32", "--tokens", "ids")
    compiled = batch(*args, "--compile", stdin="\n".join(lines), model=tiny_model_dir, timeout=300)
    eager = batch(*args, stdin="\n".join(lines), model=tiny_model_dir)
    assert compiled.returncode == 0 and eager.returncode == 0, compiled.stderr + eager.stderr
    mine, theirs = records(compiled.stdout), records(eager.stdout)
    assert [r["custom_id"] for r in mine] == [r["custom_id"] for r in theirs] and len(mine) == len(lines)
    for a, b in zip(mine, theirs, strict=True):
        assert [t["token_id"] for t in a["per_token"]] == [t["token_id"] for t in b["per_token"]], a["custom_id"]
        assert a["text"] == b["text"] and a["compile_s"] > 0 and b.get("compile_s") is None


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
    deadline = time.monotonic() + 180
    while not out.exists() or out.stat().st_size == 0:
        assert time.monotonic() < deadline and process.poll() is None, "no record within 180 s"
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130 and "Traceback" not in stderr
    kept = out.read_text()
    assert kept.endswith("\n") and 1 <= len(records(kept)) < 400


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--compile", "--draft", "ngram"), "--draft with --compile"),
        (("--temperature", "-1"), "--temperature"),
        (("--preset", "nope"), "unknown preset"),
        (("/nonexistent/requests.jsonl",), "cannot read /nonexistent/requests.jsonl"),
    ],
)
def test_run_level_errors_are_one_line_exit_2(tiny_model_dir: Path, args: tuple[str, ...], fragment: str) -> None:
    result = batch(*args, stdin="w3\n", model=tiny_model_dir)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and fragment in result.stderr


# Reliability: the -o file. Real processes; the kill cases over several ranks are in
# tests/batch/test_distributed.py, the property over every interleaving in tests/batch/test_integrity.py.


def ids_and_tokens(path: Path) -> list[tuple]:
    return [(r["custom_id"], r["line"], r.get("text"), [t["token_id"] for t in r.get("per_token", [])])
            for r in records(path.read_text())]  # fmt: skip


def requests_file(tmp_path: Path, count: int = 12) -> Path:
    source = tmp_path / "in.txt"
    source.write_text("".join(f"w{3 + i % 25} w{5 + i % 20}\n" for i in range(count)))
    return source


def test_a_rerun_after_a_merge_cut_short_has_every_request_once_in_input_order(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """What an earlier version's merge left when it was killed: OUT holds the first 5 of the 8
    records of the two rank parts, which are still beside it; line 2's record is in part 1."""
    source = requests_file(tmp_path)
    reference = tmp_path / "reference.jsonl"
    args = ("-n", "4", "--seed", "3", "--tokens", "ids")
    assert batch(str(source), "-o", str(reference), *args, model=tiny_model_dir).returncode == 0
    lines = reference.read_text().splitlines(keepends=True)
    out = tmp_path / "out.jsonl"
    (tmp_path / "out.jsonl.part-0-of-2").write_text("".join(lines[i] for i in (0, 2, 4, 8)))  # a killed rank: gaps
    (tmp_path / "out.jsonl.part-1-of-2").write_text("".join(lines[i] for i in (1, 3, 7, 9)) + lines[11][:30])
    out.write_text("".join(lines[:5]))  # the merged 1, 2, 3, 4, 5 of 1, 2, 3, 4, 5, 8, 9, 10
    rerun = batch(str(source), "-o", str(out), *args, model=tiny_model_dir)
    assert rerun.returncode == 0, rerun.stderr
    assert ids_and_tokens(out) == ids_and_tokens(reference)  # 12 records, each once, in input order
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.jsonl", "reference.jsonl"]


def test_a_second_run_on_the_same_output_is_refused_naming_the_first(tiny_model_dir: Path, tmp_path: Path) -> None:
    source = requests_file(tmp_path)
    out = tmp_path / "same.jsonl"
    command = [sys.executable, "-m", "llmsample", "batch", "-", "-o", str(out), "-m", str(tiny_model_dir),
               "--device", "cpu", "--raw", "-q", "-n", "4", "--seed", "3", "--tokens", "ids"]  # fmt: skip
    # The first holds the output while it waits for its input on stdin.
    first = subprocess.Popen(command, stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env())
    lock = tmp_path / "same.jsonl.lock"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (lock.exists() and lock.read_text().startswith("pid")):
        time.sleep(0.05)
    second = batch(str(source), "-o", str(out), "-n", "4", "--seed", "3", model=tiny_model_dir)
    assert second.returncode == 2 and second.stdout == ""
    assert len(second.stderr.strip().splitlines()) == 1
    assert f"is being written by another llmsample batch (pid {first.pid} on " in second.stderr
    first.kill()  # SIGKILL: its lock file stays, but nothing holds it
    first.communicate(timeout=60)
    assert lock.exists()
    third = batch(str(source), "-o", str(out), "-n", "4", "--seed", "3", "--tokens", "ids", model=tiny_model_dir)
    assert third.returncode == 0, third.stderr
    assert [r[0] for r in ids_and_tokens(out)] == [f"line-{n}" for n in range(1, 13)]
    assert not lock.exists()


def test_two_runs_started_together_leave_every_request_once(tiny_model_dir: Path, tmp_path: Path) -> None:
    source = requests_file(tmp_path)
    out = tmp_path / "same.jsonl"
    command = [sys.executable, "-m", "llmsample", "batch", str(source), "-o", str(out), "-m", str(tiny_model_dir),
               "--device", "cpu", "--raw", "-q", "-n", "4", "--seed", "3", "--tokens", "ids"]  # fmt: skip
    runs = [subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=cli_env()) for _ in range(2)]
    ends = [(run.wait(timeout=120), run.communicate()[1]) for run in runs]
    assert sorted(code for code, _ in ends) in ([0, 0], [0, 2]), ends
    for code, stderr in ends:
        assert code == 0 or (len(stderr.strip().splitlines()) == 1 and "another llmsample batch (pid" in stderr)
    assert [r[0] for r in ids_and_tokens(out)] == [f"line-{n}" for n in range(1, 13)]


def test_output_to_dev_stdout_through_a_pipe_is_written_without_resuming(tiny_model_dir: Path, tmp_path: Path) -> None:
    source = requests_file(tmp_path, 3)
    line = (f"{sys.executable} -m llmsample batch {source} -o /dev/stdout -m {tiny_model_dir} --device cpu --raw -q "
            "-n 3 --seed 3 | cat")  # fmt: skip
    result = subprocess.run(["bash", "-o", "pipefail", "-c", line], capture_output=True, text=True, env=cli_env(),
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert [r["custom_id"] for r in records(result.stdout)] == ["line-1", "line-2", "line-3"]
    assert not Path("/dev/stdout.lock").exists() and not list(Path("/dev").glob(".stdout.*"))


def test_a_read_only_output_folder_is_one_line_before_the_model_loads(tiny_model_dir: Path, tmp_path: Path) -> None:
    from tests.batch.tmpfs import tmpfs

    source = requests_file(tmp_path, 2)
    with tmpfs(tmp_path / "ro", "ro", "size=64k") as folder:
        # A model that does not exist: the output is what it reports, so it was checked first.
        result = batch(str(source), "-o", str(folder / "out.jsonl"), "-m", "/nonexistent/model", model=tiny_model_dir)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert f"cannot write in {folder} (Read-only file system)" in result.stderr


def test_a_full_disk_mid_run_is_one_line_exit_1_and_whole_lines(tiny_model_dir: Path, tmp_path: Path) -> None:
    from tests.batch.tmpfs import fill, tmpfs

    source = requests_file(tmp_path, 40)
    with tmpfs(tmp_path / "small", "size=1m") as folder:
        filler = fill(folder, 32 * 1024)  # about 5 records of -n 8 --tokens full
        out = folder / "out.jsonl"
        args = (str(source), "-o", str(out), "-n", "8", "--seed", "3", "--batch-size", "4")
        full = batch(*args, model=tiny_model_dir)
        assert full.returncode == 1, full.stderr
        assert len(full.stderr.strip().splitlines()) == 1 and "No space left on device" in full.stderr
        kept = out.read_text()
        assert kept.endswith("\n") and 0 < len(records(kept)) < 40  # only whole lines
        filler.unlink()
        rerun = batch(*args, model=tiny_model_dir)
        assert rerun.returncode == 0, rerun.stderr
        assert [r["custom_id"] for r in records(out.read_text())] == [f"line-{n}" for n in range(1, 41)]
        assert sorted(p.name for p in folder.iterdir()) == ["out.jsonl"]


def test_world_size_without_torchrun_is_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in cli_env(WORLD_SIZE="2", RANK="0").items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    command = [sys.executable, "-m", "llmsample", "batch", str(requests_file(tmp_path, 2)), "-o",
               str(tmp_path / "out.jsonl"), "-m", str(tiny_model_dir), "--device", "cpu", "-q"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert "not launched by torchrun" in result.stderr and "torchrun --nproc-per-node 2" in result.stderr
