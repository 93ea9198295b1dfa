"""Schemas from the wild: by default what llguidance cannot enforce is left unenforced and named
(one warning line, ``constraint_ignored`` in the records); ``--strict-schema`` and the request
key ``strict_schema`` refuse such a schema, naming the keyword. Small hand-written schemas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmsample.batch.requests import CHAT_URL, Request, RequestError, read_requests
from llmsample.errors import UserError
from llmsample.events import ConstraintOutcome, RunFacts
from llmsample.sampling import constraint as constraints
from llmsample.sampling import lenient
from llmsample.serve.api_errors import ApiError
from llmsample.serve.parsing import parse_body
from tests.constraints.test_cli import run

UNIQUE = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
LOOKAHEAD = {"type": "string", "pattern": "(?=x)x+"}  # look-around: llguidance's regex engine has none
CASES = [
    (UNIQUE, ("uniqueItems",)),
    ({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, ("if", "then")),
    ({"type": "object", "properties": {"a": {}}, "dependencies": {"a": ["b"]}}, ("dependencies",)),
    ({"type": "string", "format": "relative-uri"}, ("format: relative-uri",)),
    ({"oneOf": [{"type": "object"}, {"type": "object", "properties": {"x": {"type": "integer"}}}]}, ("oneOf",)),
    (
        {"type": "object", "properties": {"a": UNIQUE, "b": {"not": {}}, "c": {"type": "string", "format": "x"}}},
        ("not", "uniqueItems", "format: x"),
    ),
    ({"type": "object", "properties": {"a": UNIQUE, "b": UNIQUE}}, ("uniqueItems",)),  # "(2 times)": named once
    (
        {"type": "object", "properties": {"a": LOOKAHEAD, "b": LOOKAHEAD}, "required": ["a"]},
        ("pattern: (?=x)x+",),
    ),
    ({"$schema": "http://json-schema.org/schema", "type": "string"}, ("$schema: http://json-schema.org/schema",)),
]


@pytest.mark.parametrize(("schema", "ignored"), CASES)
def test_lenient_by_default_and_each_ignored_keyword_named(schema: dict, ignored: tuple[str, ...]) -> None:
    assert constraints.json_schema(schema).ignored == ignored
    with pytest.raises(UserError) as refused:
        constraints.json_schema(schema, strict=True)
    assert str(refused.value).startswith("--json-schema: ")
    assert str(refused.value).endswith("; without --strict-schema it is left unenforced")


def test_what_llguidance_enforces_is_not_reported() -> None:
    schema = {"type": "object", "properties": {"h": {"type": "string", "format": "date-time"}}, "required": ["h"]}
    assert constraints.json_schema(schema).ignored == ()
    assert constraints.json_schema({"oneOf": [{"type": "string"}, {"type": "integer"}]}).ignored == ()
    assert lenient.warning("--json-schema", constraints.json_schema(schema).ignored) is None
    data = {"enum": [{"pattern": "(?=x)"}, 1]}  # a value, not a schema: left as it is
    assert constraints.json_schema(data).ignored == ()
    for refused in (
        {"type": "string", "pattern": "(x"},
        {"$schema": "http://json-schema.org/draft-07/schema#", "type": "strang"},
    ):
        with pytest.raises(UserError):  # what is wrong, not merely unenforceable, is still refused
            constraints.json_schema(refused)
    warning = lenient.warning("schema.json", constraints.json_schema(UNIQUE, "schema.json").ignored)
    assert (
        warning == "schema.json: not enforced (llguidance cannot): uniqueItems; --strict-schema refuses such a schema"
    )


def test_the_summary_lists_them_only_when_there_are_some() -> None:
    lenient = RunFacts(constraint=ConstraintOutcome("--json-schema", True, ("uniqueItems",))).to_dict()
    assert lenient == {"constraint": "--json-schema", "complete": True, "constraint_ignored": ["uniqueItems"]}
    assert RunFacts(constraint=ConstraintOutcome("--json-schema", True)).to_dict() == {
        "constraint": "--json-schema",
        "complete": True,
    }


def test_batch_lines_take_strict_schema() -> None:
    lines = [
        json.dumps({"prompt": "hi", "json_schema": UNIQUE}),
        json.dumps({"prompt": "hi", "json_schema": UNIQUE, "strict_schema": True}),
        json.dumps({"prompt": "hi", "strict_schema": "yes"}),
    ]
    lenient, strict, bad = read_requests(lines)
    assert isinstance(lenient, Request) and lenient.overrides["constraint"].ignored == ("uniqueItems",)
    assert isinstance(strict, RequestError) and 'Unimplemented keys: ["uniqueItems"]' in strict.message
    assert isinstance(bad, RequestError) and bad.message.startswith("strict_schema: expected true or false")


def test_serve_warns_and_strict_schema_refuses() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "json_schema": UNIQUE}
    serve = parse_body(body, CHAT_URL, frozenset())
    assert serve.warnings == (
        "json_schema: not enforced (llguidance cannot): uniqueItems; --strict-schema refuses such a schema",
    )
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": UNIQUE}}
    for strict in ({"json_schema": UNIQUE}, {"response_format": response_format}):
        with pytest.raises(ApiError) as refused:
            parse_body({**body, **strict, "strict_schema": True}, CHAT_URL, frozenset())
        assert refused.value.status == 400 and "uniqueItems" in refused.value.message


def test_generate_warns_in_one_line_and_records_them(byte_model_dir: Path) -> None:
    schema = json.dumps(UNIQUE)
    result = run("generate", "-p", "hi", "--raw", "--json-schema", schema, "--seed", "1", "-n", "40",
                 "--format", "jsonl", model=byte_model_dir)  # fmt: skip
    assert result.returncode in (0, 1), result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning:")]
    assert warnings == [
        "Warning: --json-schema: not enforced (llguidance cannot): uniqueItems; --strict-schema refuses such a schema"
    ]
    assert json.loads(result.stdout.splitlines()[-1])["constraint_ignored"] == ["uniqueItems"]
    short = {**UNIQUE, "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 2}  # completes
    lines = [{"custom_id": "a", "prompt": "hi", "raw": True, "json_schema": short, "max_tokens": 40, "seed": 1},
             {"custom_id": "b", "prompt": "hi", "json_schema": UNIQUE, "strict_schema": True}]  # fmt: skip
    batch = run("batch", "--tokens", "none", stdin="\n".join(json.dumps(line) for line in lines), model=byte_model_dir)
    lenient, strict_line = (json.loads(line) for line in batch.stdout.splitlines())
    assert lenient["custom_id"] == "a" and lenient["constraint_ignored"] == ["uniqueItems"]
    assert strict_line["custom_id"] == "b" and "uniqueItems" in strict_line["error"]["message"]
    strict = run("generate", "-p", "hi", "--json-schema", schema, "--strict-schema", model=byte_model_dir)
    assert strict.returncode == 2 and strict.stdout == ""
    assert [line for line in strict.stderr.splitlines() if line.strip()] == [
        'Error: --json-schema: Unimplemented keys: ["uniqueItems"] (llguidance does not support this keyword; '
        "leave it out of the schema); without --strict-schema it is left unenforced"
    ]
