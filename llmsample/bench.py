"""The benchmark: our token loop side by side with transformers' ``generate`` on the same model,
dtype, prompt and settings, interleaved, medians of several runs, ratios first (a shared
machine is noisy; ratios hold)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from llmsample.bench_results import (
    Bandwidth,
    BenchResults,
    Defaults,
    Inspection,
    Machine,
    Speculation,
    StartUp,
    Workload,
)
from llmsample.engine.loop import generate
from llmsample.engine.prompt import encode_prompt
from llmsample.engine.speculative import NgramDrafter, speculative_generate
from llmsample.errors import UserError
from llmsample.events import RunStats, Summary
from llmsample.models import attention
from llmsample.models.conversion import gguf_path
from llmsample.models.device import dtype_name
from llmsample.models.loading import LoadedModel, load_model
from llmsample.render.stream import JsonlRenderer, PlainRenderer
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.figures import step_figures
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import make_generator, sampler_chain
from llmsample.sampling.presets import load as load_preset
from llmsample.sampling.stages import STAGES

CODE = """def mean(values):
    total = 0
    for value in values:
        total += value
    return total / len(values)


def variance(values):
    m = mean(values)
    total = 0
    for value in values:
        total += (value - m) ** 2
    return total / len(values)


def normalise(values):
    m = mean(values)
    s = variance(values) ** 0.5
    return [(value - m) / s for value in values]
"""

PROMPTS = {
    "chat": "What is the capital of France? Answer in one sentence, then explain why it is the capital.",
    "story": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    # Input-grounded: the answer copies most of the prompt, where n-gram drafting pays off.
    "code-rewrite": "Add a comment line `# statistics helpers` at the top of this file and repeat the rest of "
    "the file unchanged.\n\n```python\n" + CODE + "```",
}


@dataclass
class Timings:
    """One workload's figures as the runs come in; ``result`` takes the medians."""

    workload: str
    ours: list[float] = field(default_factory=list)  # tokens/s, one per run
    theirs: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)

    def result(self) -> Workload:
        ours, theirs = statistics.median(self.ours), statistics.median(self.theirs) if self.theirs else None
        return Workload(
            workload=self.workload,
            ours_tok_s=ours,
            reference_tok_s=theirs,
            ratio=ours / theirs if theirs else None,
            ttft_s=statistics.median(self.ttft) if self.ttft else None,
            runs=len(self.ours),
        )


