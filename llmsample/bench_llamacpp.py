"""``llmsample bench --backend llama.cpp``: side by side in one run on one GGUF, single stream,
EOS ignored, the same sampling settings (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05):

- our loop on llama.cpp (every token's full record, top 5 alternatives) against llama-cpp-python's
  own generation with its own sampler (``Llama.generate``);
- our batch of 8 prompts, aggregate tokens/s, against its single stream;
- our llama.cpp path against our transformers path on the same model;
- start-up to the first token of a fresh ``llmsample generate`` process on each backend.

Medians of interleaved runs; each figure counts prefill and decode of a ~30-token chat prompt."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from llmsample.bench_batch import batch_prompts
from llmsample.engine.batch import BatchItem, decode_batch
from llmsample.engine.loop import generate, run_to_end
from llmsample.engine.prompt import encode_prompt
from llmsample.events import RunStats, Summary
from llmsample.models.loading import LoadedModel, load_model
from llmsample.sampling.config import SamplingConfig

SETTINGS = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
PROMPT = "Explain to a child, in a short paragraph, why the sea is salty and where the salt comes from."


@dataclass(frozen=True)
class LlamaCppBench:
    tokens: int
    runs: int
    threads: int
    ours_tok_s: float  # our loop on llama.cpp, single stream
    llama_cpp_python_tok_s: float  # llama-cpp-python's own generation and sampler
    ours_batch8_tok_s: float  # our batch of 8, aggregate
    transformers_tok_s: float  # our loop on transformers, same model
    transformers_dtype: str
    start_llama_cpp_s: float | None  # a fresh process to its first token (and exit)
    start_transformers_s: float | None

    @property
    def ratios(self) -> dict[str, float]:
        return {
            "ours / llama-cpp-python": self.ours_tok_s / self.llama_cpp_python_tok_s,
            "our batch 8 / llama-cpp-python": self.ours_batch8_tok_s / self.llama_cpp_python_tok_s,
            "llama.cpp / transformers (ours)": self.ours_tok_s / self.transformers_tok_s,
        }

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratios": self.ratios}


def ours(lm: LoadedModel, prompt: list[int], tokens: int) -> int:
    cfg = SamplingConfig(**SETTINGS, max_tokens=tokens, seed=0)
    events, _ = run_to_end(generate(lm, torch.tensor([prompt]), cfg, RunStats(lm.name, "bench", 0), ignore_eos=True))
    return len(events)


def ours_batch(lm: LoadedModel, prompts: list[list[int]], tokens: int) -> int:
    cfg = SamplingConfig(**SETTINGS, max_tokens=tokens)
    items = [BatchItem(i, p, SamplingConfig(**{**cfg.as_dict(), "seed": i}), RunStats(lm.name, "b", i))
             for i, p in enumerate(prompts)]  # fmt: skip
    return sum(
        1 for _, record in decode_batch(lm, items, len(items), ignore_eos=True) if not isinstance(record, Summary)
    )


def llama_cpp_python(lm: LoadedModel, threads: int) -> Callable[[list[int], int], int]:
    """llama-cpp-python's high-level ``Llama`` on the same file: its own sampler and loop."""
    import llama_cpp.llama_cpp as lib
    from llama_cpp import Llama

    defaults = lib.llama_model_default_params

    def plain_buffers() -> Any:  # as our backend loads it (see LlamaCppModel)
        params = defaults()
        params.use_extra_bufts = False
        return params

    lib.llama_model_default_params = plain_buffers
    try:
        llm = Llama(model_path=str(lm.model.path), n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False)
    finally:
        lib.llama_model_default_params = defaults

    def run(prompt: list[int], tokens: int) -> int:
        llm.reset()
        count = 0
        for _ in llm.generate(prompt, temp=SETTINGS["temperature"], top_k=40, top_p=0.95, min_p=0.05, reset=True):
            count += 1
            if count == tokens:
                break
        return count

    return run


def rate(run: Callable[[], int]) -> float:
    start = time.perf_counter()
    count = run()
    return count / (time.perf_counter() - start)


def start_up(model: str | None, backend: str) -> float | None:
    """A fresh ``llmsample generate`` (imports, load, prompt, one token) on ``backend``, seconds."""
    args = [sys.executable, "-m", "llmsample", "generate", "--backend", backend, "-n", "1", "-q", "--format", "jsonl",
            "-p", "What is the capital of France?"] + (["-m", model] if model else [])  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, env=os.environ.copy(), timeout=600)
    return time.perf_counter() - start if done.returncode == 0 else None


def run_llamacpp_benchmark(
    model: str | None, runs: int, tokens: int, log: Callable[[str], None] = lambda step: None
) -> LlamaCppBench:
    """Every side interleaved ``runs`` times on the same GGUF; medians."""
    threads = torch.get_num_threads()
    log("loading the GGUF on llama.cpp and on transformers")
    lm = load_model(model, "cpu", "auto", backend="llama.cpp")
    hf = load_model(model, "cpu", "auto", backend="transformers")
    theirs = llama_cpp_python(lm, threads)
    prompt = encode_prompt(lm, PROMPT)[0].tolist()
    batch = [encode_prompt(lm, p)[0].tolist() for p in batch_prompts(8)]
    figures: dict[str, list[float]] = {"ours": [], "theirs": [], "batch": [], "hf": []}
    ours(lm, prompt, 8)  # warm-up: first-touch of the weights and buffers on both sides
    theirs(prompt, 8)
    for i in range(runs):
        log(f"run {i + 1} of {runs}")
        figures["ours"].append(rate(lambda: ours(lm, prompt, tokens)))
        figures["theirs"].append(rate(lambda: theirs(prompt, tokens)))
        figures["batch"].append(rate(lambda: ours_batch(lm, batch, tokens)))
        figures["hf"].append(rate(lambda: ours(hf, prompt, tokens)))
    log("start-up of a fresh process on each backend")
    median = {k: statistics.median(v) for k, v in figures.items()}
    return LlamaCppBench(
        tokens, runs, threads, median["ours"], median["theirs"], median["batch"], median["hf"],
        str(hf.dtype).removeprefix("torch."), start_up(model, "llama.cpp"), start_up(model, "transformers"),
    )  # fmt: skip
