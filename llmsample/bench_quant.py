"""What quantization buys and costs on this machine: the default model in float32, bfloat16 and
int8 weight-only (int4 on request), each in a process of its own so that its peak memory is its
own. Per variant: decode tokens/s (greedy, EOS ignored, median of the runs; taken with every
variant loaded in one process, interleaved, so that a noisy machine slows them alike), time to
first token, peak resident memory, the weights' size, and against float32 (``generate --reference``'s
scorer, over the same tokens) the mean KL(P_fp32 ‖ P_variant) and the same-top rate.

``python -m llmsample.bench_quant [--tokens N] [--runs N] [--variants fp32,bf16,int8]``
prints a table and writes ``bench/results/quant-*.json``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

VARIANTS = {  # name -> (dtype, --quantize)
    "fp32": ("float32", None),
    "bf16": ("bfloat16", None),
    "int8": ("float32", "int8"),
    "int4": ("float32", "int4"),
}
LIBRARIES = {"int8": "torchao int8 weight-only", "int4": "bitsandbytes NF4"}
PROMPTS = {
    "chat": "What is the capital of France? Answer in one sentence, then explain why it is the capital.",
    "story": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


@dataclass(frozen=True)
class VariantResult:
    variant: str
    dtype: str
    quantization: str | None
    tokens_per_s: float  # median over runs and prompts of decode tokens/s
    ttft_s: float  # median time to first token
    peak_rss_mb: float  # the process's peak resident memory, before the reference is loaded
    weights_mb: float  # the weights as stored in memory (quantized data and scales)
    load_s: float
    mean_kl: float  # KL(P_fp32 || P_variant), nats, over every generated token
    same_top: float  # share of tokens where both rank the same token first
    kl_tokens: int


def tensor_bytes(tensor: Any) -> int:
    """Bytes a (possibly quantized) tensor occupies: a tensor subclass (torchao) by its inner
    tensors, a bitsandbytes 4-bit parameter by its packed data and its quantization state."""
    if hasattr(tensor, "__tensor_flatten__"):
        names, _ = tensor.__tensor_flatten__()
        return sum(tensor_bytes(getattr(tensor, name)) for name in names)
    total = tensor.numel() * tensor.element_size()
    state = getattr(tensor, "quant_state", None)
    if state is not None:
        total += sum(t.numel() * t.element_size() for t in vars(state).values() if hasattr(t, "element_size"))
    return total


def weights_bytes(model: Any) -> int:
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += tensor_bytes(p)
    return total


def run_variant(variant: str, tokens: int, runs: int) -> VariantResult:
    """One variant in this process: load, time greedy decoding, then score against float32."""
    from llmsample.engine.loop import generate, run_to_end
    from llmsample.engine.prompt import encode_prompt
    from llmsample.events import RunStats
    from llmsample.models.loading import load_model
    from llmsample.sampling.config import SamplingConfig

    dtype, quantize = VARIANTS[variant]
    cfg = SamplingConfig(temperature=0, max_tokens=tokens, seed=0)
    start = time.perf_counter()
    lm = load_model(None, "cpu", dtype, quantize=quantize)
    load_s = time.perf_counter() - start
    prompts = [encode_prompt(lm, text, None, False, "error", tokens) for text in PROMPTS.values()]
    run_to_end(generate(lm, prompts[0], SamplingConfig(temperature=0, max_tokens=4), RunStats("", "", 0)))  # warm-up
    rates, ttfts = [], []
    for _ in range(runs):
        for ids in prompts:
            _, summary = run_to_end(generate(lm, ids, cfg, RunStats("", "", 0), ignore_eos=True))
            rates.append(summary.tokens_per_s or 0.0)
            ttfts.append(summary.ttft_s or 0.0)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    kl_sum, same, scored = 0.0, 0.0, 0
    if variant != "fp32":
        reference = load_model(None, "cpu", "float32")
        for ids in prompts:
            stats = RunStats("", "", 0)
            run_to_end(generate(lm, ids, cfg, stats, ignore_eos=True, reference=reference))
            figures = stats.facts.reference
            assert figures is not None, "a run with a reference has its figures"
            kl_sum += figures.mean_kl * figures.tokens
            same += figures.same_top * figures.tokens
            scored += figures.tokens
    else:
        scored, same = tokens * len(prompts), tokens * len(prompts)
    return VariantResult(
        variant=variant,
        dtype=dtype,
        quantization=quantize,
        tokens_per_s=statistics.median(rates),
        ttft_s=statistics.median(ttfts),
        peak_rss_mb=peak_mb,
        weights_mb=weights_bytes(lm.model) / 1e6,
        load_s=load_s,
        mean_kl=kl_sum / scored if scored else 0.0,
        same_top=same / scored if scored else 1.0,
        kl_tokens=scored,
    )


def interleaved_speeds(variants: list[str], tokens: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Decode tokens/s and time to first token per variant, all loaded in this process and run
    in turn, round after round: on a shared, noisy machine only figures taken together compare."""
    from llmsample.engine.loop import generate, run_to_end
    from llmsample.engine.prompt import encode_prompt
    from llmsample.events import RunStats
    from llmsample.models.loading import load_model
    from llmsample.sampling.config import SamplingConfig

    cfg = SamplingConfig(temperature=0, max_tokens=tokens, seed=0)
    models = {v: load_model(None, "cpu", VARIANTS[v][0], quantize=VARIANTS[v][1]) for v in variants}
    prompts = {
        v: [encode_prompt(lm, t, None, False, "error", tokens) for t in PROMPTS.values()] for v, lm in models.items()
    }
    figures: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    for v, lm in models.items():  # warm-up
        run_to_end(generate(lm, prompts[v][0], SamplingConfig(temperature=0, max_tokens=4), RunStats("", "", 0)))
    for _ in range(rounds):
        for index in range(len(PROMPTS)):
            for v, lm in models.items():
                _, summary = run_to_end(generate(lm, prompts[v][index], cfg, RunStats("", "", 0), ignore_eos=True))
                figures[v].append((summary.tokens_per_s or 0.0, summary.ttft_s or 0.0))
    return {
        v: (statistics.median(f[0] for f in runs), statistics.median(f[1] for f in runs)) for v, runs in figures.items()
    }


