"""A row's grammar that fails fails that row alone: one past llguidance's parser limits after its
first token (which no check of the grammar alone can see) ends with its own failure while the
rows beside it decode what they decode alone, plain or drafting; a grammar that fails at once
is refused when it compiles, a batch line's error record, before it joins the loop."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llmsample.engine.continuous_batch import BatchItem, RowFailed, decode_batch
from llmsample.engine.loop import generate, run_to_end
from llmsample.engine.prompt import encode_prompt
from llmsample.engine.speculative import NgramDrafter
from llmsample.events import RunStats, Summary
from llmsample.sampling import constraint as constraints
from llmsample.sampling.config import SamplingConfig
from tests.conftest import cli_env
from tests.serve.conftest import NO_EOS, start_server


def one_key(i: int) -> dict:
    return {"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]}


WIDE = {"anyOf": [one_key(i) for i in range(3000)]}  # 3000 items in the parser's row after "{"

# Fine at its first token; scanning the "b" after it puts 2002 items in one row of the parser.
LATE = constraints.Constraint("grammar", 'start: "x" (' + " | ".join(f'"b{i}"' for i in range(2001)) + ")", "grammar")


@pytest.mark.parametrize("drafting", [False, True])
def test_a_grammar_failing_mid_output_fails_its_row_alone(byte_lm, drafting: bool) -> None:
    prompt = encode_prompt(byte_lm, "Copy: abc abc abc", raw=True)[0].tolist()
    drafter = (lambda: NgramDrafter(byte_lm.model.config.vocab_size, byte_lm.sample_device, 1, 4)) if drafting else None
    others = [SamplingConfig(temperature=0.0, max_tokens=12), SamplingConfig(temperature=0.0, max_tokens=12,
              constraint=constraints.regex("[a-c ]{4,12}"))]  # fmt: skip
    configs = [others[0], SamplingConfig(temperature=0.0, max_tokens=12, constraint=LATE), others[1]]
    items = [BatchItem(i, prompt, cfg, RunStats("b", "t", 0), drafter, 3 if drafter else None)
             for i, cfg in enumerate(configs)]  # fmt: skip
    ends = {key: record for key, record in decode_batch(byte_lm, items, 3) if not hasattr(record, "token_id")}
    assert isinstance(ends[1], RowFailed)
    assert ends[1].message.startswith("grammar: llguidance failed (Current row has 2002 items; max is 2000")
    assert "<state>" not in ends[1].message and "\n" not in ends[1].message
    for key, cfg in ((0, others[0]), (2, others[1])):
        assert isinstance(ends[key], Summary), ends[key]
        alone = run_to_end(generate(byte_lm, torch.tensor([prompt]), cfg, RunStats("b", "t", 0)))[1]
        assert ends[key].text == alone.text


def test_a_batch_line_whose_grammar_cannot_run_is_its_error_record(byte_model_dir: Path, tmp_path: Path) -> None:
    """2001 choices decode; a grammar of 2001 alternatives is that line's error, the others are
    written, and a rerun (resume) writes nothing more and fails the same line the same way."""
    lines = [
        {"custom_id": "a", "prompt": "hi", "max_tokens": 3},
        {"custom_id": "many", "prompt": "hi", "choice": [f"t{i}" for i in range(2001)], "max_tokens": 8},
        {"custom_id": "wide", "prompt": "hi", "grammar": "start: " + " | ".join(f'"t{i}"' for i in range(2001))},
        {"custom_id": "z", "prompt": "hi", "max_tokens": 3},
    ]
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    command = [sys.executable, "-m", "llmsample", "batch", "-m", str(byte_model_dir), "--device", "cpu", "--raw",
               "-q", "--tokens", "none", "-o", str(out), str(source)]  # fmt: skip
    for _ in range(2):
        result = subprocess.run(command, capture_output=True, text=True, env=cli_env(), timeout=300)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        records = {r["custom_id"]: r for r in map(json.loads, out.read_text().splitlines())}
        assert list(records) == ["a", "many", "wide", "z"]
        assert records["many"]["text"] in {f"t{i}" for i in range(2001)}
        assert records["wide"]["error"]["message"].startswith("grammar: too complex for llguidance (Current row")


def test_a_constraint_the_tokenizer_cannot_take_fails_its_row_alone(tiny_lm) -> None:
    """The word-level tiny model's tokenizer has no decoder llguidance knows: a constrained row
    on it fails (a user error, as ``generate`` reports it) and the plain row beside it decodes."""
    prompt = encode_prompt(tiny_lm, "w3 w4", raw=True)[0].tolist()
    plain = SamplingConfig(temperature=0.0, max_tokens=6)
    json_cfg = SamplingConfig(temperature=0.0, max_tokens=6, constraint=constraints.any_json())
    for order in ([json_cfg, plain], [plain, json_cfg]):
        items = [BatchItem(i, prompt, cfg, RunStats("t", "t", 0)) for i, cfg in enumerate(order)]
        ends = {key: r for key, r in decode_batch(tiny_lm, items, 2) if not hasattr(r, "token_id")}
        failed, done = (ends[0], ends[1]) if order[0] is json_cfg else (ends[1], ends[0])
        assert isinstance(failed, RowFailed) and failed.user_error
        assert "--json: llguidance cannot read this model's tokenizer" in failed.message
        alone = run_to_end(generate(tiny_lm, torch.tensor([prompt]), plain, RunStats("t", "t", 0)))[1]
        assert isinstance(done, Summary) and done.text == alone.text


def test_a_request_whose_grammar_fails_leaves_the_other_streams_alone(byte_model_dir: Path, tmp_path: Path) -> None:
    """Through the server, while a stream of 150 tokens runs: a schema that fails at its first
    token is a 400 before it joins the loop; one that fails inside the output (at the wide
    ``anyOf`` after ``{"b": true, "a": ``) fails that request; the stream ends at its length."""
    import openai

    server = start_server(byte_model_dir, tmp_path / "stderr", "--batch-size", "4")
    try:
        client, model = server.client(), str(byte_model_dir)

        def schema(value: dict) -> dict:
            return {"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": value}}}

        stream = client.completions.create(model=model, prompt="hi", max_tokens=150, logit_bias=NO_EOS, stream=True)
        chunks = [next(iter(stream))]
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model=model, prompt="hi", max_tokens=20, extra_body=schema(WIDE))
        assert "too complex for llguidance (Current row has 3000 items" in refused.value.message
        with pytest.raises(openai.BadRequestError) as unfinishable:  # the request's own fault: 400, not 500
            client.completions.create(model=model, prompt="hi", max_tokens=20, extra_body={"choice": ["yes"], "ban": ["s"]})
        assert "cannot be completed" in unfinishable.value.message
        inner = {"type": "object", "properties": {"b": {"type": "boolean"}, "a": WIDE}, "required": ["b", "a"]}
        with pytest.raises(openai.InternalServerError) as failed:
            client.completions.create(model=model, prompt="hi", max_tokens=20, extra_body=schema(inner))
        assert "llguidance failed (Current row has 3000 items" in failed.value.message
        chunks += list(stream)
        assert chunks[-1].choices[0].finish_reason == "length"
        assert sum(len(c.choices[0].text) for c in chunks) >= 150 // 4  # bytes; its tokens' text came
    finally:
        assert server.stop() == 0
