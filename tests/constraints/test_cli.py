"""The constraint flags in real subprocesses: every command takes them, bad input is one line
with exit 2 before the model loads, an incomplete output exits 1 saying so, a constraint another
stage empties is one line naming both, and batch's own keys and OpenAI's ``response_format``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import cli_env

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 5}, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def run(*args: str, model: Path | str, stdin: str | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "llmsample", *args, "-m", str(model), "--device", "cpu"]
    return subprocess.run(command, input=stdin, capture_output=True, text=True, env=cli_env(), timeout=180)


def one_line(result: subprocess.CompletedProcess, code: int, fragment: str) -> None:
    assert result.returncode == code, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and fragment in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_generate_json_schema_from_a_file(byte_model_dir: Path, tmp_path: Path) -> None:
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(SCHEMA))
    result = run("generate", "-p", "hi", "--raw", "--json-schema", str(schema), "--seed", "1", "-t", "1.2",
                 "-n", "60", "--format", "jsonl", model=byte_model_dir)  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.splitlines()[-1])
    assert summary["constraint"] == "--json-schema" and summary["complete"] is True
    jsonschema.validate(json.loads(summary["text"]), SCHEMA)
    assert all("constraint" in json.loads(line)["removed"] for line in result.stdout.splitlines()[:-1])


def test_speculate_regex_and_incomplete_output_exits_1(byte_model_dir: Path) -> None:
    ok = run("speculate", "-p", "abc-12 abc-12 ab", "--raw", "--regex", "[a-c]{3}-[0-9]{2}", "--seed", "2", "-q",
             model=byte_model_dir)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert re.fullmatch("[a-c]{3}-[0-9]{2}", ok.stdout.strip())
    cut = run("generate", "-p", "hi", "--raw", "--json-schema", json.dumps(SCHEMA), "-n", "4", "-q", "--seed", "1",
              "--format", "jsonl", model=byte_model_dir)  # fmt: skip
    one_line(cut, 1, "the output is incomplete under --json-schema after 4 tokens; raise --max-tokens")
    summary = json.loads(cut.stdout.splitlines()[-1])
    assert summary["stop_reason"] == "length" and summary["complete"] is False and len(summary["text"]) == 4


def test_explain_shows_the_grammar_column_and_compare_presets_takes_a_choice(byte_model_dir: Path) -> None:
    result = run("explain", "-p", "hi", "--raw", "--choice", "yes", "--choice", "no", "--format", "jsonl", "-q",
                 "--top-p", "1", "--top-k", "0", model=byte_model_dir)  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert "constraint" in report["stages"] and report["kept"]["constraint"] == 2
    allowed = {c["text"] for c in report["candidates"] if c["removed_by"] is None}
    assert allowed == {"y", "n"}
    table = run("explain", "-p", "hi", "--raw", "--choice", "yes", "--choice", "no", "--no-color", "-q",
                model=byte_model_dir)  # fmt: skip
    assert "gramm." in table.stdout
    compared = run("compare-presets", "-p", "hi", "--raw", "--choice", "yes", "--choice", "no", "--presets",
                   "balanced,deterministic", "--format", "jsonl", "-q", model=byte_model_dir)  # fmt: skip
    assert compared.returncode == 0, compared.stderr
    assert {json.loads(line)["text"] for line in compared.stdout.splitlines()} <= {"yes", "no"}


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--json-schema", '{"type": "strang"}'), "--json-schema: Invalid type: strang"),
        (("--json-schema", "missing.json"), "--json-schema missing.json: No such file or directory"),
        (("--strict-schema", "--json-schema", '{"type": "object", "if": {}}'), 'Unimplemented keys: ["if"]'),
        (("--regex", "a("), "--regex: invalid regex: unclosed group"),
        (("--grammar", "GRAMMAR"), "unknown name"),
        (("--json", "--regex", "a"), "--json and --regex are two constraints; give one"),
        (("--regex", r"[^\s\S]"), "--regex: matches no text at all"),
        (("--json-schema", '{"items": ' * 3000 + "{}" + "}" * 3000), "--json-schema: nested too deeply"),
    ],
)
def test_bad_constraints_fail_in_one_line_before_the_model_loads(
    tmp_path: Path, args: tuple[str, ...], fragment: str
) -> None:
    grammar = tmp_path / "bad.lark"
    grammar.write_text("start: foo\n")
    args = tuple(str(grammar) if a == "GRAMMAR" else a for a in args)
    result = run("generate", "-p", "hi", *args, model=tmp_path / "no-such-model")  # the model would fail to load
    one_line(result, 2, fragment)
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("args", "stage"),
    [(("--ban", "y"), "--ban"), (("--ban", "s"), "--ban"), (("--min-tokens", "3"), "--min-tokens")],
)
def test_a_constraint_another_stage_leaves_no_end_is_refused_before_any_text(
    byte_model_dir: Path, args: tuple[str, ...], stage: str
) -> None:
    """``--ban s`` lets "ye" out before the "s" it needs: refused before the first token, nothing on stdout."""
    choice = ("--choice", "a") if stage == "--min-tokens" else ("--choice", "yes")
    result = run("generate", "-p", "hi", "--raw", *choice, *args, "-q", model=byte_model_dir)
    one_line(result, 2, f"--choice cannot be completed: it allows only tokens that {stage} removes; loosen one")
    assert result.stdout == ""


def test_a_tokenizer_llguidance_cannot_read_is_one_line(tiny_model_dir: Path) -> None:
    """The word-level tiny model's tokenizer has no decoder: llguidance cannot spell its tokens."""
    result = run("generate", "-p", "w3", "--raw", "--json", "-q", model=tiny_model_dir)
    one_line(result, 2, "--json: llguidance cannot read this model's tokenizer (can't determine decoder type")


