"""Anthropic's ``/v1/messages`` and ``/v1/messages/count_tokens`` with the real ``anthropic``
client: the answer the chat completions path gives, in Anthropic's shapes, whole and as its
events; stop sequences; ``x-api-key``; bad requests as Anthropic's error objects."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from llmsample.serve.api_errors import ApiError
from llmsample.serve.messages_api import chat_body
from tests.serve.conftest import Server, start_byte_chat_server

KEY = "sk-test-messages"
NO_EOS = {"1": -100}  # the byte model's <eos>: never drawn, so answers run to their limit
USER = [{"role": "user", "content": "ab"}]


@pytest.fixture(scope="module")
def byte_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A byte-level model with a chat template, behind an API key."""
    running = start_byte_chat_server(tmp_path_factory, "messages", "--api-key", KEY)
    yield running
    running.stop()


def client(server: Server, key: str = KEY) -> Any:
    import anthropic

    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0, timeout=60)


def model(server: Server) -> str:
    return server.client(api_key=KEY).models.list().data[0].id


def create(server: Server, **kwargs: Any) -> Any:
    kwargs.setdefault("messages", USER)
    kwargs.setdefault("max_tokens", 6)
    return client(server).messages.create(model=model(server), **kwargs)


def prompt_tokens(message) -> int:
    """The whole prompt: read past the cache and read from it."""
    return message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)


def test_a_message_is_the_chat_answer_in_its_shape(byte_server: Server) -> None:
    extra = {"seed": 4, "logit_bias": NO_EOS}
    answer = create(byte_server, system="be brief", extra_body=extra)
    messages = [{"role": "system", "content": "be brief"}, *USER]
    chat = byte_server.client(api_key=KEY).chat.completions.create(
        model=model(byte_server), messages=messages, max_tokens=6, extra_body=extra
    )
    assert answer.type == "message" and answer.role == "assistant" and answer.id.startswith("msg_")
    [block] = answer.content
    assert block.type == "text" and block.text == chat.choices[0].message.content
    assert answer.stop_reason == "max_tokens" and answer.stop_sequence is None
    assert prompt_tokens(answer) == chat.usage.prompt_tokens and answer.usage.output_tokens == 6
    blocks = [{"type": "text", "text": "be brief"}]
    assert create(byte_server, system=blocks, extra_body=extra).content[0].text == block.text


