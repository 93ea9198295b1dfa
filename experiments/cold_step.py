"""How little a sampled step with a full record can cost right after a real llama.cpp pass, with
no torch at all: every step's work in a few NumPy calls (the raw row's top 41 through strided
block maxima, its log-sum-exp, minimum and maximum; temperature, top-k 40, top-p, min-p, softmax,
entropy and the draw on the candidates; the top list's raw log-probabilities and host reads),
against the fewest torch calls (``step_floor.minimal``) and nothing. Each is timed right after a
pass (``cold``) and again at once on the same row (``hot``): this thread's CPU time, medians of
128 passes of the default model's F16 GGUF, one row.
``PYTHONPATH=. python experiments/cold_step.py [--rounds 2]``."""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from experiments.step_floor import PROMPT, encode_prompt, load_model, make_generator, minimal, open_backend
from llmsample.models.loading import LoadedModel

WIDTH, BLOCK = 41, 64


def numpy_step(row: torch.Tensor, rng: np.random.Generator) -> tuple[object, ...]:
    """The whole step's arithmetic for the bench's sampled settings, in NumPy."""
    r = row.numpy().reshape(-1)
    blocks = r.shape[0] // BLOCK
    maxima = r.reshape(BLOCK, blocks).max(0)  # block j holds tokens j, j + blocks, ...
    best = np.argpartition(maxima, -WIDTH)[-WIDTH:]
    ids = (np.arange(BLOCK)[:, None] * blocks + best).ravel()
    values = r[ids]
    top = np.argpartition(values, -WIDTH)[-WIDTH:]
    order = np.argsort(-values[top], kind="stable")
    top_ids, top_values = ids[top][order], values[top][order]
    high, low = top_values[0], r.min()
    lse = high + math.log(float(np.exp(r - high).sum()))
    scaled = top_values[:40] / 0.8
    probs = np.exp(scaled - scaled[0])
    probs /= probs.sum()
    kept = min(int(np.searchsorted(np.cumsum(probs), 0.95)) + 1, int((probs >= 0.05 * probs[0]).sum()))
    sampled = probs[:kept] / probs[:kept].sum()
    picked = min(int(np.searchsorted(np.cumsum(sampled), rng.random())), kept - 1)
    entropy = float(-(sampled * np.log(sampled)).sum())
    return top_ids.tolist(), sampled.tolist(), (top_values[:6] - lse).tolist(), picked, entropy, float(low)


def timed(work: Callable[[torch.Tensor], object], lm: LoadedModel, prompt: list[int], passes: int = 128) -> tuple[float, float]:
    """Median CPU ms of ``work`` right after each pass, and again at once."""
    backend = open_backend(lm, 1, len(prompt) + passes + 2, one_prompt=True)
    cold, hot = [], []
    try:
        logits, fed = backend.admit([prompt]), torch.tensor([prompt[-1]])
        for _ in range(passes):
            for times in (cold, hot):
                start = time.thread_time()
                work(logits)
                times.append(time.thread_time() - start)
            logits = backend.step(fed)
    finally:
        backend.close()
    return statistics.median(cold) * 1e3, statistics.median(hot) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    lm = load_model(None, "cpu", "auto", backend="llama.cpp")
    prompt = encode_prompt(lm, PROMPT)[0].tolist()
    generator, rng = make_generator(0), np.random.default_rng(0)
    sides: dict[str, Callable[[torch.Tensor], object]] = {
        "nothing": lambda row: None,
        "torch-minimal": lambda row: minimal(row, generator),
        "numpy-step": lambda row: numpy_step(row, rng),
    }
    for _ in range(args.rounds):
        for name, work in sides.items():
            cold, hot = timed(work, lm, prompt)
            print(f"{name:14s} cold {cold:.3f} ms  hot {hot:.3f} ms")


if __name__ == "__main__":
    main()
