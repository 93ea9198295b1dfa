"""``compare-presets`` on a warm engine: a preset's samples go as jobs sent together and print
the same texts, tokens and seeds as the in-process run. The figures agree to float32 rounding,
not to the bit: in-process the samples share one prefill of the prompt (the lockstep backend),
on the engine they are rows of its shared batch, and a batched matmul's rounding follows its shape."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmsample.client.connection import Target, get_json
from llmsample.client.wire import ENGINE_PATH
from tests.warm.conftest import Engine


def finished(engine: Engine) -> int:
    """Rows the engine has finished so far."""
    return get_json(Target("unix:" + engine.record()["socket"]), ENGINE_PATH)["finished"]


FIGURES = ("mean_logprob", "perplexity", "mean_entropy")


def split(stdout: str) -> tuple[list[dict], list[float]]:
    """The records without their clocks and float figures; those figures apart."""
    records = [json.loads(line) for line in stdout.splitlines()]
    for record in records:
        assert record.pop("tokens_per_s") is not None
    return records, [record.pop(key) for record in records for key in FIGURES]


def test_compare_presets_prints_the_same(engine: Engine) -> None:
    args = ("compare-presets", *engine.load_args, "-p", "w3 w4", "--system", "w9", "--presets", "creative,balanced",
            "--samples", "3", "--seed", "6", "-n", "10", "--format", "jsonl", "-q")  # fmt: skip
    before = finished(engine)
    warm = engine.cli(*args)
    assert finished(engine) == before + 9  # the greedy reference (a row per seed) and 2 x 3 samples ran there
    local = engine.cli(*args, "--local")
    assert warm.returncode == local.returncode == 0, warm.stderr + local.stderr
    (records, figures), (local_records, local_figures) = split(warm.stdout), split(local.stdout)
    assert records == local_records and len(records) == 6  # texts, token counts, seeds, divergence
    assert figures == pytest.approx(local_figures, rel=1e-5)
    assert len({record["text"] for record in records}) > 1  # the seeds differ, and so do the samples


def metric(engine: Engine, name: str) -> int:
    """A figure of the engine's /metrics."""
    connection = Target("unix:" + engine.record()["socket"]).connection(5)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    connection.close()
    (line,) = [line for line in text.splitlines() if line.startswith(f"llmsample_{name} ")]
    return int(line.split()[1])


def forward_passes(engine: Engine) -> int:
    """The engine's forward passes so far, each a step of its whole batch."""
    return metric(engine, "forward_pass_seconds_count")


def waiting(pid: int) -> bool:
    """Whether a process has started and now waits (its CPU time stands still for half a second)."""

    def ticks() -> int:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    before = ticks()
    time.sleep(0.5)
    return before > 0 and ticks() == before


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the callers' CPU time from /proc")
def test_eight_callers_at_once_share_the_engines_batch(engine: Engine) -> None:
    """8 ``generate`` processes sent their jobs while the engine was held (SIGSTOP), then let go:
    their rows decode in the same steps, so the engine runs about one answer's forward passes,
    where 8 answers one after another would need 8 times as many."""
    tokens = 40
    args = ("generate", *engine.load_args, "-p", "w3 w4", "-n", str(tokens), "--min-tokens", str(tokens), "-q")
    before = forward_passes(engine)
    pid = engine.record()["pid"]
    command = [sys.executable, "-m", "llmsample", *args]
    os.kill(pid, signal.SIGSTOP)
    try:
        callers = [subprocess.Popen([*command, "--seed", str(seed)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=engine.env) for seed in range(8)]  # fmt: skip
        deadline = time.monotonic() + 120
        while not all(waiting(caller.pid) for caller in callers) and time.monotonic() < deadline:
            pass
    finally:
        os.kill(pid, signal.SIGCONT)
    outputs = [caller.communicate(timeout=300) for caller in callers]
    assert all(caller.returncode == 0 for caller in callers), [err for _, err in outputs]
    assert len({out for out, _ in outputs}) == 8  # eight answers, each its own
    passes = forward_passes(engine) - before
    assert tokens <= passes < 2 * tokens, passes  # one after another: at least 8 x 40


SESSION = "w3 w4\nw5\n/undo\nw6 w7 w8\n/inspect\n/set temperature 0.5\n/set\nw3\n"


def test_a_piped_chat_prints_the_same_transcript(engine: Engine) -> None:
    args = ("chat", *engine.load_args, "--seed", "4", "-n", "8", "--system", "w9", "--top-n", "3", "--no-log")
    saved = metric(engine, "prompt_cache_tokens_saved_total")
    warm = engine.cli(*args, input=SESSION)
    local = engine.cli(*args, "--local", input=SESSION)
    assert warm.returncode == local.returncode == 0, warm.stderr + local.stderr
    assert warm.stdout == local.stdout and warm.stdout.count("\n") > 10  # the replies, the table, the settings
    assert metric(engine, "prompt_cache_tokens_saved_total") > saved  # later turns start from the cached prefix
    assert warm.stderr.count("engine unix:") == 4 and "engine" not in local.stderr  # each reply on the engine


def test_a_warm_chat_explains_and_counts_as_in_process(engine: Engine) -> None:
    """``/explain`` on the engine prints the in-process table, byte for byte (the chain at that
    token of the last reply, on the reply's own prompt); ``/stats`` counts the replies that came
    back; what reads the model here (``/branch``) is one line naming ``--local``."""
    args = ("chat", *engine.load_args, "--seed", "6", "-n", "6", "--system", "w9", "--no-log", "-q")
    session = "w3\n/explain 1\nw4 w5\n/set repetition_penalty 1.3\nw6\n/explain 3\n"
    warm, local = engine.cli(*args, input=session), engine.cli(*args, "--local", input=session)
    assert warm.returncode == local.returncode == 0, warm.stderr + local.stderr
    assert warm.stdout == local.stdout and warm.stdout.count("entropy of the final distribution") == 2
    warm = engine.cli(*args, input="w3\nw4\n/stats\n/branch 1 w5\n")
    assert warm.returncode == 0, warm.stderr
    assert "2 exchange(s) · 2 replies · 12 tokens generated" in warm.stdout and "the engine keeps the cache" in warm.stdout
    assert [line for line in warm.stderr.splitlines() if "--local" in line] == [
        "/branch needs the model in this process; start the chat with --local for it",
    ]
    done = engine.cli("chat", *engine.load_args, "--replay", "-c", "--no-deterministic")  # else: for a deterministic engine
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--replay does not run on the warm engine" in done.stderr
