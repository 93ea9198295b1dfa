"""Tool calls and reasoning through the real ``openai`` client against ``llmsample serve`` on a
tiny byte-level model (it can spell any text) whose chat template renders tools in the
Hermes/Qwen ``<tool_call>`` format; a second template opens a ``<think>`` block."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from tests.serve.conftest import Server, start_byte_chat_server

THINKING = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant: <think>\n"

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 6}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "boolean"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
TOOLS = [{"type": "function", "function": {"name": name, "parameters": schema}} for name, schema in SCHEMAS.items()]
MESSAGES = [{"role": "user", "content": "weather?"}]
UNTRUNCATED = {"top_k": 0, "min_p": 0.0, "typical_p": 1.0}  # with top_p 1: every truncation off
WILD = {"temperature": 1.5, "top_p": 1.0, "extra_body": UNTRUNCATED}


def create(server: Server, **kwargs: Any) -> Any:
    client = server.client().with_options(timeout=600)
    kwargs = {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 120, "seed": 1, "parallel_tool_calls": False,
              **kwargs}  # fmt: skip
    return client.chat.completions.create(model=client.models.list().data[0].id, **kwargs)


def check_call(call: Any, name: str | None = None) -> None:
    """A call OpenAI's way: an id, a function offered, arguments that validate against its schema."""
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name in SCHEMAS and (name is None or call.function.name == name)
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_required_and_named_calls_whole(tools_server: Server) -> None:
    answer = create(tools_server, tool_choice="required", extra_body={"llmsample": {"tokens": "ids"}})
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    for call in choice.message.tool_calls:
        check_call(call)
    assert choice.model_extra["llmsample"]["tool_call_token"] == 0  # the grammar holds from the first token
    named = create(tools_server, tool_choice={"type": "function", "function": {"name": "add"}}, seed=2)
    assert named.choices[0].finish_reason == "tool_calls"
    for call in named.choices[0].message.tool_calls:
        check_call(call, "add")


def streamed(server: Server, **kwargs: Any) -> tuple[str, dict[int, dict[str, str]], str | None]:
    """The content, the calls (index: id, name, arguments) and finish reason a stream adds up to."""
    content, calls, reason = "", {}, None
    for chunk in create(server, stream=True, **kwargs):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for part in delta.tool_calls or []:
            call = calls.setdefault(part.index, {"id": part.id, "name": part.function.name, "arguments": ""})
            call["arguments"] += part.function.arguments or ""
        reason = chunk.choices[0].finish_reason or reason
    return content, calls, reason


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_calls_add_up_to_the_whole_answer(tools_server: Server, choice: Any) -> None:
    whole = create(tools_server, tool_choice=choice, seed=5).choices[0]
    content, calls, reason = streamed(tools_server, tool_choice=choice, seed=5)
    assert reason == whole.finish_reason == "tool_calls" and content == ""
    got = [(call["name"], call["arguments"]) for _, call in sorted(calls.items())]
    assert got == [(call.function.name, call.function.arguments) for call in whole.message.tool_calls]
    assert all(call["id"].startswith("call_") for call in calls.values())


def test_parallel_calls(tools_server: Server) -> None:
    """A random model goes on calling as often as it ends: answers cut short keep their complete
    calls (tests/serve/test_cut_calls.py)."""
    answer = create(tools_server, tool_choice="required", n=8, parallel_tool_calls=True, max_tokens=200)
    assert any(choice.finish_reason == "tool_calls" for choice in answer.choices)
    assert any(len(choice.message.tool_calls or []) > 1 for choice in answer.choices)
    for choice in answer.choices:
        for call in choice.message.tool_calls or []:
            check_call(call)


def test_two_hundred_wild_calls_all_parse_and_validate(tools_server: Server) -> None:
    """200 seeded answers at temperature 1.5, every truncation off: each call parses and its
    arguments validate (13 requests of 16 choices at once, seeds 0..207)."""
    from concurrent.futures import ThreadPoolExecutor

    def run(first: int) -> Any:
        choice = "required" if first % 32 else {"type": "function", "function": {"name": "add"}}
        return create(tools_server, tool_choice=choice, seed=first, n=16, max_tokens=90, **WILD)

    with ThreadPoolExecutor(13) as pool:
        answers = list(pool.map(run, range(0, 208, 16)))
    calls = 0
    for each in (choice for answer in answers for choice in answer.choices):
        assert each.finish_reason == "tool_calls", each.message.content
        for call in each.message.tool_calls:
            check_call(call)
            calls += 1
    assert calls == 208


def test_auto_answers_are_text_or_valid_calls(tools_server: Server) -> None:
    answer = create(tools_server, tool_choice="auto", n=8, max_tokens=40, **WILD)
    for choice in answer.choices:
        assert "<tool_call>" not in (choice.message.content or "")  # free text cannot hold the trigger
        for call in choice.message.tool_calls or []:
            check_call(call)
    content, _, reason = streamed(tools_server, tool_choice="auto", max_tokens=40, **WILD)
    assert content == answer.choices[0].message.content and reason == answer.choices[0].finish_reason


def test_tool_choice_none_never_calls(tools_server: Server) -> None:
    import openai

    answer = create(tools_server, tool_choice="none", n=8, max_tokens=40, **WILD)
    assert all(c.message.tool_calls is None and c.finish_reason != "tool_calls" for c in answer.choices)
    bare = create(tools_server, tools=openai.NOT_GIVEN, parallel_tool_calls=openai.NOT_GIVEN, max_tokens=40)
    assert answer.usage.prompt_tokens == bare.usage.prompt_tokens  # no tools in the prompt


