"""Two checkouts' host step side by side in one process (:mod:`host_step`'s loop on the same
captured rows): each checkout's ``llmsample`` is imported in turn and its modules swapped into
``sys.modules`` for its rounds, the order alternating, one torch thread for both (the harness's
row copy would otherwise wait on a second one under load). Per setting: each side's median
thread CPU time a token and the median of the rounds' ratios (other / base), which a loaded host
moves less than either figure.
``python bench/host_step_ab.py BASE OTHER [--rounds 8] [--tokens 128]`` (BASE, OTHER: checkouts)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import statistics
import sys
from pathlib import Path
from typing import Any

import torch


def load_side(checkout: Path) -> dict[str, Any]:
    """The checkout's harness, model, prompt, settings and modules (left out of sys.modules)."""
    for name in [n for n in sys.modules if n.startswith("llmsample") or n == "host_step"]:
        del sys.modules[name]
    sys.path[:0] = [str(checkout), str(checkout / "bench")]
    try:
        host_step = importlib.import_module("host_step")
        lm = host_step.load_model(None, "cpu", "float32")
        ids = host_step.encode_prompt(lm, host_step.PROMPT)
        settings = {
            "greedy": host_step.SamplingConfig(temperature=0.0),
            "bench sampled": host_step.SamplingConfig(**host_step.SETTINGS),
            "default preset": host_step.presets.load(host_step.presets.DEFAULT_PRESET)[1],
        }
        modules = {n: m for n, m in sys.modules.items() if n.startswith("llmsample") or n == "host_step"}
    finally:
        del sys.path[:2]
    return {"host_step": host_step, "lm": lm, "ids": ids, "settings": settings, "modules": modules}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("base", type=Path)
    parser.add_argument("other", type=Path)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sides = {"base": load_side(args.base.resolve()), "other": load_side(args.other.resolve())}
    base = sides["base"]
    rows = base["host_step"].capture(base["lm"], base["ids"])
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for side in ("base", "other") if r % 2 == 0 else ("other", "base"):
            s = sides[side]
            sys.modules.update(s["modules"])  # what its functions import at run time is its own
            for name, cfg in s["settings"].items():
                cfg = dataclasses.replace(cfg, max_tokens=args.tokens, seed=r)
                cpu = s["host_step"].one_run(s["lm"], rows, s["ids"][0].tolist(), cfg)[0]
                times.setdefault((side, name), []).append(cpu * 1e3)
    for name in base["settings"]:
        a, b = times[("base", name)], times[("other", name)]
        ratios = [y / x for x, y in zip(a, b, strict=True)]
        print(
            f"{name:15s} base {statistics.median(a):.3f} ms  other {statistics.median(b):.3f} ms  "
            f"other/base {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}, {len(ratios)} rounds)"
        )


if __name__ == "__main__":
    main()
