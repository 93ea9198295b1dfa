"""``llmsample bench --constraints``: what a JSON schema costs on the model, and how public schemas
fare (:mod:`llmsample.bench.public_schemas`).

- Once per model and schema: llguidance's table of the tokenizer, compiling a person schema, a
  row's matcher.
- A step: :data:`ROWS` rows decoded plain and with a schema each (a different one per row), EOS
  ignored so every run is as long, side by side in rotating rounds
  (:mod:`llmsample.bench.timing`). The masks a step are timed apart, without touching the loop:
  the constrained rows' tokens are replayed through fresh matchers, every step's masks computed
  in one ``batch_masks`` call as the loop computes them, and their median set against the step
  (rows over the constrained side's tokens/s)."""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from llmsample.bench.public_schemas import SchemaFigures, run_schema_benchmark
from llmsample.bench.timing import paired_ratio, rounds
from llmsample.engine.continuous_batch import BatchItem, decode_batch
from llmsample.engine.prompt import encode_prompt
from llmsample.events import RunStats, Summary, TokenEvent
from llmsample.models.loading import LoadedModel
from llmsample.sampling import constraint as constraints
from llmsample.sampling.config import SamplingConfig

ROWS = (1, 8)
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                   "hobbies": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "age", "hobbies"],
    "additionalProperties": False,
}  # fmt: skip
PROMPT = "Give me a person with a name, an age and hobbies"


@dataclass(frozen=True)
class StepCost:
    """``rows`` rows plain against constrained: tokens/s (medians), the ratio of rounds, and the
    masks' median milliseconds a step against the constrained step's."""

    rows: int
    plain_tok_s: float
    constrained_tok_s: float
    ratio: float
    mask_ms: float
    step_ms: float
    mask_share: float


@dataclass(frozen=True)
class ConstraintCost:
    tokens: int
    table_s: float
    compile_ms: float
    matcher_ms: float
    steps: list[StepCost]
    schemas: SchemaFigures

    def to_dict(self) -> dict[str, Any]:
        return {"new_tokens": self.tokens, "table_s": self.table_s, "compile_ms": self.compile_ms,
                "matcher_ms": self.matcher_ms, "steps": [asdict(step) for step in self.steps],
                "schemas": self.schemas.to_dict()}  # fmt: skip


def timed(make: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = make()
    return value, time.perf_counter() - start


@dataclass
class Run:
    """One side: ``rows`` rows of the prompt under ``configs`` (cycled); called, its tokens/s,
    and each row's tokens of its last run in ``emitted``."""

    lm: LoadedModel
    prompt: list[int]
    configs: list[SamplingConfig]
    rows: int
    emitted: defaultdict[int, list[int]] = field(default_factory=lambda: defaultdict(list))

    def __call__(self) -> float:
        self.emitted.clear()
        items = [BatchItem(i, self.prompt, self.configs[i % len(self.configs)], RunStats(self.lm.name, "bench", 0))
                 for i in range(self.rows)]  # fmt: skip
        start, tokens = time.perf_counter(), 0
        for key, record in decode_batch(self.lm, items, self.rows, ignore_eos=True):
            if isinstance(record, TokenEvent):
                self.emitted[key].append(record.token_id)
            elif isinstance(record, Summary):
                tokens += record.tokens
        return tokens / (time.perf_counter() - start)


def replayed_masks(lm: LoadedModel, configs: list[SamplingConfig], emitted: dict[int, list[int]]) -> list[float]:
    """Seconds of each step's masks for the rows still going, the rows' tokens replayed through
    fresh matchers (the states the loop's masks were computed in)."""
    vocab = lm.model.config.vocab_size
    table = constraints.tokenizer_table(lm.tokenizer, vocab, sorted(lm.eos_ids))
    rows = [(constraints.Matcher(configs[key % len(configs)].constraint, table, vocab), ids)
            for key, ids in sorted(emitted.items())]  # fmt: skip
    seconds = []
    for step in range(max(len(ids) for _, ids in rows)):
        going = [matcher for matcher, ids in rows if step < len(ids) and not matcher.stopped]
        if not going:
            break
        seconds.append(timed(lambda going=going: constraints.batch_masks(going, [()] * len(going)))[1])
        for matcher, ids in rows:
            if step < len(ids) and not matcher.stopped:
                matcher.advance([ids[step]])
    return seconds


def run_constraint_benchmark(
    lm: LoadedModel, runs: int, tokens: int, log: Callable[[str], None]
) -> ConstraintCost:
    """The one-off costs, each of :data:`ROWS` plain against constrained in ``runs`` rounds (at
    most 48 tokens), then the public schemas (at most 192 tokens an output)."""
    vocab = lm.model.config.vocab_size
    log("the tokenizer's table, a schema's compile, a matcher")
    table, table_s = timed(lambda: constraints.tokenizer_table(lm.tokenizer, vocab, sorted(lm.eos_ids)))
    person, compile_s = timed(lambda: constraints.json_schema(json.dumps(PERSON)))
    _, matcher_s = timed(lambda: constraints.Matcher(person, table, vocab))
    step_tokens = min(tokens, 48)
    prompt = encode_prompt(lm, PROMPT, room=step_tokens)[0].tolist()
    plain = [SamplingConfig(temperature=0.0, max_tokens=step_tokens)]
    schemas = [{**PERSON, "properties": {**PERSON["properties"], f"id{i}": {"type": "integer"}}} for i in range(max(ROWS))]
    constrained = [SamplingConfig(temperature=0.0, max_tokens=step_tokens, constraint=constraints.json_schema(s))
                   for s in schemas]  # fmt: skip
    steps = []
    for rows in ROWS:
        log(f"batch {rows}: plain against a schema a row, {runs} rounds")
        with_schema = Run(lm, prompt, constrained[:rows], rows)
        mine, theirs = rounds(runs, [with_schema, Run(lm, prompt, plain, rows)])
        mask_ms = 1000 * statistics.median(replayed_masks(lm, constrained[:rows], with_schema.emitted))
        step_ms = 1000 * rows / statistics.median(mine)
        steps.append(StepCost(rows, statistics.median(theirs), statistics.median(mine), paired_ratio(mine, theirs),
                              mask_ms, step_ms, mask_ms / step_ms))  # fmt: skip
    figures = run_schema_benchmark(lm, min(tokens, 192), log)
    return ConstraintCost(step_tokens, table_s, 1000 * compile_s, 1000 * matcher_s, steps, figures)


def table(result: ConstraintCost) -> str:
    """The figures as lines for the terminal."""
    lines = [f"what a constraint costs ({result.tokens} tokens a row, EOS ignored, greedy)",
             f"  tokenizer's table {result.table_s:.2f} s (once per model), person schema's compile "
             f"{result.compile_ms:.1f} ms, a row's matcher {result.matcher_ms:.1f} ms"]  # fmt: skip
    for step in result.steps:
        lines.append(f"  batch {step.rows}: plain {step.plain_tok_s:.1f} tok/s, a schema a row {step.constrained_tok_s:.1f} "
                     f"tok/s ({step.ratio:.2f}x); masks {step.mask_ms:.2f} ms of a {step.step_ms:.1f} ms step "
                     f"({step.mask_share:.1%})")  # fmt: skip
    return "\n".join([*lines, *result.schemas.lines()])
