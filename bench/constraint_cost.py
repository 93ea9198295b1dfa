"""What a constraint costs on the default model: the tokenizer table, the schema compile, the
mask per step against the whole step, and batch 8 with a different schema per row against batch
8 unconstrained. ``PYTHONPATH=. python bench/constraint_cost.py [--dtype bfloat16]``."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from llmsample.engine.continuous_batch import BatchItem, decode_batch
from llmsample.engine.prompt import encode_prompt
from llmsample.events import RunStats, Summary
from llmsample.models.loading import LoadedModel, load_model
from llmsample.sampling import constraint as constraints
from llmsample.sampling.config import SamplingConfig

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                   "hobbies": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "age", "hobbies"],
    "additionalProperties": False,
}  # fmt: skip
TOKENS = int(os.environ.get("TOKENS", 48))


def timed(make: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = make()
    return value, time.perf_counter() - start


def run(lm: LoadedModel, cfgs: list[SamplingConfig], prompt: list[int], rows: int, masks: list[float]) -> float:
    """Tokens per second of ``rows`` rows (settings cycled), EOS ignored so every run is as long."""
    import llmsample.engine.step as step

    inner = step.batch_masks

    def counted(*args: Any) -> Any:
        out, seconds = timed(lambda: inner(*args))
        masks.append(seconds)
        return out

    step.batch_masks = counted
    try:
        items = [BatchItem(i, prompt, cfgs[i % len(cfgs)], RunStats("m", "p", 0)) for i in range(rows)]
        start, tokens = time.perf_counter(), 0
        for _, record in decode_batch(lm, items, rows, ignore_eos=True):
            if isinstance(record, Summary):
                tokens += record.tokens
        return tokens / (time.perf_counter() - start)
    finally:
        step.batch_masks = inner


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rows", default="1,8")
    args = parser.parse_args()
    lm = load_model(None, "cpu", args.dtype)
    vocab = lm.model.config.vocab_size
    _, table_s = timed(lambda: constraints.tokenizer_table(lm.tokenizer, vocab, sorted(lm.eos_ids)))
    person, compile_s = timed(lambda: constraints.json_schema(json.dumps(PERSON)))
    table = constraints.tokenizer_table(lm.tokenizer, vocab, sorted(lm.eos_ids))
    _, matcher_s = timed(lambda: constraints.Matcher(person, table, vocab))
    print(f"tokenizer table {table_s:.2f} s (once per model), schema compile {1000 * compile_s:.1f} ms, "
          f"matcher {1000 * matcher_s:.1f} ms")  # fmt: skip
    prompt = encode_prompt(lm, "Give me a person with a name, an age and hobbies", room=TOKENS)[0].tolist()
    plain = SamplingConfig(temperature=0.0, max_tokens=TOKENS)
    schemas = [{**PERSON, "properties": {**PERSON["properties"], f"id{i}": {"type": "integer"}}} for i in range(8)]
    per_row = [
        SamplingConfig(temperature=0.0, max_tokens=TOKENS, constraint=constraints.json_schema(s)) for s in schemas
    ]
    for rows in [int(r) for r in args.rows.split(",")]:
        rates: dict[str, list[float]] = {"plain": [], "constrained": []}
        masks: list[float] = []
        for _ in range(args.runs):  # interleaved: the machine is noisy
            rates["plain"].append(run(lm, [plain], prompt, rows, []))
            rates["constrained"].append(run(lm, per_row[:rows] if rows > 1 else per_row[:1], prompt, rows, masks))
        p, c = statistics.median(rates["plain"]), statistics.median(rates["constrained"])
        step_ms = 1000 * rows / c
        mask_ms = 1000 * statistics.median(masks)
        print(f"batch {rows}: plain {p:.1f} tok/s, constrained {c:.1f} tok/s ({100 * (p - c) / p:+.1f} % slower); "
              f"masks {mask_ms:.2f} ms a step of {step_ms:.1f} ms ({100 * mask_ms / step_ms:.1f} %)")  # fmt: skip


if __name__ == "__main__":
    main()
