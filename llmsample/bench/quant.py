"""What quantization buys and costs on this machine (``llmsample bench --quant``): the model in
float32, bfloat16 and int8 weight-only (int4 on request), each in a process of its own so that
its peak memory is its own. Per variant: decode tokens/s (greedy, EOS ignored, median of the
runs; taken with every variant loaded in one process, interleaved, so that a noisy machine slows
them alike), time to first token, peak resident memory, the weights' size, and against float32
(``generate --reference``'s scorer, over the same tokens) the mean KL(P_fp32 ‖ P_variant) and the
same-top rate."""

from __future__ import annotations

import dataclasses
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from llmsample.bench.prompts import PROMPTS as ALL_PROMPTS
from llmsample.bench.results import machine_info, write_document
from llmsample.errors import RuntimeFailure

VARIANTS = {  # name -> (dtype, --quantize)
    "fp32": ("float32", None),
    "bf16": ("bfloat16", None),
    "int8": ("float32", "int8"),
    "int4": ("float32", "int4"),
}
DEFAULT_VARIANTS = "fp32,bf16,int8"
LIBRARIES = {"int8": "torchao int8 weight-only", "int4": "bitsandbytes NF4"}
PROMPTS = {name: ALL_PROMPTS[name] for name in ("chat", "story")}

# One variant in a fresh process (its peak memory its own), its result as the last line of JSON;
# a failure is its message, as the last line on stderr.
VARIANT_CHILD = """
import dataclasses, json, sys
from llmsample.bench.quant import run_variant
try:
    result = run_variant(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] or None, sys.argv[5])
except Exception as exc:
    sys.exit(str(exc) or type(exc).__name__)
print(json.dumps(dataclasses.asdict(result)))
"""


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


@dataclass(frozen=True)
class QuantRun:
    """One ``bench --quant`` run: the model and device every variant ran on, and their figures."""

    model: str
    device: str
    tokens: int
    runs: int
    results: tuple[VariantResult, ...]


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
    """Every parameter once, quantized ones by what they store."""
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += tensor_bytes(p)
    return total


def _load(variant: str, model: str | None, device: str) -> Any:
    from llmsample.models.loading import load_model

    dtype, quantize = VARIANTS[variant]
    return load_model(model, device, dtype, quantize=quantize)


def _decode(lm: Any, ids: Any, tokens: int, reference: Any = None) -> tuple[Any, Any]:
    """One greedy run, EOS ignored: its summary and run facts (``reference``: scored against it)."""
    from llmsample.engine.loop import generate, run_to_end
    from llmsample.events import RunStats
    from llmsample.sampling.config import SamplingConfig

    stats = RunStats("", "", 0)
    cfg = SamplingConfig(temperature=0, max_tokens=tokens, seed=0)
    _, summary = run_to_end(generate(lm, ids, cfg, stats, ignore_eos=True, reference=reference))
    return summary, stats


def _prompts(lm: Any, tokens: int) -> list[Any]:
    from llmsample.engine.prompt import encode_prompt

    return [encode_prompt(lm, text, None, False, "error", tokens) for text in PROMPTS.values()]


def _kl_against_fp32(
    lm: Any, prompts: list[Any], tokens: int, model: str | None, device: str
) -> tuple[float, float, int]:
    """Summed KL and same-top count over every generated token, and the tokens scored."""
    reference = _load("fp32", model, device)
    kl_sum, same, scored = 0.0, 0.0, 0
    for ids in prompts:
        _, stats = _decode(lm, ids, tokens, reference)
        figures = stats.facts.reference
        assert figures is not None, "a run with a reference has its figures"
        kl_sum += figures.mean_kl * figures.tokens
        same += figures.same_top * figures.tokens
        scored += figures.tokens
    return kl_sum, same, scored


