"""What a step between two real llama.cpp decodes costs, against the least a step of torch calls
can cost there: the default model's F16 GGUF, one row, 128 decodes a run, medians. Sides, their
order rotating from round to round:

- ``nothing``: the decodes alone, nothing between them (the clock's own cost);
- ``minimal``: the fewest torch calls a step with a full record makes on a 49k row, in the step's
  compute context (:func:`llmsample.engine.step.step_compute`): the top 41 through the block
  maxima, the raw row's ``log_softmax``, one uniform, the 41's softmax, the top list's raw
  log-probabilities and the host reads (19 calls); no stage, no record;
- ``minimal-hot``: the same calls again and again on one row, no decode between them;
- ``chain``: our chain, draw and figures on the same logits (the sampled settings of
  ``llmsample bench --backend llama.cpp``);
- ``loop-sampled``, ``loop-greedy``: the whole loop (``ours_timed``: records, text,
  bookkeeping), its wall time minus the backend's forward time.

The first four are this thread's CPU time between a decode and the next; the loop's is wall
time (on a quiet machine the two agree). A pass streams the weights through the caches, so the
calls after it start cold.
``PYTHONPATH=. python bench/step_floor.py [--rounds 3] [--sides chain,loop-sampled]``."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from llmsample.bench.llamacpp_peers import PROMPT, ours_timed, settings
from llmsample.engine.backend import open_backend
from llmsample.engine.prompt import encode_prompt
from llmsample.engine.step import step_compute
from llmsample.models.loading import LoadedModel, load_model
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.figures import step_figures
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import make_generator, sampler_chain

TOKENS = 128
BETWEEN = ("nothing", "minimal", "minimal-hot", "chain")  # the sides timed between two decodes
SIDES = (*BETWEEN, "loop-sampled", "loop-greedy")
WIDTH = 41  # top-k 40 and the next token, as the chain's top-k ranks them
OFFSETS = torch.arange(64)  # a block's token offsets, made once (as blocks._tokens_of keeps them)


def minimal(row: torch.Tensor, generator: torch.Generator) -> None:
    """The floor: one pass for the top candidates, the raw log-probabilities, a uniform, the
    candidates' softmax, the host reads."""
    with step_compute(row):
        maxima = row.unflatten(-1, (-1, 64)).amax(-1)
        ids = torch.add(OFFSETS, maxima.topk(WIDTH).indices.unsqueeze(-1), alpha=64).flatten(-2)
        values, at = row.gather(-1, ids).topk(WIDTH)
        ranked = ids.gather(-1, at)  # the 41 ids, most likely first
        logprobs = row.log_softmax(-1)
        uniform = torch.rand(1, generator=generator)
        (values / 0.8).softmax(-1).tolist(), ranked.tolist(), uniform.item()
        logprobs.gather(-1, ranked[:, :6]).tolist()  # the drawn token's and the top list's


def between_decodes(lm: LoadedModel, prompt: list[int], side: str) -> float:
    """Median CPU ms of ``side``'s work between two decodes (the same token fed at each; for
    ``minimal-hot``, on the prompt's logits with no decode between)."""
    generator = make_generator(0)
    backend = open_backend(lm, 1, len(prompt) + TOKENS + 2, one_prompt=True)
    times = []
    try:
        logits, fed = backend.admit([prompt]), torch.tensor([prompt[-1]])
        cfg = settings(TOKENS)
        history = TokenHistory.for_config(torch.tensor([prompt]), logits.shape[-1], cfg)
        work: dict[str, Callable[[torch.Tensor], object]] = {
            "nothing": lambda row: None,
            "minimal": lambda row: minimal(row, generator),
            "minimal-hot": lambda row: minimal(row, generator),
            "chain": lambda row: _chain(row, history, cfg, generator),
        }
        for _ in range(TOKENS):
            start = time.thread_time()
            work[side](logits)
            times.append(time.thread_time() - start)
            if side != "minimal-hot":
                logits = backend.step(fed)
    finally:
        backend.close()
    return statistics.median(times) * 1e3


def _chain(row: torch.Tensor, history: TokenHistory, cfg: SamplingConfig, generator: torch.Generator) -> None:
    with step_compute(row):
        chain = sampler_chain(row, history, cfg)
        step_figures(chain, chain.draw([generator]), 5)


def whole_loop(lm: LoadedModel, ids: torch.Tensor, greedy: bool) -> float:
    """Wall ms a token outside the forward passes, in the real loop."""
    count, wall, forward = ours_timed(lm, ids, TOKENS, greedy)
    return (wall - forward) / count * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sides", help="comma-separated: the sides to run [default: all]")
    args = parser.parse_args()
    names = args.sides.split(",") if args.sides else list(SIDES)
    unknown = [name for name in names if name not in SIDES]
    if unknown:
        parser.error(f"no side {', '.join(unknown)}; the sides: {','.join(SIDES)}")
    lm = load_model(None, "cpu", "auto", backend="llama.cpp")
    ids = encode_prompt(lm, PROMPT)
    prompt = ids[0].tolist()
    sides: dict[str, Callable[[], float]] = {
        **{side: (lambda side=side: between_decodes(lm, prompt, side)) for side in BETWEEN},
        "loop-sampled": lambda: whole_loop(lm, ids, greedy=False),
        "loop-greedy": lambda: whole_loop(lm, ids, greedy=True),
    }
    figures: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            figures[name].append(sides[name]())
    for name, runs in figures.items():
        print(f"{name:13s} {statistics.median(runs):6.3f} ms  ({', '.join(f'{v:.3f}' for v in runs)})")


if __name__ == "__main__":
    main()
