"""The llama.cpp backend against its peers (``llmsample bench --backend llama.cpp``): side by side
in one process on one GGUF, EOS ignored, the same sampling settings on every side (temperature
0.8, top-k 40, top-p 0.95, min-p 0.05):

- our loop on llama.cpp, single stream, every token's full record (top 5 alternatives), against
  llama-cpp-python's own generation with its own sampler (``Llama.generate``), sampled and greedy;
- our batch of 8 chat prompts, aggregate tokens/s, against our single stream and against its;
- our llama.cpp path against our transformers path on the same model;
- a small Llama in the hub's format written here (:mod:`llmsample.bench.hub_llama`), on llama.cpp
  through the GGUF our backend converts it to, against transformers' ``generate`` on the folder;
- a fresh ``llmsample generate -n 1`` process to its first token on each backend.

Medians of rotating rounds, ratios paired by round (:mod:`llmsample.bench.timing`'s reasoning: a
noisy neighbour slows every side of a round alike); each figure counts prefill and decode. ``model_share`` is the
part of our single stream's time spent inside ``llama_decode`` (the backend's ``on_forward``);
the rest is the loop: sampling chain, figures, records (``host_ms``: that rest a token)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from llmsample.bench.hub_llama import write_small_llama
from llmsample.bench.prompts import batch_prompts
from llmsample.bench.results import machine_info, write_document
from llmsample.bench.sides import as_transformers_loads, ours
from llmsample.bench.sides import theirs as theirs_generate
from llmsample.bench.timing import paired_ratio, rounds, timed_tokens_per_s
from llmsample.engine.backend import open_backend
from llmsample.engine.continuous_batch import BatchItem, decode_batch
from llmsample.engine.decode import DecodeOptions, decode
from llmsample.engine.prompt import encode_prompt
from llmsample.events import RunStats, Summary
from llmsample.models.llamacpp_load import plain_llama
from llmsample.models.loading import LoadedModel, load_model
from llmsample.sampling.config import SamplingConfig

SETTINGS = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
PROMPT = "Explain to a child, in a short paragraph, why the sea is salty and where the salt comes from."
BATCH = 8
START_PROMPT = "What is the capital of France?"


@dataclass(frozen=True)
class LlamaCppBench:
    """Medians over the runs, tokens/s unless named otherwise."""

    model: str
    quantization: str | None  # the GGUF's weight type
    tokens: int
    runs: int
    threads: int
    ours_tok_s: float  # our loop on llama.cpp, single stream
    llama_cpp_python_tok_s: float  # llama-cpp-python's own generation and sampler
    ours_greedy_tok_s: float  # the same two, greedy
    llama_cpp_python_greedy_tok_s: float
    ours_batch_tok_s: float  # our batch of BATCH, aggregate
    transformers_tok_s: float  # our loop on transformers, same model
    transformers_dtype: str
    hub_ours_tok_s: float  # the small hub-format Llama: our loop on llama.cpp (its converted GGUF)
    hub_transformers_tok_s: float  # transformers' generate on its folder, as transformers loads it
    model_share: float  # of our single stream's time, the share inside llama_decode
    host_ms: float  # our single stream's work between two llama_decode calls, ms a token (sampled)
    ratios: dict[str, float]  # each the median of the rounds' own ratios
    start_llama_cpp_s: float | None  # a fresh process to its first token (and exit); None: it failed
    start_transformers_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def settings(tokens: int, seed: int = 0, greedy: bool = False) -> SamplingConfig:
    chosen = {**SETTINGS, "temperature": 0.0} if greedy else SETTINGS
    return SamplingConfig(**chosen, max_tokens=tokens, seed=seed)  # type: ignore[arg-type]


def ours_timed(lm: LoadedModel, ids: torch.Tensor, tokens: int, greedy: bool = False) -> tuple[int, float, float]:
    """Our single stream: tokens, wall seconds, and seconds inside the backend's forward passes."""
    spent = [0.0]

    def timed(seconds: float) -> None:
        spent[0] += seconds

    cfg = settings(tokens, greedy=greedy)
    item = BatchItem(0, ids[0].tolist(), cfg, RunStats(lm.name, "bench", cfg.seed))
    start = time.perf_counter()
    count = sum(
        1
        for _, record in decode(lm, [item], 1, DecodeOptions(5, True, on_forward=timed), one_prompt=True)
        if not isinstance(record, Summary)
    )
    return count, time.perf_counter() - start, spent[0]


def ours_batch(lm: LoadedModel, prompts: list[list[int]], tokens: int) -> int:
    """Our batch: every prompt a row of its own seed, all decoding together; tokens made."""
    items = [BatchItem(i, p, settings(tokens, i), RunStats(lm.name, "bench", i)) for i, p in enumerate(prompts)]
    return sum(1 for _, r in decode_batch(lm, items, len(items), ignore_eos=True) if not isinstance(r, Summary))


