"""A tool call is never thrown away: when ``max_tokens`` ends an answer inside its calls, the
complete calls come back (chat's ``tool_calls``, the Responses API's ``function_call`` items,
the Messages API's ``tool_use`` blocks) with the length as the reason, and the call cut short is
left out. In process, on the engine and grammar path the server takes: 200 seeds at
temperature 1.5 with ``max_tokens`` drawn from 20-120 in the generic format (100 in Hermes'),
each answer read back as the server reads it and checked against its text read independently."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from llmsample.batch.tool_requests import ChatShape, message
from llmsample.events import Summary
from llmsample.sampling import tool_grammar as T
from llmsample.serve.tool_stream import Blocks, whole_blocks
from tests.serve.conftest import HERMES, TEMPLATE, Server
from tests.serve.test_tools import SCHEMAS, TOOLS, UNTRUNCATED, WILD, check_call, create, streamed


def answers(model_dir: Path, template: str, seeds: int) -> list[tuple[Summary, ChatShape]]:
    """``seeds`` seeded ``required`` answers at temperature 1.5, every truncation off, with
    ``max_tokens`` drawn from 20-120 (seeded), decoded 64 rows at a time as the server does."""
    from llmsample.batch.requests import read_requests
    from llmsample.batch.run import prompt_ids, request_config, shaped
    from llmsample.batch.settings import BatchSettings
    from llmsample.engine.continuous_batch import BatchItem, decode_batch
    from llmsample.events import RunStats
    from llmsample.models.loading import load_model
    from tests.conftest import with_chat_template

    lm = load_model(str(with_chat_template(model_dir, template)), "cpu", "float32")
    draw = random.Random(5)
    lines = []
    for seed in range(seeds):
        body = {"messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS, "tool_choice": "required",
                "max_tokens": draw.randint(20, 120), "seed": seed, "temperature": 1.5, "top_p": 1.0}  # fmt: skip
        lines.append(json.dumps({"custom_id": str(seed), "method": "POST", "url": "/v1/chat/completions", "body": body}))
    settings, items, shapes = BatchSettings(fmt="openai"), [], []
    for key, request in enumerate(read_requests(lines)):
        preset, cfg = request_config(request, settings)
        cfg = dataclasses.replace(cfg, top_k=0, min_p=0.0, typical_p=1.0)  # every truncation off
        ids = prompt_ids(lm, request, settings, cfg.max_tokens)
        cfg, shape = shaped(lm, request, cfg, ids)
        items.append(BatchItem(key, ids, cfg, RunStats(lm.name, preset, cfg.seed)))
        shapes.append(shape)
    summaries = {key: record for key, record in decode_batch(lm, items, 64) if isinstance(record, Summary)}
    return [(summaries[key], shapes[key]) for key in range(seeds)]


def complete_calls(text: str, fmt: T.CallFormat) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    """The calls whose JSON the model finished, read apart from the server's reading (the text
    after the trigger, one JSON object after another, apart by the format's separators), and the
    text after the last of them."""
    assert text.startswith(fmt.trigger), text
    decoder, pos, found, rest = json.JSONDecoder(), len(fmt.trigger), [], text
    while True:
        try:
            call, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return found, rest
        found.append((call["name"], call[fmt.key]))
        rest, pos = text[end:], end + len(fmt.close)
        if not text.startswith((fmt.sep or "\0") + fmt.open, pos):
            return found, rest
        pos += len((fmt.sep or "") + fmt.open)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.constraints.conftest import make_byte_model

    return make_byte_model(tmp_path_factory.mktemp("byte-cut"))


@pytest.mark.parametrize(("template", "seeds"), [(TEMPLATE, 200), (HERMES, 100)], ids=["generic", "hermes"])
def test_every_complete_call_comes_back(model_dir: Path, template: str, seeds: int) -> None:
    cut = kept = 0
    for summary, shape in answers(model_dir, template, seeds):
        assert shape.fmt is not None
        expected, rest = complete_calls(summary.text, shape.fmt)
        answer, called = message(summary.text, shape)
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in answer.get("tool_calls", [])]
        assert calls == expected, summary.text
        for name, arguments in calls:
            jsonschema.validate(arguments, SCHEMAS[name])
        ended = summary.stop_reason == "eos"
        # finish_reason tool_calls when no call was cut or begun after the last (the length may cut
        # the closing text: the calls are whole), else length
        closing = bool(expected) and (shape.fmt.close + shape.fmt.suffix).startswith(rest)
        assert called == (ended or closing), summary.text
        if expected:
            assert answer["content"] is None  # required: no text before the calls
        else:
            assert not ended and answer["content"] == summary.text  # a call cut short alone is no call
        blocks, block_called = whole_blocks(summary.text, shape)  # the Responses and Messages answers
        assert [(b.name, json.loads(b.text)) for b in blocks if b.kind == "call"] == expected
        assert block_called == called
        cut += not ended
        kept += bool(expected) and not ended
    assert cut > seeds // 10 and kept > seeds // 20  # the draws cut many answers, many after a complete call


def test_a_cut_stream_sends_no_text_after_its_calls() -> None:
    """A stream cut inside its third call: the first two are whole, no content is sent, and the
    third is closed as incomplete (its start has gone out)."""
    fmt = T.GENERIC
    text = fmt.prefix + ", ".join(['{"name": "add", "arguments": {"a": 1, "b": true}}'] * 2) + ', {"name": "add", "ar'
    text += 'guments": {"a": 4'
    blocks = Blocks(ChatShape(fmt))
    steps = [step for char in text for step in blocks.feed(char)] + blocks.feed("", final=True)
    assert not any(blocks.blocks[index].kind == "content" for _, index, _ in steps)
    assert [b.complete for b in blocks.blocks] == [True, True, False] and not blocks.called
    whole, called = whole_blocks(text, ChatShape(fmt))
    assert [json.loads(b.text) for b in whole] == [{"a": 1, "b": True}] * 2 and not called


CUT = {"tool_choice": {"type": "function", "function": {"name": "add"}}, "parallel_tool_calls": True,
       "max_tokens": 120, "seed": 0, **WILD}  # fmt: skip
"""The byte model goes on calling ``add`` past 120 tokens: cut inside its second call."""


def test_a_cut_answer_keeps_its_complete_calls_on_every_api(tools_server: Server) -> None:
    from tests.serve.test_api_tools import MESSAGES_TOOLS, RESPONSES_TOOLS, anthropic_client

    choice = create(tools_server, **CUT).choices[0]
    assert choice.finish_reason == "length" and choice.message.content is None and choice.message.tool_calls
    for call in choice.message.tool_calls:
        check_call(call, "add")
    arguments = [call.function.arguments for call in choice.message.tool_calls]
    content, calls, reason = streamed(tools_server, **CUT)
    assert reason == "length" and content == ""  # the stream also sent the cut call's start
    assert [calls[i]["arguments"] for i in range(len(arguments))] == arguments

    client = tools_server.client()
    body = {"model": client.models.list().data[0].id, "input": "weather?", "tools": RESPONSES_TOOLS,
            "tool_choice": {"type": "function", "name": "add"}, "max_output_tokens": 120, "temperature": 1.5,
            "top_p": 1.0, "extra_body": {"seed": 0, **UNTRUNCATED}}  # fmt: skip
    whole = client.responses.create(**body)
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert [(item.type, item.status, item.arguments) for item in whole.output] == [
        ("function_call", "completed", each) for each in arguments
    ]
    final = list(client.responses.create(**body, stream=True))[-1].response
    assert final.status == "incomplete" and [item.arguments for item in final.output[: len(arguments)]] == arguments
    assert [item.status for item in final.output[len(arguments) :]] == ["incomplete"]  # the cut call, as sent

    talk = anthropic_client(tools_server)
    body = {"model": body["model"], "messages": [{"role": "user", "content": "weather?"}], "tools": MESSAGES_TOOLS,
            "tool_choice": {"type": "tool", "name": "add"}, "max_tokens": 120,
            "extra_body": {"seed": 0, **UNTRUNCATED, **WILD}}  # fmt: skip
    message = talk.messages.create(**body)
    assert message.stop_reason == "max_tokens"
    assert [(block.type, block.input) for block in message.content] == [("tool_use", json.loads(a)) for a in arguments]
    with talk.messages.stream(**body) as stream:
        events = list(stream)
    assert events[-2].delta.stop_reason == "max_tokens"
