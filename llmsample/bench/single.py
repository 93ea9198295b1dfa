"""The single-stream benchmark: our token loop side by side with transformers' ``generate`` on
the same model, dtype, prompt and settings, and on the model as transformers' users load it at
that dtype, interleaved, medians of several runs, ratios first (a shared machine is noisy; ratios
hold). Also n-gram speculation, the inspection cost, the bandwidth bound, start-up times and, at
the defaults, defaults against defaults."""

from __future__ import annotations

import dataclasses
import io
import resource
import statistics
from collections.abc import Callable
from typing import Any

import torch

from llmsample.bench.costs import bench_bandwidth, pipeline_cost, stage_costs
from llmsample.bench.prompts import PROMPTS
from llmsample.bench.results import BenchResults, Defaults, Generate, Inspection, Speculation, machine_info
from llmsample.bench.sides import as_transformers_loads, ours, theirs
from llmsample.bench.startup import cold_load_s, warm_start
from llmsample.bench.timing import Timings, interleave, paired_ratio, rounds, timed_tokens_per_s
from llmsample.engine.loop import generate
from llmsample.engine.prompt import encode_prompt
from llmsample.engine.speculative import NgramDrafter
from llmsample.events import RunStats, Summary
from llmsample.models.device import dtype_name
from llmsample.models.loading import LoadedModel, load_model
from llmsample.render.stream import JsonlRenderer, PlainRenderer
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.presets import load as load_preset


def bench_settings(tokens: int) -> dict[str, SamplingConfig]:
    """Greedy, and the default preset with a fixed seed and no stop strings (every run the same length)."""
    balanced = load_preset("balanced")[1]
    return {
        "greedy": SamplingConfig(temperature=0.0, max_tokens=tokens),
        "balanced": SamplingConfig(**{**balanced.as_dict(), "stop": (), "max_tokens": tokens, "seed": 0}),
    }


def bench_generate(
    lm: LoadedModel,
    loaded: LoadedModel,
    settings: dict[str, SamplingConfig],
    runs: int,
    log: Callable[[str], None],
) -> tuple[list[Generate], float | None]:
    """Every prompt under every setting, the three sides (``loaded``: transformers' model as its
    users load it); also the seconds ``--compile`` took (None without)."""
    rows = []
    first_run: dict[str, Any] = {}
    for prompt_name, prompt in PROMPTS.items():
        ids = encode_prompt(lm, prompt)
        for setting, cfg in settings.items():
            log(f"{prompt_name} / {setting}")
            timings = Timings(f"{prompt_name} / {setting}")
            ours(lm, ids, cfg, extra=first_run)  # warm-up (and, with --compile, the compilation)
            theirs(loaded, ids, cfg)
            interleave(
                timings,
                runs,
                lambda ids=ids, cfg=cfg, timings=timings: ours(lm, ids, cfg, ttft=timings.ttft),
                lambda ids=ids, cfg=cfg: theirs(lm, ids, cfg),
                lambda ids=ids, cfg=cfg: theirs(loaded, ids, cfg),
            )
            rows.append(timings.generate_result())
    return rows, first_run.get("compile_s")


def bench_speculation(lm: LoadedModel, greedy: SamplingConfig, runs: int) -> Speculation:
    """n-gram drafting on the input-grounded prompt, against prompt lookup and our plain loop."""
    ids = encode_prompt(lm, PROMPTS["code-rewrite"])
    vocab = lm.model.config.vocab_size
    facts = []  # each speculative run's speculation facts

    def speculative() -> int:
        stats = RunStats(lm.name, "bench", None)
        events = generate(lm, ids, greedy, stats, drafter=NgramDrafter(vocab, lm.device), ignore_eos=True)
        count = sum(1 for item in events if not isinstance(item, Summary))
        facts.append(stats.facts.speculation)
        return count

    drafted, lookup, plain = rounds(
        runs,
        [
            lambda: timed_tokens_per_s(speculative),
            lambda: timed_tokens_per_s(lambda: theirs(lm, ids, greedy, prompt_lookup_num_tokens=10)),
            lambda: timed_tokens_per_s(lambda: ours(lm, ids, greedy)),
        ],
    )
    row = Timings("code-rewrite / greedy, ngram", drafted, lookup).result()
    return Speculation(
        **dataclasses.asdict(row),
        speedup_over_plain=paired_ratio(drafted, plain),
        acceptance_rate=statistics.median(f.acceptance_rate if f else 0.0 for f in facts),
        tokens_per_pass=facts[-1].tokens_per_pass if facts[-1] else 0.0,  # the last run's
    )


def bench_inspection(lm: LoadedModel, cfg: SamplingConfig, runs: int) -> Inspection:
    """JSON lines with alternatives against plain text, and the pipeline's share of a step."""
    ids = encode_prompt(lm, PROMPTS["story"])
    text, jsonl = rounds(
        runs,
        [
            lambda: timed_tokens_per_s(lambda: ours(lm, ids, cfg, PlainRenderer(io.StringIO()))),
            lambda: timed_tokens_per_s(lambda: ours(lm, ids, cfg, JsonlRenderer(io.StringIO()))),
        ],
    )
    text_tok_s, jsonl_tok_s = statistics.median(text), statistics.median(jsonl)
    per_step = pipeline_cost(lm, cfg)
    return Inspection(
        text_tok_s=text_tok_s,
        jsonl_tok_s=jsonl_tok_s,
        jsonl_over_text=paired_ratio(jsonl, text),
        pipeline_s_per_step=per_step,
        pipeline_share_of_step=per_step / (1 / text_tok_s),  # of the plain text's seconds per step
        stages=stage_costs(lm, cfg, 1 / text_tok_s),
    )


def bench_defaults(lm: LoadedModel, model: str | None, cfg: SamplingConfig, runs: int) -> list[Defaults]:
    """``llmsample generate`` as it runs by default (``lm``: eager, ``--dtype auto``) against
    ``generate`` on the model as transformers loads it by default, and against float32 (its
    default before 5.0) when that differs: one workload, the default preset."""
    ids = encode_prompt(lm, PROMPTS["chat"])
    rows = []
    for label, dtype in (("transformers default", None), ("transformers float32", torch.float32)):
        if dtype is not None and any(row.reference_dtype == dtype_name(dtype) for row in rows):
            continue  # transformers' default was float32 already
        theirs_lm = as_transformers_loads(lm, model, dtype)
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
    rows, compile_s = bench_generate(lm, as_transformers_loads(lm, model, lm.dtype), settings, runs, log)
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
