"""What a decode step costs apart from the model: the memory-bandwidth bound (every weight read
once per token) and the sampling pipeline's own seconds per step."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from llmsample.bench.prompts import PROMPTS
from llmsample.bench.results import Bandwidth, StageCost, Workload
from llmsample.bench.timing import synchronize
from llmsample.engine.prompt import encode_prompt
from llmsample.engine.step import step_compute
from llmsample.models.loading import LoadedModel
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.figures import step_figures
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import make_generator, sampler_chain


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
    """Bytes read per decode step: every weight once, the input embedding only where it is the LM
    head's too (a step reads one row of it; a prepacked head holds a copy of its own)."""
    model = lm.model
    embedding = getattr(model.get_input_embeddings(), "weight", None)
    head_module = model.get_output_embeddings()
    head = {id(p) for p in head_module.parameters()} if head_module is not None else set()
    return sum(p.numel() * p.element_size() for p in model.parameters() if p is not embedding or id(p) in head)


def bench_bandwidth(lm: LoadedModel, rows: list[Workload]) -> Bandwidth:
    """The bound, and how close the best greedy workload of ``rows`` comes to it."""
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


STAGE_SETTINGS: dict[str, dict[str, Any]] = {
    "dynatemp": {"dynatemp_range": 0.5},
    "smoothing": {"smoothing_factor": 0.3},
    "epsilon": {"epsilon_cutoff": 3e-4},
    "eta": {"eta_cutoff": 3e-4},
    "top-h": {"top_h": 0.4},
    "top-a": {"top_a": 0.2},
    "p-less": {"p_less": True},
    "no-repeat-ngram": {"no_repeat_ngram_size": 3},
    "mirostat v1": {"mirostat": 1},
    "mirostat v2": {"mirostat": 2},
    "adaptive-p": {"adaptive_target": 0.5},
}
"""The stages of the sampler lab's second part, each at a typical setting (issue: each costs at
most 5 % of a decode step on the default model)."""


def stage_costs(lm: LoadedModel, cfg: SamplingConfig, step_s: float, rounds: int = 3) -> tuple[StageCost, ...]:
    """Each of :data:`STAGE_SETTINGS` over ``cfg``: the pipeline's seconds per step with it
    against ``cfg``'s alone, measured in alternation (medians of ``rounds``); ``step_s``: a
    decode step's seconds, for the share."""
    configs = {"": cfg, **{name: cfg.with_overrides(**settings) for name, settings in STAGE_SETTINGS.items()}}
    seconds: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(rounds):
        for name, config in configs.items():
            seconds[name].append(pipeline_cost(lm, config, steps=20, context=64))
    base = statistics.median(seconds.pop(""))
    return tuple(
        StageCost(name, statistics.median(s), statistics.median(s) - base, (statistics.median(s) - base) / step_s)
        for name, s in seconds.items()
    )


def pipeline_cost(lm: LoadedModel, cfg: SamplingConfig, steps: int = 50, context: int = 3) -> float:
    """Seconds per step for sampling + inspection figures on a real vocabulary, model excluded;
    ``context`` tokens of history (a story's worth makes DRY and the bans do real work)."""
    vocab = lm.model.config.vocab_size
    logits = torch.randn(1, vocab, device=lm.device) * 5
    ids = encode_prompt(lm, PROMPTS["story"] * (1 + context // 16), raw=True)[:, -context:]
    history = TokenHistory.for_config(ids, vocab, cfg, lm.tokenizer, lm.eos_ids)
    generator = make_generator(0, lm.device)
    sampler_chain(logits, history, cfg)  # tables built once per run: not a step's cost
    with step_compute(logits):  # what the loop's step computes in (threads, inference mode)
        start = time.perf_counter()
        for _ in range(steps):
            chain = sampler_chain(logits, history, cfg)
            step_figures(chain, chain.draw(generator), 5)  # ends in one host transfer
        return (time.perf_counter() - start) / steps
