"""``llmsample bench --startup``: seconds from a fresh process to its first token, side by side in
one run (interleaved in rotating order, medians): the cold transformers path, the cold torch path
(llmsample's own forward, no transformers import), the cold llama.cpp path, a command against a warm engine, and llama-cpp-python alone loading the same GGUF, each
asked the issue's question for one greedy token; then 8 callers of the warm engine at once
against the same 8 one after another (they share its continuous batch)."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PROMPT = "What is the capital of France?"
CALLERS = 8

LLAMA_CPP_ALONE = """
import sys
from llama_cpp import Llama
llm = Llama(sys.argv[1], n_ctx=512, verbose=False)
for chunk in llm.create_completion(sys.argv[2], max_tokens=1, stream=True):
    sys.stdout.write(chunk["choices"][0]["text"] or "."); sys.stdout.flush(); break
"""


@dataclass
class StartupBench:
    """Medians over ``runs`` (seconds to the first byte on stdout) and the many-callers figures."""

    runs: int
    gguf: str
    first_token_s: dict[str, float | None] = field(default_factory=dict)
    callers: int = CALLERS
    tokens: int = 0
    together_tokens_per_s: float | None = None
    in_turn_tokens_per_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "bench-startup", **self.__dict__}


def first_byte_s(args: list[str], env: dict[str, str]) -> float | None:
    """From spawning ``args`` to the first byte it writes on stdout; None when it failed."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    first = proc.stdout.read(1)
    seconds = time.perf_counter() - start
    proc.stdout.read()
    return seconds if proc.wait(600) == 0 and first else None


def compiled() -> None:
    """llmsample's bytecode written, as pip's install leaves it: an editable install (``pip -e``)
    where none is written (PYTHONDONTWRITEBYTECODE) compiles the package at every start-up
    instead, about 70 ms of a warm command, which is not what an installed llmsample costs."""
    import compileall
    from pathlib import Path

    import llmsample

    compileall.compile_dir(Path(llmsample.__file__).parent, quiet=1)


def generate_args(*extra: str) -> list[str]:
    return [sys.executable, "-m", "llmsample", "generate", "-p", PROMPT, "-n", "1", "-t", "0", "-q", "--no-log", *extra]


def run_startup_benchmark(runs: int, tokens: int, log: Callable[[str], None]) -> StartupBench:
    """Every side ``runs`` times, interleaved, with the default model; the warm engine is one of
    this user's (``llmsample start``) in a runtime directory of its own, stopped at the end."""
    compiled()
    runtime = tempfile.mkdtemp(prefix="ls-bench-")
    env = {**os.environ, "XDG_RUNTIME_DIR": runtime, "LLMSAMPLE_NO_LOG": "1"}
    env.pop("LLMSAMPLE_HOST", None)
    log("finding the GGUF the llama.cpp path runs")
    summary = subprocess.run(generate_args("--backend", "llama.cpp", "--local", "--format", "jsonl"),
                             capture_output=True, text=True, env=env, check=True).stdout.splitlines()[-1]  # fmt: skip
    gguf = json.loads(summary)["model_file"]
    log("starting a warm engine")
    subprocess.run([sys.executable, "-m", "llmsample", "start", "-q", "--keep-alive", "10m"], env=env, check=True,
                   capture_output=True)  # fmt: skip
    sides: dict[str, list[str]] = {
        "cold transformers": generate_args("--backend", "transformers", "--local"),
        "cold torch": generate_args("--backend", "torch", "--local"),
        "cold llama.cpp": generate_args("--backend", "llama.cpp", "--local"),
        "warm engine": generate_args(),
        "llama-cpp-python alone": [sys.executable, "-c", LLAMA_CPP_ALONE, gguf, PROMPT],
    }
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for run, order in enumerate(rotations(list(sides), runs)):
            for name in order:
                log(f"run {run + 1}/{runs}: {name}")
                took = first_byte_s(sides[name], env)
                if took is not None:
                    seconds[name].append(took)
        log(f"{CALLERS} callers of the warm engine, together and in turn")
        written, together, in_turn = many_callers(env, tokens)
    finally:
        subprocess.run([sys.executable, "-m", "llmsample", "stop", "--all"], env=env, capture_output=True)
        shutil.rmtree(runtime, ignore_errors=True)
    medians = {name: statistics.median(s) if s else None for name, s in seconds.items()}
    return StartupBench(runs, gguf, medians, CALLERS, written, together, in_turn)


def rotations(names: list[str], runs: int) -> list[list[str]]:
    """Each run's order: the sides rotated one place a run, so that no side always follows the
    same one (the page cache and the CPU's clock a side leaves behind favour the next)."""
    return [names[run % len(names) :] + names[: run % len(names)] for run in range(runs)]


def many_callers(env: dict[str, str], tokens: int) -> tuple[int, float, float]:
    """``CALLERS`` generate calls on the warm engine started at once, then one after another:
    the tokens they wrote and each way's aggregate tokens per second (wall clock)."""
    args = [sys.executable, "-m", "llmsample", "generate", "-n", str(tokens), "-q", "--no-log", "--format", "jsonl"]
    prompts = [f"Write a short story about a {thing}." for thing in
               ("cat", "river", "robot", "lamp", "forest", "ship", "clock", "garden")][:CALLERS]  # fmt: skip

    def counted(outputs: list[str]) -> int:
        return sum(json.loads(out.splitlines()[-1])["tokens"] for out in outputs)

    start = time.perf_counter()
    procs = [subprocess.Popen([*args, "-p", p], stdout=subprocess.PIPE, env=env, text=True) for p in prompts]
    together = [proc.communicate()[0] for proc in procs]
    together_s = time.perf_counter() - start
    start = time.perf_counter()
    in_turn = [subprocess.run([*args, "-p", p], capture_output=True, env=env, text=True).stdout for p in prompts]
    in_turn_s = time.perf_counter() - start
    total = counted(together)
    return total, total / together_s, counted(in_turn) / in_turn_s


def table(result: StartupBench) -> str:
    """The figures as lines for the terminal."""
    lines = [f"seconds to the first token from a fresh process, median of {result.runs}:"]
    for name, seconds in result.first_token_s.items():
        lines.append(f"  {name:<24} {'failed' if seconds is None else f'{seconds:.2f} s'}")
    if result.together_tokens_per_s is not None and result.in_turn_tokens_per_s is not None:
        lines.append(
            f"{result.callers} callers of the warm engine ({result.tokens} tokens): together "
            f"{result.together_tokens_per_s:.1f} tok/s, one after another {result.in_turn_tokens_per_s:.1f} tok/s "
            f"({result.together_tokens_per_s / result.in_turn_tokens_per_s:.2f}x)"
        )
    return "\n".join(lines)