def run_isolated(variant: str, tokens: int, runs: int) -> VariantResult:
    """The variant in a child process: peak memory is per process."""
    command = [sys.executable, "-m", "llmsample.bench_quant", "--one", variant, "--tokens", str(tokens)]
    done = subprocess.run([*command, "--runs", str(runs)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"variant {variant} failed: {tail}")
    return VariantResult(**json.loads(done.stdout.strip().splitlines()[-1]))


def table(results: list[VariantResult]) -> str:
    lines = [
        "| variant | tok/s | TTFT s | peak RSS MB | weights MB | mean KL vs fp32 (nats) | same top vs fp32 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        name = r.variant if r.quantization is None else f"{r.variant} ({LIBRARIES[r.quantization]}, {r.dtype} compute)"
        lines.append(
            f"| {name} | {r.tokens_per_s:.1f} | {r.ttft_s:.2f} | {r.peak_rss_mb:.0f} | {r.weights_mb:.0f} | "
            f"{r.mean_kl:.5f} | {r.same_top:.1%} |"
        )
    return "\n".join(lines)


def write(results: list[VariantResult], tokens: int, runs: int, directory: Path) -> Path:
    import platform

    import torch
    import transformers

    document = {
        "kind": "quantization",
        "model": "SmolLM2-135M-Instruct",
        "device": "cpu",
        "new_tokens": tokens,
        "runs": runs,
        "speed": "tokens_per_s and ttft_s: every variant loaded in one process, run in turn; memory and KL: one process per variant",
        "prompts": PROMPTS,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "torchao": _version("torchao"),
            "bitsandbytes": _version("bitsandbytes"),
        },
        "results": [asdict(r) for r in results],
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"quant-cpu-{time.strftime('%Y%m%d-%H%M%S')}.json"
    partial = directory / f".{path.name}.partial-{os.getpid()}"
    partial.write_text(json.dumps(document, indent=2))
    partial.replace(path)
    return path


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m llmsample.bench_quant", description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--variants", default="fp32,bf16,int8")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--one", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(asdict(run_variant(args.one, args.tokens, args.runs))))
        return
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant {unknown[0]!r}; choose from {', '.join(VARIANTS)}")
    results = []
    for variant in variants:
        print(f"{variant}: memory and KL in a process of its own...", file=sys.stderr, flush=True)
        results.append(run_isolated(variant, args.tokens, args.runs))
    print("speed: every variant in one process, interleaved...", file=sys.stderr, flush=True)
    speeds = interleaved_speeds(variants, args.tokens, args.runs)
    results = [dataclasses.replace(r, tokens_per_s=speeds[r.variant][0], ttft_s=speeds[r.variant][1]) for r in results]
    print(table(results))
    print(f"written to {write(results, args.tokens, args.runs, args.out)}", file=sys.stderr)


if __name__ == "__main__":
    main()
