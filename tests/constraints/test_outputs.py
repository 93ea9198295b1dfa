"""Every finished constrained output is valid: JSON under real-world schemas (validated with the
``jsonschema`` library), regexes (``re.fullmatch``) and choices, over many seeds at temperatures
1.0 to 1.5 with the filters off, on a tiny byte-level model (rows of one prompt decoded together)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from llmsample.engine.loop import generate_rows
from llmsample.engine.prompt import encode_prompt
from llmsample.events import RunStats, Summary
from llmsample.sampling import constraint as constraints
from llmsample.sampling.config import SamplingConfig

NAME = {"type": "string", "minLength": 1, "maxLength": 6}
SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "person": {
                "type": "object",
                "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 130}},
                "required": ["name", "age"],
                "additionalProperties": False,
            },
            "active": {"type": "boolean"},
        },
        "required": ["person", "active"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": NAME, "minItems": 1, "maxItems": 3}},
        "required": ["tags"],
        "additionalProperties": False,
    },
    "enum_and_pattern": {
        "type": "object",
        "properties": {
            "colour": {"enum": ["red", "green", "blue"]},
            "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
        },
        "required": ["colour", "code"],
        "additionalProperties": False,
    },
    "numbers": {
        "type": "object",
        "properties": {
            "score": {"type": "number", "minimum": -1.5, "maximum": 2.5},
            "count": {"type": "integer", "exclusiveMinimum": 3, "maximum": 9},
        },
        "required": ["score", "count"],
        "additionalProperties": False,
    },
    "any_of_one_of": {
        "type": "object",
        "properties": {
            "id": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 999}, NAME]},
            "kind": {"oneOf": [{"const": "a"}, {"const": "b"}, {"type": "null"}]},
        },
        "required": ["id", "kind"],
        "additionalProperties": False,
    },
    "ref": {
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}},
                            "required": ["x"], "additionalProperties": False}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
}  # fmt: skip
ROWS = 12


def decode_many(lm, constraint, temperature: float, max_tokens: int = 96) -> list[Summary]:
    """``ROWS`` samples of one prompt, seeds 0..ROWS-1, no filters."""
    cfg = SamplingConfig(temperature=temperature, max_tokens=max_tokens, constraint=constraint)
    prompt = encode_prompt(lm, "Answer:", raw=True)
    stats = [RunStats("bytes", "test", seed) for seed in range(ROWS)]
    summaries = [r for _, r in generate_rows(lm, prompt, cfg, stats, list(range(ROWS))) if isinstance(r, Summary)]
    assert len(summaries) == ROWS
    return summaries


def finished(summaries: list[Summary]) -> list[str]:
    """The complete outputs: every one that ended at EOS, and any the length limit reached just
    as the grammar was complete (the others say ``complete: false``)."""
    for summary in summaries:
        assert summary.facts.constraint is not None
        assert summary.facts.constraint.complete or summary.stop_reason == "length"
    texts = [s.text for s in summaries if s.facts.constraint.complete]
    assert len(texts) >= ROWS // 2, [s.text for s in summaries]
    return texts


@pytest.mark.parametrize(("name", "temperature"), list(zip(SCHEMAS, [1.0, 1.1, 1.2, 1.3, 1.4, 1.5], strict=True)))
def test_every_finished_output_validates_under_its_schema(byte_lm, name: str, temperature: float) -> None:
    schema = SCHEMAS[name]
    for text in finished(decode_many(byte_lm, constraints.json_schema(json.dumps(schema)), temperature)):
        jsonschema.validate(json.loads(text), schema)


def test_any_json_is_an_object_in_compact_form(byte_lm) -> None:
    """A random model never closes its strings, so this one is checked on given texts."""
    vocab = byte_lm.model.config.vocab_size
    table = constraints.tokenizer_table(byte_lm.tokenizer, vocab, sorted(byte_lm.eos_ids))
    matcher = constraints.Matcher(constraints.any_json(), table, vocab)
    ids = byte_lm.tokenizer.encode
    for text in ("{}", '{"a": [1, {"b": null}], "c": "d"}'):
        assert matcher.accepts_after(ids(text)), text
    for text in ("[1]", '{"a" : 1}', "{ }", '{"a": 1}x'):
        tokens = ids(text)
        assert matcher.valid_prefix(tokens) < len(tokens), text


@pytest.mark.parametrize("pattern", [r"[a-f]{2,5}-[0-9]{1,3}", r"(yes|no|maybe)!?", r"\(\d{3}\) \d{3}-\d{4}"])
def test_regex_outputs_match(byte_lm, pattern: str) -> None:
    for text in finished(decode_many(byte_lm, constraints.regex(pattern), 1.3, max_tokens=24)):
        assert re.fullmatch(pattern, text), text


def test_choice_outputs_are_one_of_the_choices(byte_lm) -> None:
    choices = ["Paris", "Par", "London", "Lyon"]
    texts = finished(decode_many(byte_lm, constraints.choice(choices), 1.5, max_tokens=12))
    assert set(texts) <= set(choices) and len(texts) == ROWS