def run_variant(variant: str, tokens: int, runs: int, model: str | None = None, device: str = "cpu") -> VariantResult:
    """One variant in this process: load, time greedy decoding, then score against float32."""
    start = time.perf_counter()
    lm = _load(variant, model, device)
    load_s = time.perf_counter() - start
    prompts = _prompts(lm, tokens)
    _decode(lm, prompts[0], 4)  # warm-up
    rates, ttfts = [], []
    for _ in range(runs):
        for ids in prompts:
            summary, _ = _decode(lm, ids, tokens)
            rates.append(summary.tokens_per_s or 0.0)
            ttfts.append(summary.ttft_s or 0.0)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    if variant != "fp32":
        kl_sum, same, scored = _kl_against_fp32(lm, prompts, tokens, model, device)
    else:
        kl_sum, same, scored = 0.0, tokens * len(prompts), tokens * len(prompts)
    dtype, quantize = VARIANTS[variant]
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


def interleaved_speeds(
    variants: list[str], tokens: int, rounds: int, model: str | None = None, device: str = "cpu"
) -> tuple[Any, dict[str, tuple[float, float]]]:
    """Decode tokens/s and time to first token per variant, all loaded in this process and run
    in turn, round after round: on a shared, noisy machine only figures taken together compare.
    Also the first variant's loaded model (its name and device name the run)."""
    models = {v: _load(v, model, device) for v in variants}
    prompts = {v: _prompts(lm, tokens) for v, lm in models.items()}
    figures: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    for v, lm in models.items():  # warm-up
        _decode(lm, prompts[v][0], 4)
    for _ in range(rounds):
        for index in range(len(PROMPTS)):
            for v, lm in models.items():
                summary, _ = _decode(lm, prompts[v][index], tokens)
                figures[v].append((summary.tokens_per_s or 0.0, summary.ttft_s or 0.0))
    speeds = {
        v: (statistics.median(f[0] for f in runs), statistics.median(f[1] for f in runs)) for v, runs in figures.items()
    }
    return models[variants[0]], speeds


def run_isolated(variant: str, tokens: int, runs: int, model: str | None = None, device: str = "cpu") -> VariantResult:
    """The variant in a child process: peak memory is per process."""
    command = [sys.executable, "-c", VARIANT_CHILD, variant, str(tokens), str(runs), model or "", device]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise RuntimeFailure(f"quantization variant {variant} failed in its own process: {tail}")
    return VariantResult(**json.loads(done.stdout.strip().splitlines()[-1]))


def run_quant_benchmark(
    variants: list[str], tokens: int, runs: int, model: str | None = None, device: str = "cpu",
    log: Callable[[str], None] = lambda step: None,
) -> QuantRun:  # fmt: skip
    """Memory and KL per variant in a process of its own, then the speeds of all in this one."""
    results = []
    for variant in variants:
        log(f"{variant}: memory and KL in a process of its own")
        results.append(run_isolated(variant, tokens, runs, model, device))
    log("speed: every variant in one process, interleaved")
    lm, speeds = interleaved_speeds(variants, tokens, runs, model, device)
    results = [dataclasses.replace(r, tokens_per_s=speeds[r.variant][0], ttft_s=speeds[r.variant][1]) for r in results]
    return QuantRun(lm.name, str(lm.device), tokens, runs, tuple(results))


def table(results: list[VariantResult] | tuple[VariantResult, ...]) -> str:
    """A Markdown table of the variants (the README's quantization section)."""
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


def write(run: QuantRun, directory: Path) -> Path:
    """The run as ``quant-DEVICE-TIME.json`` in ``directory``, written whole or not at all."""
    document = {
        "kind": "quantization",
        "model": run.model,
        "device": run.device,
        "new_tokens": run.tokens,
        "runs": run.runs,
        "speed": "tokens_per_s and ttft_s: every variant loaded in one process, run in turn; memory and KL: one process per variant",
        "prompts": PROMPTS,
        "machine": {**asdict(machine_info()), "torchao": _version("torchao"), "bitsandbytes": _version("bitsandbytes")},
        "results": [asdict(r) for r in run.results],
    }
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return write_document(document, directory / f"quant-{run.device.replace(':', '')}-{stamp}.json")


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None
