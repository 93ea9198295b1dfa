"""``llmsample bench --constraints`` end to end on a tiny byte-level model (it can spell any JSON)
with a few local schemas in place of the fetched ones; fetching from the cache, and the verdicts."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import llmsample.bench.constraint_cost
import llmsample.bench.public_schemas as public_schemas
from llmsample.cli import main
from tests.constraints.conftest import make_byte_model

LOCAL = [
    ("local:person.json", {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}),
    ("local:tags.json", {"type": "array", "items": {"type": "string", "format": "x-unknown"}, "uniqueItems": True}),
    ("local:remote.json", {"$ref": "https://example.com/elsewhere.json"}),
]


@pytest.mark.slow  # the results' machine record asks `uname -p`
def test_bench_constraints_writes_costs_and_schemas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llmsample.bench.constraint_cost, "ROWS", (1, 2))
    monkeypatch.setattr(public_schemas, "read_schemas", lambda cache, log: (LOCAL, ["somepackage 1.0"]))
    model = make_byte_model(tmp_path / "byte")
    args = ["bench", "--constraints", "-m", str(model), "--runs", "1", "--tokens", "8", "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (path,) = (tmp_path / "out").glob("bench-constraints-cpu-float32-*.json")
    document = json.loads(path.read_text())
    assert document["new_tokens"] == 8 and document["table_s"] > 0 and document["compile_ms"] > 0
    assert [step["rows"] for step in document["steps"]] == [1, 2]
    for step in document["steps"]:
        assert step["plain_tok_s"] > 0 and step["constrained_tok_s"] > 0 and 0 < step["mask_share"] < 1
    schemas = document["schemas"]
    assert schemas["schemas"] == 3 and schemas["coverage_lenient"] == pytest.approx(2 / 3)
    assert schemas["unfetched"] == ["somepackage 1.0"] and list(schemas["refused"]) == ["local:remote.json"]
    assert schemas["ignored_keywords"] == {"format": 1, "uniqueItems": 1} and schemas["rows"] == 2
    assert "public schemas: 3, coverage 66.7%" in result.stdout and "not fetched: somepackage 1.0" in result.stdout


def test_packages_come_from_the_cache_and_the_rest_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"sources": [
        {"registry": "pypi", "package": "some-schemas", "version": "1.0", "paths": ["pkg/a.json"]},
        {"registry": "npm", "package": "@scope/other", "version": "2.0", "paths": ["package/b.json"]},
    ]}))  # fmt: skip
    cache = tmp_path / "cache"
    cache.mkdir()
    with zipfile.ZipFile(cache / "some_schemas-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("pkg/a.json", json.dumps({"type": "integer"}))
    monkeypatch.setattr(public_schemas, "MANIFEST", manifest)
    monkeypatch.setattr(public_schemas.shutil, "which", lambda name: None)  # no npm here
    schemas, unfetched = public_schemas.read_schemas(cache, lambda step: None)
    assert schemas == [("some-schemas:pkg/a.json", {"type": "integer"})] and unfetched == ["@scope/other 2.0"]


def test_the_verdicts() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "tags": {"uniqueItems": True}}}
    assert public_schemas.judge(schema, '{"n": 1}', ()) == "valid"
    assert public_schemas.judge(schema, '{"n": "x"}', ("uniqueItems",)) == "invalid"
    assert public_schemas.judge(schema, '{"tags": [1, 1]}', ("uniqueItems",)) == "invalid-ignored"
    assert public_schemas.judge({"$ref": "https://example.com/x.json"}, "{}", ()) == "unresolvable"


def test_no_schema_fetched_says_so() -> None:
    figures = public_schemas.figures([], ["check-jsonschema 0.39.0"], 0.1)
    assert figures.coverage_lenient is None and figures.lines() == ["public schemas: none fetched (check-jsonschema 0.39.0)"]