def decode_only(lm: LoadedModel, prompts: list[list[int]], tokens: int) -> int:
    """llama.cpp's own ceiling for these rows: the backend's prefill and ``tokens - 1`` steps with
    nothing of ours between them (each row fed its first prompt token again); tokens made."""
    backend = open_backend(lm, len(prompts), max(map(len, prompts)) + tokens + 1, one_prompt=False)
    try:
        backend.admit(prompts)
        fed = torch.tensor([p[0] for p in prompts])
        for _ in range(tokens - 1):
            backend.step(fed)
    finally:
        backend.close()
    return len(prompts) * tokens


def llama_cpp_python(path: Path, threads: int) -> Callable[..., int]:
    """Its own loop and sampler on the same file and settings (temperature 0: its greedy
    sampler); tokens made."""
    llm = plain_llama(path, threads)

    def run(prompt: list[int], tokens: int, greedy: bool = False) -> int:
        # From an empty cache, as our side starts: left alone, ``generate`` finds the last round's
        # prompt in its cache and decodes only its last token, so its rate would leave out the
        # prefill ours counts (~13 % of a 128-token run of the benchmark's prompt).
        llm.reset()
        count = 0
        for _ in llm.generate(
            prompt, temp=0.0 if greedy else SETTINGS["temperature"], top_k=SETTINGS["top_k"], top_p=SETTINGS["top_p"],
            min_p=SETTINGS["min_p"], repeat_penalty=1.0, reset=True,
        ):  # fmt: skip
            count += 1
            if count == tokens:
                break
        return count

    return run


def start_up(model: str | None, backend: str, gguf_type: str | None = None) -> float | None:
    """A fresh ``llmsample generate`` (imports, load, prompt, one token, exit) on ``backend``,
    seconds; None when it failed."""
    args = [sys.executable, "-m", "llmsample", "generate", "--backend", backend, "-n", "1", "-t", "0", "-q",
            "--format", "jsonl", "-p", START_PROMPT, *(["-m", model] if model else []),
            *(["--gguf-type", gguf_type] if gguf_type else [])]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, env=os.environ.copy(), timeout=600)
    return time.perf_counter() - start if done.returncode == 0 else None


def run_llamacpp_benchmark(
    model: str | None,
    runs: int,
    tokens: int,
    log: Callable[[str], None] = lambda step: None,
    gguf_type: str | None = None,
) -> LlamaCppBench:
    """Every side once in each of ``runs`` rotating rounds on the same GGUF (the default model's
    at F16 unless ``gguf_type``); medians."""
    threads = torch.get_num_threads()
    log("loading the GGUF on llama.cpp and on transformers")
    lm = load_model(model, "cpu", "auto", backend="llama.cpp", gguf_type=gguf_type)
    hf = load_model(model, "cpu", "auto", backend="transformers")
    theirs = llama_cpp_python(lm.model.path, threads)
    ids = encode_prompt(lm, PROMPT)
    prompt = ids[0].tolist()
    batch = [encode_prompt(lm, p)[0].tolist() for p in batch_prompts(BATCH)]
    with tempfile.TemporaryDirectory() as scratch:
        log("writing a small hub-format Llama and its GGUF")
        hub_sides = hub_llama_sides(Path(scratch) / "small-llama", tokens)
    ours_timed(lm, ids, 8)  # warm-up: first touch of the weights and buffers on every side
    theirs(prompt, 8)
    ours(hf, ids, settings(8))
    shares, host = [], []

    def single(greedy: bool) -> float:
        count, wall, forward = ours_timed(lm, ids, tokens, greedy)
        if not greedy:
            shares.append(forward / wall)
            host.append((wall - forward) / count * 1e3)
        return count / wall

    log(f"{runs} rotating rounds")
    mine, peer, mine_greedy, peer_greedy, batched, hf_rates, hub_ours, hub_theirs, own_one, own_batch = rounds(
        runs,
        [
            lambda: single(False),
            lambda: timed_tokens_per_s(lambda: theirs(prompt, tokens)),
            lambda: single(True),
            lambda: timed_tokens_per_s(lambda: theirs(prompt, tokens, True)),
            lambda: timed_tokens_per_s(lambda: ours_batch(lm, batch, tokens)),
            lambda: timed_tokens_per_s(lambda: ours(hf, ids, settings(tokens))),
            *hub_sides,
            lambda: timed_tokens_per_s(lambda: decode_only(lm, [prompt], tokens)),
            lambda: timed_tokens_per_s(lambda: decode_only(lm, batch, tokens)),
        ],
    )
    ratios = {
        "ours / llama-cpp-python, sampled (target ≥ 0.9x)": paired_ratio(mine, peer),
        "ours / llama-cpp-python, greedy (target ≥ 0.9x)": paired_ratio(mine_greedy, peer_greedy),
        "llama.cpp / transformers, ours (target ≥ 2.5x)": paired_ratio(mine, hf_rates),
        f"our batch {BATCH} / our single stream (target ≥ 1.5x)": paired_ratio(batched, mine),
        f"our batch {BATCH} / llama-cpp-python": paired_ratio(batched, peer),
        f"llama.cpp's own ceiling: {BATCH} rows / one, decode only": paired_ratio(own_batch, own_one),
        "small hub Llama: ours on llama.cpp / transformers' generate": paired_ratio(hub_ours, hub_theirs),
    }
    log("start-up of a fresh process on each backend")
    median = statistics.median
    return LlamaCppBench(
        lm.name, lm.quantization, tokens, runs, threads, median(mine), median(peer), median(mine_greedy),
        median(peer_greedy), median(batched), median(hf_rates), str(hf.dtype).removeprefix("torch."),
        median(hub_ours), median(hub_theirs), median(shares), median(host), ratios,
        start_up(model, "llama.cpp", gguf_type), start_up(model, "transformers"),
    )  # fmt: skip