def test_a_history_with_tool_results_continues(tools_server: Server) -> None:
    from transformers import AutoTokenizer

    history = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"},
    ]  # fmt: skip
    answer = create(tools_server, messages=history, tool_choice="auto", max_tokens=20)
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    tokenizer = AutoTokenizer.from_pretrained(tools_server.client().models.list().data[0].id)
    rendered = [*history[:1], {**history[1], "tool_calls": [{**history[1]["tool_calls"][0], "function": {
        "name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]}, history[2]]  # fmt: skip
    text = tokenizer.apply_chat_template(rendered, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}' in text
    assert "<tool_response>\n21 degrees" in text
    assert answer.usage.prompt_tokens == len(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools"),
        ({"tool_choice": "required", "extra_body": {"regex": "a+"}}, "tools"),
    ],
)
def test_bad_tools_are_a_400(tools_server: Server, body: dict[str, Any], param: str) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as caught:
        create(tools_server, **body)
    assert param in caught.value.body["message"]


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_byte_chat_server(tmp_path_factory, "thinking", "--batch-size", "4", template=THINKING)
    yield running
    running.stop()


def test_reasoning_apart_from_content_whole_and_streamed(thinking_server: Server) -> None:
    """The template opens the block; a regex makes the model close it (a random model would not)."""
    import openai

    kwargs = {"tools": openai.NOT_GIVEN, "parallel_tool_calls": openai.NOT_GIVEN, "max_tokens": 40, "seed": 3, "extra_body": {"regex": "[a-z]{3,6}</think>\n\n[a-z]{2,5}"}}
    message = create(thinking_server, **kwargs).choices[0].message
    reasoning = message.model_extra["reasoning_content"]
    assert 3 <= len(reasoning) <= 6 and reasoning.isalpha() and "<" not in message.content
    assert 2 <= len(message.content) <= 5 and message.content.isalpha()
    parts = {"reasoning_content": "", "content": ""}
    for chunk in create(thinking_server, stream=True, **kwargs):
        delta = chunk.choices[0].delta if chunk.choices else None
        for key in parts:
            parts[key] += ((delta.model_extra or {}).get(key) if key != "content" else delta.content) or "" if delta else ""
    assert parts == {"reasoning_content": reasoning, "content": message.content}


def test_the_reasoning_budget_closes_the_block_by_force_whole_and_streamed(thinking_server: Server) -> None:
    """A random model never closes the block: at 4 tokens the budget writes ``</think>``, each of
    its tokens forced in the records; the stream adds up to the whole answer."""
    import openai

    extra = {"reasoning_budget": 4, "logit_bias": {"1": -100}, "llmsample": {"tokens": "full"}}
    kwargs = {"tools": openai.NOT_GIVEN, "parallel_tool_calls": openai.NOT_GIVEN, "max_tokens": 20, "seed": 4,
              "extra_body": extra}  # fmt: skip
    choice = create(thinking_server, **kwargs).choices[0]
    records = choice.model_extra["llmsample"]["tokens"]
    assert [r["source"] for r in records[4:12]] == ["forced"] * 8
    assert all(r["source"] != "forced" for r in records[:4] + records[12:])
    reasoning = choice.message.model_extra["reasoning_content"]
    assert "".join(r["text"] for r in records[:12]) == reasoning + "</think>"  # a split character's text comes late
    assert "</think>" not in choice.message.content
    parts = {"reasoning_content": "", "content": ""}
    for chunk in create(thinking_server, stream=True, **kwargs):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is not None:
            parts["reasoning_content"] += (delta.model_extra or {}).get("reasoning_content") or ""
            parts["content"] += delta.content or ""
    assert parts == {"reasoning_content": reasoning, "content": choice.message.content}


def test_reasoning_on_responses_and_messages_whole_and_streamed(thinking_server: Server) -> None:
    """A reasoning item / a thinking block (Anthropic's ``budget_tokens`` is the budget) before
    the answer's text, the same streamed (Anthropic's accumulator reads the events)."""
    import anthropic

    client = thinking_server.client()
    model = client.models.list().data[0].id
    extra = {"seed": 6, "logit_bias": {"1": -100}, "reasoning_budget": 3}
    whole = client.responses.create(model=model, input="hi", max_output_tokens=16, extra_body=extra)
    reasoning, message = whole.output
    assert reasoning.type == "reasoning" and message.type == "message" and len(reasoning.content[0].text) <= 3
    events = list(client.responses.create(model=model, input="hi", max_output_tokens=16, extra_body=extra, stream=True))
    final = events[-1].response  # response.incomplete: the accumulator wants a completed one
    assert "response.reasoning_text.delta" in {event.type for event in events}
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == reasoning.content[0].text and final.output_text == whole.output_text
    talk = anthropic.Anthropic(base_url=thinking_server.url, api_key="none", max_retries=0, timeout=60)
    body = {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}],
            "thinking": {"type": "enabled", "budget_tokens": 3}, "extra_body": {"seed": 6, "logit_bias": {"1": -100}}}  # fmt: skip
    answer = talk.messages.create(**body)
    assert [block.type for block in answer.content] == ["thinking", "text"]
    assert answer.content[0].thinking == reasoning.content[0].text and answer.content[1].text == whole.output_text
    with talk.messages.stream(**body) as stream:
        streamed = stream.get_final_message()
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in answer.content]
