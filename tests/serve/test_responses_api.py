"""``/v1/responses`` with the real ``openai`` client (``client.responses``): the answer the
chat completions path gives, in the Responses shapes, whole and as its typed events; structured
output through ``text.format``; bad requests as OpenAI's error objects."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import jsonschema
import pytest

from llmsample.serve.responses_api import chat_body
from tests.serve.conftest import Server, start_byte_chat_server

if TYPE_CHECKING:
    import openai


KEY = "sk-test-responses"
NO_EOS = {"1": -100}  # the byte model's <eos>: never drawn, so answers run to their limit


@pytest.fixture(scope="module")
def byte_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A byte-level model (it can spell JSON) with a chat template, behind an API key."""
    running = start_byte_chat_server(tmp_path_factory, "responses", "--api-key", KEY)
    yield running
    running.stop()


def client(server: Server) -> openai.OpenAI:
    return server.client(api_key=KEY)


def create(server: Server, **kwargs: Any) -> Any:
    model = client(server).models.list().data[0].id
    kwargs.setdefault("input", "hi")
    return client(server).responses.create(model=model, **kwargs)


def test_a_response_is_the_chat_answer_in_its_shape(byte_server: Server) -> None:
    extra = {"seed": 5, "logit_bias": NO_EOS}
    answer = create(byte_server, input="ab", instructions="be brief", max_output_tokens=6, extra_body=extra)
    model = client(byte_server).models.list().data[0].id
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"}]
    chat = client(byte_server).chat.completions.create(model=model, messages=messages, max_tokens=6, extra_body=extra)
    assert answer.object == "response" and answer.id.startswith("resp_")
    assert answer.output_text == chat.choices[0].message.content
    [item] = answer.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert answer.status == "incomplete" and answer.incomplete_details.reason == "max_output_tokens"
    assert answer.instructions == "be brief" and answer.max_output_tokens == 6
    assert answer.usage.input_tokens == chat.usage.prompt_tokens
    assert answer.usage.output_tokens == 6 and answer.usage.total_tokens == chat.usage.total_tokens


def test_a_repeated_input_is_read_from_the_prompt_cache(byte_server: Server) -> None:
    """OpenAI's usage: the cached tokens are counted among the input tokens, and said apart."""
    extra = {"seed": 7, "logit_bias": NO_EOS}
    first = create(byte_server, input="a cached input, long enough to see", max_output_tokens=3, extra_body=extra)
    again = create(byte_server, input="a cached input, long enough to see", max_output_tokens=3, extra_body=extra)
    assert again.usage.input_tokens == first.usage.input_tokens
    assert again.usage.input_tokens_details.cached_tokens >= again.usage.input_tokens - 1 > 0
    assert again.output_text == first.output_text