def hub_llama_sides(folder: Path, tokens: int) -> list[Callable[[], float]]:
    """The small hub-format Llama's two sides, warmed up: our loop on llama.cpp (the GGUF our
    backend writes from the folder, at the checkpoint's own precision) and transformers'
    ``generate`` on the model as transformers loads the folder; both tokens/s, sampled. The folder
    may go once this returns (both sides hold what they loaded)."""
    write_small_llama(folder)
    lm = load_model(str(folder), "cpu", "auto", backend="llama.cpp")
    hf = as_transformers_loads(load_model(str(folder), "cpu", "auto", backend="transformers"), str(folder), None)
    ids = encode_prompt(lm, PROMPT)
    min_p = {"min_p": SETTINGS["min_p"]}  # the one setting ``theirs`` does not pass itself
    ours_timed(lm, ids, 8)
    theirs_generate(hf, ids, settings(8), **min_p)

    def on_llama_cpp() -> float:
        count, wall, _ = ours_timed(lm, ids, tokens)
        return count / wall

    return [on_llama_cpp, lambda: timed_tokens_per_s(lambda: theirs_generate(hf, ids, settings(tokens), **min_p))]


def table(result: LlamaCppBench) -> str:
    """A Markdown table of the sides and ratios (the README's llama.cpp section)."""
    from llmsample.render.numbers import format_number

    lines = ["| side | tok/s |", "| --- | --- |"]
    sides = [
        ("llmsample on llama.cpp, single stream (full records, top 5)", result.ours_tok_s),
        ("llama-cpp-python's own `Llama.generate`, single stream", result.llama_cpp_python_tok_s),
        ("llmsample on llama.cpp, single stream, greedy (full records)", result.ours_greedy_tok_s),
        ("llama-cpp-python's own `Llama.generate`, greedy", result.llama_cpp_python_greedy_tok_s),
        (f"llmsample on llama.cpp, batch {BATCH} (aggregate)", result.ours_batch_tok_s),
        (f"llmsample on transformers ({result.transformers_dtype})", result.transformers_tok_s),
        ("small hub-format Llama: llmsample on llama.cpp (its converted GGUF)", result.hub_ours_tok_s),
        ("small hub-format Llama: transformers' `generate`", result.hub_transformers_tok_s),
    ]
    lines += [f"| {name} | {format_number(value, 1)} |" for name, value in sides]
    lines += [f"| {name} | {value:.2f}x |" for name, value in result.ratios.items()]
    lines.append(f"| our single stream inside llama_decode | {result.model_share:.0%} |")
    lines.append(f"| our work between two decodes, sampled (target ≤ 0.5 ms) | {result.host_ms:.2f} ms |")
    for backend, seconds in (("llama.cpp", result.start_llama_cpp_s), ("transformers", result.start_transformers_s)):
        lines.append(f"| fresh process to first token, {backend} | {format_number(seconds, 2)} s |")
    return "\n".join(lines)


def write(result: LlamaCppBench, directory: Path) -> Path:
    """The run as ``bench-llamacpp-cpu-GGUFTYPE-TIME.json`` in ``directory``, written whole or not at all."""
    document = {
        "kind": "bench-llamacpp",
        "device": "cpu",
        "load_average": list(os.getloadavg()),
        "machine": {**asdict(machine_info()), "llama_cpp_python": _version("llama-cpp-python")},
        "settings": SETTINGS,
        "prompt": PROMPT,
        **result.to_dict(),
    }
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return write_document(document, directory / f"bench-llamacpp-cpu-{result.quantization or 'gguf'}-{stamp}.json")


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None