def synchronize() -> None:
    """Wait for queued GPU work, so a clock measures it (nothing to wait for on a CPU)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed_tokens_per_s(run: Callable[[], int]) -> float:
    """End-to-end tokens per second, prefill included, for both sides alike."""
    synchronize()
    start = time.perf_counter()
    tokens = run()
    synchronize()
    return tokens / (time.perf_counter() - start)


def ours(
    lm: LoadedModel,
    ids: torch.Tensor,
    cfg: SamplingConfig,
    renderer: Any = None,
    ttft: list[float] | None = None,
    extra: dict[str, Any] | None = None,
) -> int:
    count = 0
    for item in generate(lm, ids, cfg, RunStats(lm.name, "bench", cfg.seed), ignore_eos=True):
        if isinstance(item, Summary):
            if ttft is not None and item.ttft_s is not None:
                ttft.append(item.ttft_s)
            if extra is not None:
                extra.update(item.facts.to_dict())
            if renderer:
                renderer.summary(item)
        else:
            count += 1
            if renderer:
                renderer.token(item)
    return count


@contextlib.contextmanager
def stock_attention(model: Any) -> Iterator[None]:
    """The reference runs transformers' own SDPA: ``--compile`` switches the shared model to
    ``llmsample.models.attention`` (switching back to the same name later needs no recompilation)."""
    current = model.config._attn_implementation
    if current != attention.NAME:
        yield
        return
    model.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        model.set_attn_implementation(current)


def theirs(lm: LoadedModel, ids: torch.Tensor, cfg: SamplingConfig, **extra: Any) -> int:
    sampling = (
        {}
        if cfg.is_greedy
        else {"do_sample": True, "temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": cfg.top_p}
    )
    with torch.inference_mode(), stock_attention(lm.model):
        out = lm.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=cfg.max_tokens,
            min_new_tokens=cfg.max_tokens,  # EOS ignored, as on our side
            pad_token_id=lm.tokenizer.eos_token_id,
            **({"do_sample": False} if cfg.is_greedy else sampling),
            **extra,
        )
    return out.shape[1] - ids.shape[1]


def interleave(timings: Timings, runs: int, mine: Callable[[], int], reference: Callable[[], int] | None) -> Timings:
    """Alternate the two sides run by run, so a noisy neighbour slows both alike."""
    for _ in range(runs):
        timings.ours.append(timed_tokens_per_s(mine))
        if reference:
            timings.theirs.append(timed_tokens_per_s(reference))
    return timings


def memory_bandwidth_gb_s(mb: int = 512, repeats: int = 5, device: torch.device | str = "cpu") -> float:
    """Copy bandwidth (read + write) of a large tensor on the model's device, the bound a decode
    step runs into."""
    src = torch.ones(mb * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        synchronize()
        times.append(time.perf_counter() - start)
    return 2 * src.numel() * 4 / min(times) / 1e9


def weight_bytes(lm: LoadedModel) -> int:
    """Bytes read per decode step: every weight once (a tied embedding is read as the LM head)."""
    seen, total = set(), 0
    for p in lm.model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def pipeline_cost(lm: LoadedModel, cfg: SamplingConfig, steps: int = 50, context: int = 3) -> float:
    """Seconds per step for sampling + inspection figures on a real vocabulary, model excluded;
    ``context`` tokens of history (a story's worth makes DRY and the bans do real work)."""
    vocab = lm.model.config.vocab_size
    logits = torch.randn(1, vocab, device=lm.device) * 5
    ids = encode_prompt(lm, PROMPTS["story"] * (1 + context // 16), raw=True)[:, -context:]
    history = TokenHistory.for_config(ids, vocab, cfg, lm.tokenizer, lm.eos_ids)
    generator = make_generator(0, lm.device)
    sampler_chain(logits, history, cfg)  # tables built once per run: not a step's cost
    start = time.perf_counter()
    for _ in range(steps):
        chain = sampler_chain(logits, history, cfg)
        step_figures(chain, chain.draw(generator), 5)  # ends in one host transfer
    return (time.perf_counter() - start) / steps


def stage_costs(lm: LoadedModel, steps: int = 5, rounds: int = 40, context: int = 512) -> dict[str, float]:
    """Each optional stage's seconds per step (switched on by its ``example`` in the stage table)
    on top of the default chain (balanced, whose own cost is under ``"balanced"``), with ``context`` tokens of history. Rounds interleave the settings
    and each keeps its fastest round: on a shared machine the minimum is what the code costs."""
    _, base = load_preset("balanced")
    configs = {"balanced": base} | {
        info.name: SamplingConfig.from_mapping(dict(info.example), base) for info in STAGES if info.example
    }
    best = dict.fromkeys(configs, float("inf"))
    for _ in range(rounds):
        for name, cfg in configs.items():
            best[name] = min(best[name], pipeline_cost(lm, cfg, steps, context))
    return {name: t - best["balanced"] if name != "balanced" else t for name, t in best.items()}


def cold_load_s() -> float | None:
    """The first-run conversion of the shipped GGUF, into a throwaway cache."""
    if gguf_path() is None:
        return None
    previous = os.environ.get("LLMSAMPLE_HOME")
    with tempfile.TemporaryDirectory() as home:
        os.environ["LLMSAMPLE_HOME"] = home
        try:
            start = time.perf_counter()
            load_model(None, "cpu", "float32")
            return time.perf_counter() - start
        finally:
            if previous is None:
                os.environ.pop("LLMSAMPLE_HOME")
            else:
                os.environ["LLMSAMPLE_HOME"] = previous


WARM_START = """
import json, sys, time
start = time.perf_counter()
from llmsample.models.loading import load_model
load_model(sys.argv[1] or None, sys.argv[2], sys.argv[3])
ready = time.perf_counter()
load_model(sys.argv[1] or None, sys.argv[2], sys.argv[3])
print(json.dumps({"start_s": ready - start, "load_s": time.perf_counter() - ready}))
"""


def warm_start(model: str | None, device: str, dtype: str) -> StartUp:
    """A fresh process, converted model on disk: seconds until the model is ready (``start_s``,
    imports included), and what a second load costs once torch and transformers are imported
    (``load_s``: config, tokenizer, weights)."""
    out = subprocess.run(
        [sys.executable, "-c", WARM_START, model or "", device, dtype], check=True, capture_output=True, text=True
    )
    return StartUp(**json.loads(out.stdout.strip().splitlines()[-1]))


def machine_info() -> Machine:
    return Machine(
        platform=platform.platform(),
        processor=platform.processor() or platform.machine(),
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        threads=torch.get_num_threads(),
        python=platform.python_version(),
        torch=torch.__version__,
        transformers=__import__("transformers").__version__,
    )


def bench_settings(tokens: int) -> dict[str, SamplingConfig]:
    """Greedy, and the default preset with a fixed seed and no stop strings (every run the same length)."""
    balanced = load_preset("balanced")[1]
    return {
        "greedy": SamplingConfig(temperature=0.0, max_tokens=tokens),
        "balanced": SamplingConfig(**{**balanced.as_dict(), "stop": (), "max_tokens": tokens, "seed": 0}),
    }


def bench_generate(
    lm: LoadedModel, settings: dict[str, SamplingConfig], runs: int, log: Callable[[str], None]
) -> tuple[list[Workload], float | None]:
    """Every prompt under every setting, both sides; also the seconds ``--compile`` took (None without)."""
    rows = []
    first_run: dict[str, Any] = {}
    for prompt_name, prompt in PROMPTS.items():
        ids = encode_prompt(lm, prompt)
        for setting, cfg in settings.items():
            log(f"{prompt_name} / {setting}")
            timings = Timings(f"{prompt_name} / {setting}")
            ours(lm, ids, cfg, extra=first_run)  # warm-up (and, with --compile, the compilation)
            interleave(
                timings,
                runs,
                lambda ids=ids, cfg=cfg, timings=timings: ours(lm, ids, cfg, ttft=timings.ttft),
                lambda ids=ids, cfg=cfg: theirs(lm, ids, cfg),
            )
            rows.append(timings.result())
    return rows, first_run.get("compile_s")


def bench_speculation(lm: LoadedModel, greedy: SamplingConfig, runs: int) -> Speculation:
    """n-gram drafting on the input-grounded prompt, against prompt lookup and our plain loop."""
    ids = encode_prompt(lm, PROMPTS["code-rewrite"])
    vocab = lm.model.config.vocab_size
    spec = Timings("code-rewrite / greedy, ngram")
    plain = Timings("code-rewrite / greedy, plain")
    acceptance = []
    for _ in range(runs):
        stats = RunStats(lm.name, "bench", None)

        def speculative(stats: RunStats = stats) -> int:
            events = speculative_generate(lm, ids, greedy, stats, NgramDrafter(vocab, lm.device), ignore_eos=True)
            return sum(1 for item in events if not isinstance(item, Summary))

        spec.ours.append(timed_tokens_per_s(speculative))
        acceptance.append(stats.facts.speculation.acceptance_rate if stats.facts.speculation else 0.0)
        spec.theirs.append(timed_tokens_per_s(lambda: theirs(lm, ids, greedy, prompt_lookup_num_tokens=10)))
        plain.ours.append(timed_tokens_per_s(lambda: ours(lm, ids, greedy)))
    row = spec.result()
    return Speculation(
        **dataclasses.asdict(row),
        speedup_over_plain=row.ours_tok_s / statistics.median(plain.ours),
        acceptance_rate=statistics.median(acceptance),
        tokens_per_pass=stats.facts.speculation.tokens_per_pass if stats.facts.speculation else 0.0,  # the last run's
    )


def bench_inspection(lm: LoadedModel, cfg: SamplingConfig, runs: int) -> Inspection:
    """JSON lines with alternatives against plain text, and the pipeline's share of a step."""
    ids = encode_prompt(lm, PROMPTS["story"])
    text, jsonl = Timings("plain text"), Timings("jsonl --top-n 5")
    for _ in range(runs):
        text.ours.append(timed_tokens_per_s(lambda: ours(lm, ids, cfg, PlainRenderer(io.StringIO()))))
        jsonl.ours.append(timed_tokens_per_s(lambda: ours(lm, ids, cfg, JsonlRenderer(io.StringIO()))))
    text_tok_s, jsonl_tok_s = statistics.median(text.ours), statistics.median(jsonl.ours)
    per_step = pipeline_cost(lm, cfg)
    return Inspection(
        text_tok_s=text_tok_s,
        jsonl_tok_s=jsonl_tok_s,
        jsonl_over_text=jsonl_tok_s / text_tok_s,
        pipeline_s_per_step=per_step,
        pipeline_share_of_step=per_step / (1 / text_tok_s),  # of the plain text's seconds per step
    )


def bench_bandwidth(lm: LoadedModel, rows: list[Workload]) -> Bandwidth:
    bandwidth = memory_bandwidth_gb_s(device=lm.device)
    bytes_per_token = weight_bytes(lm)
    bound = bandwidth * 1e9 / bytes_per_token
    best = max(row.ours_tok_s for row in rows if row.workload.endswith("greedy"))
    return Bandwidth(
        copy_gb_s=bandwidth,
        weight_mb=bytes_per_token / 1e6,
        bound_tok_s=bound,
        best_greedy_tok_s=best,
        fraction_of_bound=best / bound,
    )


def reference_model(model: str | None, device: torch.device, dtype: torch.dtype | None) -> Any:
    """The model as a transformers user loads it: ``from_pretrained`` at ``dtype``, or at its own
    default when None (float32 before transformers 5; the config's dtype, ``"auto"``, since)."""
    from transformers import AutoModelForCausalLM

    from llmsample.models.checkpoint import read_config
    from llmsample.models.conversion import default_model_path

    source = default_model_path() if model is None else model
    config = read_config(source, model or "default")  # without an old conversion's GGUF quantization entry
    kwargs = {} if dtype is None else {"dtype": dtype}
    return AutoModelForCausalLM.from_pretrained(source, config=config, **kwargs).to(device).eval()


def bench_defaults(lm: LoadedModel, model: str | None, cfg: SamplingConfig, runs: int) -> list[Defaults]:
    """``llmsample generate`` as it runs by default (``lm``: eager, ``--dtype auto``) against
    ``generate`` on the model as transformers loads it by default, and against float32 (its
    default before 5.0) when that differs: one workload, the default preset."""
    ids = encode_prompt(lm, PROMPTS["chat"])
    rows = []
    for label, dtype in (("transformers default", None), ("transformers float32", torch.float32)):
        if dtype is not None and any(row.reference_dtype == dtype_name(dtype) for row in rows):
            continue  # transformers' default was float32 already
        theirs_lm = dataclasses.replace(lm, model=reference_model(model, lm.device, dtype), compiled=None)
        theirs_lm.dtype = theirs_lm.model.dtype
        timings = Timings(
            f"chat / balanced: llmsample auto ({dtype_name(lm.dtype)}) vs {label} ({dtype_name(theirs_lm.dtype)})"
        )
        theirs(theirs_lm, ids, cfg)  # warm-up
        interleave(
            timings,
            runs,
            lambda timings=timings: ours(lm, ids, cfg, ttft=timings.ttft),
            lambda theirs_lm=theirs_lm: theirs(theirs_lm, ids, cfg),
        )
        figures = dataclasses.asdict(timings.result())
        rows.append(Defaults(**figures, ours_dtype=dtype_name(lm.dtype), reference_dtype=dtype_name(theirs_lm.dtype)))
    return rows


def run_benchmark(
    model: str | None,
    device: str,
    dtype: str,
    runs: int,
    tokens: int,
    cold: bool,
    log: Callable[[str], None],
    compile: bool = False,
) -> BenchResults:
    """Every figure of the benchmark, in one process (the warm start in a fresh one)."""
    log("warm start (fresh process)")
    start_up = warm_start(model, device, dtype)
    lm = load_model(model, device, dtype, compile=compile)
    machine = machine_info()
    settings = bench_settings(tokens)
    rows, compile_s = bench_generate(lm, settings, runs, log)
    log("speculative n-gram")
    speculative = bench_speculation(lm, settings["greedy"], runs)
    log("inspection cost")
    inspection = bench_inspection(lm, settings["balanced"], runs)
    bandwidth = bench_bandwidth(lm, rows)
    defaults: list[Defaults] = []
    if dtype == "auto" and not compile:  # lm is exactly what `llmsample generate` runs by default
        log("defaults against defaults")
        defaults = bench_defaults(lm, model, settings["balanced"], runs)
    if cold:
        log("cold load (GGUF conversion)")
    cold_load = cold_load_s() if cold else None
    return BenchResults(
        machine=machine,
        model=lm.name,
        device=str(lm.device),
        dtype=dtype_name(lm.dtype),
        new_tokens=tokens,
        runs=runs,
        compile=compile,
        start_up=start_up,
        generate=tuple(rows),
        compile_s=compile_s,
        speculative=speculative,
        inspection=inspection,
        bandwidth=bandwidth,
        cold=cold,
        cold_load_s=cold_load,
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        defaults=tuple(defaults),
    )


def write_results(document: dict[str, Any], directory: Path) -> Path:
    """``BenchResults.to_dict()`` as JSON, written to a hidden sibling and renamed, so a full disk
    or a kill never leaves a truncated JSON where the results go."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    kind = document.get("kind", "bench")
    path = directory / f"{kind}-{document['device'].replace(':', '')}-{document['dtype']}-{stamp}.json"
    partial = directory / f".{path.name}.partial-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(document, indent=2))
        partial.replace(path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise UserError(
            f"cannot write the benchmark results to {directory} ({exc.strerror or exc}); "
            "free some space or pass --out with a writable directory"
        ) from exc
    return path