def test_batch_keys_and_openai_response_format(byte_model_dir: Path) -> None:
    lines = [
        json.dumps({"custom_id": "s", "prompt": "hi", "json_schema": SCHEMA, "max_tokens": 60, "seed": 1}),
        json.dumps({"custom_id": "r", "prompt": "hi", "regex": "[0-9]{3}", "max_tokens": 8}),
        json.dumps({"custom_id": "c", "prompt": "hi", "choice": ["red", "green"], "max_tokens": 8}),
        json.dumps({"custom_id": "g", "prompt": "hi", "grammar": 'start: "a" "b"+', "max_tokens": 3}),
        json.dumps({"custom_id": "bad", "prompt": "hi", "regex": "a("}),
        json.dumps({"custom_id": "cut", "prompt": "hi", "json_schema": SCHEMA, "max_tokens": 3}),
        json.dumps({"custom_id": "o", "method": "POST", "url": "/v1/completions", "body": {
            "prompt": "hi", "max_tokens": 60, "seed": 1,
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA, "strict": True}}}}),
        json.dumps({"custom_id": "of", "method": "POST", "url": "/v1/completions", "body": {
            "prompt": "hi", "response_format": {"type": "xml"}}}),
    ]  # fmt: skip
    result = run(
        "batch", "--raw", "-q", "--tokens", "none", "--batch-size", "3", model=byte_model_dir, stdin="\n".join(lines)
    )
    assert result.returncode == 1, result.stderr  # some requests failed
    out = {r["custom_id"]: r for r in map(json.loads, result.stdout.splitlines())}
    jsonschema.validate(json.loads(out["s"]["text"]), SCHEMA)
    assert re.fullmatch("[0-9]{3}", out["r"]["text"]) and out["c"]["text"] in ("red", "green")
    assert re.fullmatch("ab+", out["g"]["text"])
    assert "regex: invalid regex: unclosed group" in out["bad"]["error"]["message"]
    assert (
        out["cut"]["error"]["message"]
        == "the output is incomplete under --json-schema after 3 tokens; raise --max-tokens"
    )
    assert "body.response_format" in out["of"]["error"]["message"]
    openai = run("batch", "--raw", "-q", "--format", "openai", model=byte_model_dir, stdin=lines[6])
    body = json.loads(openai.stdout)["response"]["body"]
    jsonschema.validate(json.loads(body["choices"][0]["text"]), SCHEMA)
