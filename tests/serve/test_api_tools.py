"""Tool calls on ``/v1/responses`` (the real ``openai`` client's ``responses``) and
``/v1/messages`` (the real ``anthropic`` client) against ``llmsample serve`` on the tiny byte
model with the Hermes template: function_call items and tool_use blocks, whole and streamed
(the clients parse the events strictly), required / named / auto / none, a history with tool
results, and 200 seeded answers at temperature 1.5 per API whose calls all validate."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import jsonschema
import pytest

from tests.serve.conftest import Server
from tests.serve.test_tools import SCHEMAS, UNTRUNCATED

if TYPE_CHECKING:
    import anthropic


RESPONSES_TOOLS = [{"type": "function", "name": name, "parameters": schema} for name, schema in SCHEMAS.items()]
MESSAGES_TOOLS = [{"name": name, "input_schema": schema} for name, schema in SCHEMAS.items()]
WILD = {"temperature": 1.5, "top_p": 1.0}


def respond(server: Server, **kwargs: Any) -> Any:
    client = server.client().with_options(timeout=600)
    extra = {"seed": 1, **kwargs.pop("extra_body", {})}
    kwargs = {"input": "weather?", "tools": RESPONSES_TOOLS, "max_output_tokens": 120, "parallel_tool_calls": False,
              **kwargs}  # fmt: skip
    return client.responses.create(model=client.models.list().data[0].id, extra_body=extra, **kwargs)


def anthropic_client(server: Server) -> anthropic.Anthropic:
    import anthropic

    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=600)


def message_body(server: Server, **kwargs: Any) -> dict[str, Any]:
    extra = {"seed": 1, **kwargs.pop("extra_body", {})}
    return {"model": server.client().models.list().data[0].id, "messages": [{"role": "user", "content": "weather?"}],
            "tools": MESSAGES_TOOLS, "max_tokens": 120, "extra_body": extra, **kwargs}  # fmt: skip


def check_arguments(name: str, arguments: dict[str, Any], wanted: str | None = None) -> None:
    assert name in SCHEMAS and (wanted is None or name == wanted)
    jsonschema.validate(arguments, SCHEMAS[name])


def check_function_call(item: Any, wanted: str | None = None) -> None:
    assert item.type == "function_call" and item.id.startswith("fc_") and item.call_id.startswith("call_")
    check_arguments(item.name, json.loads(item.arguments), wanted)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "add"}])
def test_responses_calls_whole_and_streamed(tools_server: Server, choice: Any) -> None:
    wanted = None if choice == "required" else "add"
    whole = respond(tools_server, tool_choice=choice, extra_body={"seed": 5})
    assert whole.status == "completed" and whole.output and whole.output_text == ""
    for item in whole.output:
        check_function_call(item, wanted)
    events = list(respond(tools_server, tool_choice=choice, extra_body={"seed": 5}, stream=True))
    assert [event.sequence_number for event in events] == list(range(len(events)))
    kinds = [event.type for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert set(kinds[3:-3]) == {"response.function_call_arguments.delta"}
    deltas = "".join(event.delta for event in events if event.type == "response.function_call_arguments.delta")
    [call] = whole.output
    assert deltas == events[-3].arguments == events[-2].item.arguments == call.arguments
    assert events[2].item.name == events[-2].item.name == call.name and events[2].item.arguments == ""
    assert events[-1].response.output[0].arguments == call.arguments


def test_responses_auto_and_none(tools_server: Server) -> None:
    for seed in range(4):
        whole = respond(tools_server, tool_choice="auto", max_output_tokens=40, extra_body={"seed": seed, **UNTRUNCATED},
                        **WILD)  # fmt: skip
        assert "<tool_call>" not in whole.output_text
        for item in whole.output:
            assert item.type in ("message", "function_call")
            if item.type == "function_call":
                check_function_call(item)
        events = list(respond(tools_server, tool_choice="auto", max_output_tokens=40, stream=True,
                              extra_body={"seed": seed, **UNTRUNCATED}, **WILD))  # fmt: skip
        assert _items(events[-1].response.output) == _items(whole.output)
        never = respond(tools_server, tool_choice="none", max_output_tokens=40, extra_body={"seed": seed, **UNTRUNCATED},
                        **WILD)  # fmt: skip
        assert [item.type for item in never.output] == ["message"]


def _items(output: list[Any]) -> list[str]:
    """Output items as what they say: a message's text, a call's name and arguments."""
    return [(item.name + item.arguments) if item.type == "function_call" else item.content[0].text for item in output]


def test_a_responses_history_with_tool_results_is_the_chat_prompt(tools_server: Server) -> None:
    items = [
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "21 degrees"},
    ]  # fmt: skip
    answer = respond(tools_server, input=items, tool_choice="auto", max_output_tokens=20)
    assert answer.status in ("completed", "incomplete")
    assert answer.usage.input_tokens == chat_prompt_tokens(tools_server)


def chat_prompt_tokens(server: Server) -> int:
    """What the same history costs on /v1/chat/completions (its rendering is tested in test_tools)."""
    history = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"},
    ]  # fmt: skip
    tools = [{"type": "function", "function": {"name": name, "parameters": schema}} for name, schema in SCHEMAS.items()]
    client = server.client()
    chat = client.chat.completions.create(
        model=client.models.list().data[0].id, messages=history, tools=tools, max_tokens=1  # type: ignore[arg-type]
    )
    return chat.usage.prompt_tokens


def check_tool_use(block: Any, wanted: str | None = None) -> None:
    assert block.type == "tool_use" and block.id.startswith("toolu_")
    check_arguments(block.name, block.input, wanted)


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_messages_tool_use_whole_and_streamed(tools_server: Server, choice: Any) -> None:
    wanted = choice.get("name")
    client = anthropic_client(tools_server)
    whole = client.messages.create(**message_body(tools_server, tool_choice=choice, extra_body={"seed": 7}))
    assert whole.stop_reason == "tool_use" and whole.content
    for block in whole.content:
        check_tool_use(block, wanted)
    with client.messages.stream(**message_body(tools_server, tool_choice=choice, extra_body={"seed": 7})) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in final.content] == [(b.name, b.input) for b in whole.content]
    assert "input_json" in kinds and kinds[-1] == "message_stop"  # the helper's event for each input_json_delta


def test_messages_auto_and_none(tools_server: Server) -> None:
    client = anthropic_client(tools_server)
    for seed in range(4):
        extra = {"seed": seed, **UNTRUNCATED}
        whole = client.messages.create(**message_body(tools_server, tool_choice={"type": "auto"}, max_tokens=40,
                                                      extra_body={**extra, **WILD}))  # fmt: skip
        for block in whole.content:
            assert block.type == "tool_use" or "<tool_call>" not in block.text
            if block.type == "tool_use":
                check_tool_use(block)
        assert (whole.stop_reason == "tool_use") == any(block.type == "tool_use" for block in whole.content)
        body = message_body(tools_server, tool_choice={"type": "auto"}, max_tokens=40, extra_body={**extra, **WILD})
        with client.messages.stream(**body) as stream:
            final = stream.get_final_message()
        assert [b.model_dump(exclude={"id"}) for b in final.content] == [
            b.model_dump(exclude={"id"}) for b in whole.content
        ]
        never = client.messages.create(**message_body(tools_server, tool_choice={"type": "none"}, max_tokens=40,
                                                      extra_body={**extra, **WILD}))  # fmt: skip
        assert [block.type for block in never.content] == ["text"] and never.stop_reason != "tool_use"


def test_a_messages_history_with_tool_results_is_the_chat_prompt(tools_server: Server) -> None:
    history = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris", "unit": "c"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "21 degrees"}]},
    ]  # fmt: skip
    client = anthropic_client(tools_server)
    answer = client.messages.create(**message_body(tools_server, messages=history, max_tokens=20))
    assert answer.usage.input_tokens + answer.usage.cache_read_input_tokens == chat_prompt_tokens(tools_server)


def _wild_calls(count: int, run: Callable[[int], list[tuple[str, dict[str, Any]]]]) -> None:
    """``count`` seeded answers (seeds 0.., 64 at a time: the server's rows): each is calls, each
    call validates."""
    with ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(run, range(count)))
    for calls in answers:
        assert calls
        for name, arguments in calls:
            check_arguments(name, arguments)


def test_two_hundred_wild_responses_calls_validate(tools_server: Server) -> None:
    def run(seed: int) -> list[tuple[str, dict[str, Any]]]:
        choice = "required" if seed % 2 else {"type": "function", "name": "add"}
        answer = respond(tools_server, tool_choice=choice, max_output_tokens=90, extra_body={"seed": seed, **UNTRUNCATED},
                         **WILD)  # fmt: skip
        assert answer.status == "completed", answer.output
        return [(item.name, json.loads(item.arguments)) for item in answer.output if item.type == "function_call"]

    _wild_calls(200, run)


def test_two_hundred_wild_messages_calls_validate(tools_server: Server) -> None:
    client = anthropic_client(tools_server)

    def run(seed: int) -> list[tuple[str, dict[str, Any]]]:
        choice = {"type": "any"} if seed % 2 else {"type": "tool", "name": "get_weather"}
        extra = {"seed": seed, **UNTRUNCATED, **WILD}
        body = message_body(tools_server, tool_choice=choice, max_tokens=90, extra_body=extra)
        answer = client.messages.create(**body)  # parallel calls: max_tokens may cut one after a complete one
        assert answer.stop_reason in ("tool_use", "max_tokens"), answer.content
        return [(block.name, block.input) for block in answer.content if block.type == "tool_use"]

    _wild_calls(200, run)


def test_count_tokens_counts_the_tools_as_the_message_renders_them(tools_server: Server) -> None:
    client = anthropic_client(tools_server)
    body = message_body(tools_server, max_tokens=1, extra_body={"seed": 1})
    counted = client.messages.count_tokens(model=body["model"], messages=body["messages"], tools=body["tools"])
    bare = client.messages.count_tokens(model=body["model"], messages=body["messages"])
    usage = client.messages.create(**body).usage
    assert counted.input_tokens == usage.input_tokens + usage.cache_read_input_tokens > bare.input_tokens