def test_the_stream_is_the_whole_message_in_events(byte_server: Server) -> None:
    extra = {"seed": 8, "logit_bias": NO_EOS}
    whole = create(byte_server, max_tokens=7, extra_body=extra)
    with client(byte_server).messages.stream(
        model=model(byte_server), messages=USER, max_tokens=7, extra_body=extra
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    raw = [event.type for event in create(byte_server, max_tokens=7, extra_body=extra, stream=True)]
    assert raw[:2] == ["message_start", "content_block_start"]
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(raw[2:-3]) == {"content_block_delta"}
    assert "content_block_delta" in kinds and kinds[-1] == "message_stop"
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 7
    assert prompt_tokens(final) == prompt_tokens(whole)


def test_stop_sequences_end_the_text_and_are_named(byte_server: Server) -> None:
    extra = {"seed": 3, "logit_bias": NO_EOS}
    text = create(byte_server, max_tokens=12, extra_body=extra).content[0].text
    stop = text[5:7]
    cut = text[: text.index(stop)]
    answer = create(byte_server, max_tokens=12, stop_sequences=["\x00never", stop], extra_body=extra)
    assert answer.content[0].text == cut
    assert answer.stop_reason == "stop_sequence" and answer.stop_sequence == stop
    with client(byte_server).messages.stream(
        model=model(byte_server), messages=USER, max_tokens=12, stop_sequences=[stop], extra_body=extra
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop and final.content[0].text == cut


def test_count_tokens_is_what_the_prompt_costs(byte_server: Server) -> None:
    counted = client(byte_server).messages.count_tokens(model=model(byte_server), messages=USER, system="be brief")
    answer = create(byte_server, system="be brief", max_tokens=1)
    assert counted.input_tokens == prompt_tokens(answer) > 0


def test_a_repeated_prompt_is_read_from_the_prompt_cache(byte_server: Server) -> None:
    """Anthropic's usage: input_tokens are what was read past the cache, cache_read_input_tokens
    what the server's prompt cache held (a repeat of a prompt finds all but its last token)."""
    extra = {"seed": 2, "logit_bias": NO_EOS}
    first = create(byte_server, system="a cached prefix, long enough to see", max_tokens=3, extra_body=extra)
    again = create(byte_server, system="a cached prefix, long enough to see", max_tokens=3, extra_body=extra)
    assert prompt_tokens(again) == prompt_tokens(first)
    assert again.usage.cache_read_input_tokens >= prompt_tokens(again) - 1 > 0
    assert again.usage.cache_creation_input_tokens == 0
    assert again.content[0].text == first.content[0].text


def test_our_records_where_asked(byte_server: Server) -> None:
    extra = {"seed": 1, "logit_bias": NO_EOS, "llmsample": {"tokens": "ids"}}
    answer = create(byte_server, max_tokens=4, extra_body=extra)
    assert len(answer.model_extra["llmsample"]["tokens"]) == 4 and answer.model_extra["llmsample"]["seed"] == 1
    events = list(create(byte_server, max_tokens=4, extra_body=extra, stream=True))
    deltas = [event for event in events if event.type == "content_block_delta"]
    assert sum(len(event.model_extra["llmsample"]["tokens"]) for event in deltas) == 4


@pytest.mark.parametrize(
    ("kwargs", "status", "kind", "start"),
    [
        ({"extra_body": {"max_tokens": None}}, 400, "invalid_request_error", "max_tokens"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400, "invalid_request_error", "messages[0].role"),
        ({"messages": [{"role": "user", "content": [{"type": "image"}]}]}, 400, "invalid_request_error", "messages"),
        ({"stop_sequences": "x"}, 400, "invalid_request_error", "stop_sequences"),
        ({"extra_body": {"temperature": -1}}, 400, "invalid_request_error", "temperature"),
        ({"tools": [{"name": "a b", "input_schema": {"type": "object"}}]}, 400, "invalid_request_error", "tools"),
        ({"model": "other"}, 404, "not_found_error", "model"),
    ],
)
def test_bad_requests_are_anthropic_errors(
    byte_server: Server, kwargs: dict[str, Any], status: int, kind: str, start: str
) -> None:
    import anthropic

    body = {"model": model(byte_server), "messages": USER, "max_tokens": 2, **kwargs}
    with pytest.raises(anthropic.APIStatusError) as caught:
        client(byte_server).messages.create(**body)
    assert caught.value.status_code == status
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == kind
    assert caught.value.body["error"]["message"].startswith(start)


def test_the_key_comes_as_x_api_key_or_bearer(byte_server: Server) -> None:
    """Anthropic's docs and older clients send ``x-api-key``; this client sends ``Authorization: Bearer``."""
    import anthropic
    import httpx

    body = {"model": model(byte_server), "messages": USER, "max_tokens": 1}
    for key, status in ((KEY, 200), ("wrong", 401)):
        answer = httpx.post(byte_server.url + "/v1/messages", json=body, headers={"x-api-key": key}, timeout=60)
        assert answer.status_code == status
    assert answer.json() == {"type": "error", "error": {"type": "authentication_error", "message": "incorrect API key"}}
    with pytest.raises(anthropic.AuthenticationError) as caught:
        client(byte_server, key="wrong").messages.create(model="m", messages=USER, max_tokens=1)
    assert caught.value.body["error"]["type"] == "authentication_error"
    assert create(byte_server, max_tokens=1).usage.output_tokens == 1


def test_tool_blocks_become_chat_messages() -> None:
    """``tool_use`` and ``tool_result`` blocks as chat completions has them (what the chat path's
    tool support reads); tools and tool_choice as chat's."""
    body = {
        "model": "m",
        "max_tokens": 5,
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "t1", "name": "get", "input": {"city": "Oslo"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "rain"}]},
                    {"type": "text", "text": "and tomorrow?"},
                ],
            },
        ],
        "tools": [{"name": "get", "description": "d", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any"},
        "stop_sequences": ["\n\n"],
    }
    chat, warnings = chat_body(body, strict=False)
    call = {"id": "t1", "type": "function", "function": {"name": "get", "arguments": '{"city": "Oslo"}'}}
    assert chat["messages"] == [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "t1", "content": "rain"},
        {"role": "user", "content": "and tomorrow?"},
    ]
    tool = {"type": "function", "function": {"name": "get", "parameters": {"type": "object"}, "description": "d"}}
    assert chat["tools"] == [tool] and chat["tool_choice"] == "required"
    assert chat["stop"] == ["\n\n"] and chat["max_tokens"] == 5 and warnings == []


@pytest.mark.parametrize(
    ("tool", "said"),
    [
        ({"name": "a b", "input_schema": {}}, "tools[0].name: expected letters, digits"),
        ({"name": "get", "input_schema": "object"}, "tools[0].input_schema: expected a JSON Schema object"),
        ({"name": "get", "input_schema": {}, "description": 3}, "tools[0].description: expected a string"),
    ],
)
def test_a_bad_tool_is_said_in_anthropics_terms(tool: dict, said: str) -> None:
    """Issue 58: the error named chat completions' ``function.parameters``, a shape this API's
    callers never wrote."""
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    with pytest.raises(ApiError) as caught:
        chat_body(body, strict=False)
    assert caught.value.status == 400 and said in str(caught.value) and "function" not in str(caught.value)


def test_a_tool_offered_twice_is_refused() -> None:
    tools = [{"name": "get", "input_schema": {}}, {"name": "get", "input_schema": {}}]
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    with pytest.raises(ApiError, match=r"tools\[1\]\.name: 'get' is offered twice"):
        chat_body(body, strict=False)


@pytest.mark.parametrize("budget", [-1, 0, 2.5, "8", True])
def test_a_thinking_budget_that_is_no_positive_integer_is_refused(budget: object) -> None:
    """As chat completions refuses such a ``reasoning_budget`` (it was ignored with a warning)."""
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
            "thinking": {"type": "enabled", "budget_tokens": budget}}  # fmt: skip
    with pytest.raises(ApiError, match=r"thinking\.budget_tokens: expected a positive integer") as caught:
        chat_body(body, strict=False)
    assert caught.value.status == 400