def test_items_in_as_messages(byte_server: Server) -> None:
    items = [
        {"role": "developer", "content": "be brief"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ab"}]},
    ]
    extra = {"seed": 5, "logit_bias": NO_EOS}
    by_items = create(byte_server, input=items, max_output_tokens=6, extra_body=extra)
    by_text = create(byte_server, input="ab", instructions="be brief", max_output_tokens=6, extra_body=extra)
    assert by_items.output_text == by_text.output_text


def test_the_stream_is_the_whole_response_in_typed_events(byte_server: Server) -> None:
    extra = {"seed": 9, "logit_bias": NO_EOS}
    whole = create(byte_server, max_output_tokens=8, extra_body=extra)
    events = list(create(byte_server, max_output_tokens=8, extra_body=extra, stream=True))
    kinds = [event.type for event in events]
    head = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    tail = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[:4] == head and kinds[-4:] == [*tail, "response.incomplete"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert deltas == whole.output_text == events[-4].text
    final = events[-1].response
    assert final.output_text == whole.output_text and final.usage.output_tokens == 8
    assert events[0].response.status == "in_progress" and events[0].response.id == final.id


def test_text_format_constrains_to_the_schema(byte_server: Server) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    fmt = {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}}
    answer = create(byte_server, text=fmt, max_output_tokens=60, extra_body={"seed": 2})
    assert answer.status == "completed"
    jsonschema.validate(json.loads(answer.output_text), schema)
    assert answer.text.format.type == "json_schema"


def test_our_records_where_asked(byte_server: Server) -> None:
    extra = {"seed": 1, "logit_bias": NO_EOS, "llmsample": {"tokens": "ids"}}
    answer = create(byte_server, max_output_tokens=4, extra_body=extra)
    records = answer.model_extra["llmsample"]
    assert len(records["tokens"]) == 4 and records["seed"] == 1
    events = list(create(byte_server, max_output_tokens=4, extra_body=extra, stream=True))
    deltas = [event for event in events if event.type == "response.output_text.delta"]
    assert sum(len(event.model_extra["llmsample"]["tokens"]) for event in deltas) == 4
    assert "llmsample" not in create(byte_server, max_output_tokens=2).model_extra


def test_a_schema_with_keywords_left_out_says_so(byte_server: Server) -> None:
    import openai

    unique = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    extra = {"seed": 3, "json_schema": unique, "llmsample": {"tokens": "ids"}}
    answer = create(byte_server, max_output_tokens=40, extra_body=extra)
    assert answer.model_extra["warnings"] == [
        "json_schema: not enforced (llguidance cannot): uniqueItems; --strict-schema refuses such a schema"
    ]
    assert answer.model_extra["llmsample"]["constraint_ignored"] == ["uniqueItems"]
    with pytest.raises(openai.BadRequestError) as refused:
        create(byte_server, max_output_tokens=4, extra_body={**extra, "strict_schema": True})
    assert refused.value.body["param"] == "json_schema" and "uniqueItems" in refused.value.body["message"]


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"input": None}, "input"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"extra_body": {"messages": [{"role": "user", "content": "x"}]}}, "messages"),
        ({"input": [{"type": "image_generation_call", "id": "x"}]}, "input"),
        ({"tools": [{"type": "function", "name": "", "parameters": {"type": "object"}}]}, "tools"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}}, "text.format.schema"),
    ],
)
def test_bad_requests_are_openai_errors(byte_server: Server, kwargs: dict[str, Any], param: str) -> None:
    import openai

    model = client(byte_server).models.list().data[0].id
    body = {"input": "hi", "max_output_tokens": 2, **kwargs}
    if body["input"] is None:
        del body["input"]
    with pytest.raises(openai.BadRequestError) as caught:
        client(byte_server).responses.create(model=model, **body)
    assert caught.value.body["param"] == param and caught.value.body["message"].startswith(param)


def test_ignored_keys_warn_and_the_key_is_needed(byte_server: Server) -> None:
    import openai

    answer = create(byte_server, max_output_tokens=2, metadata={"run": "1"}, reasoning={"effort": "low"}, store=False)
    assert [w.split(":")[0] for w in answer.model_extra["warnings"]] == ["metadata", "reasoning"]
    with pytest.raises(openai.AuthenticationError):
        byte_server.client(api_key="wrong").responses.create(model="m", input="hi")


def test_tool_items_become_chat_messages() -> None:
    """Function calls and their outputs as chat completions has them (what the chat path's tool
    support reads), tools and tool_choice as chat's."""
    body = {
        "input": [
            {"role": "user", "content": "weather?"},
            {"type": "function_call", "call_id": "c1", "name": "get", "arguments": '{"city": "Oslo"}'},
            {"type": "function_call", "call_id": "c2", "name": "get", "arguments": '{"city": "Bergen"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "rain"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "sun"}]},
            {"type": "reasoning", "id": "r1", "summary": []},
        ],
        "tools": [{"type": "function", "name": "get", "description": "d", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "get"},
        "max_output_tokens": 9,
    }
    chat, warnings = chat_body(body, strict=False)
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "get", "arguments": '{"city": "Oslo"}'}},
        {"id": "c2", "type": "function", "function": {"name": "get", "arguments": '{"city": "Bergen"}'}},
    ]
    assert chat["messages"] == [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
        {"role": "tool", "tool_call_id": "c2", "content": "sun"},
    ]
    tool = {"type": "function", "function": {"name": "get", "parameters": {"type": "object"}, "description": "d"}}
    assert chat["tools"] == [tool]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get"}}
    assert chat["max_tokens"] == 9 and warnings == []
