"""Tool calls' grammar and their text read back (llmsample.sampling.tool_grammar): the format table, what
each grammar takes and refuses byte by byte, calls written in each format read back as written,
a stream's prefixes never releasing what the whole answer takes back, the grammar exact under
speculation, and a batch OpenAI line that calls a tool."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsample.sampling import tool_grammar as T
from llmsample.sampling.constraint import _BYTES, _probe

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
           "additionalProperties": False}  # fmt: skip
ADD = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
TOOLS = T.parse_tools([{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
                       {"type": "function", "function": {"name": "add", "parameters": ADD}}])  # fmt: skip
HERMES, MISTRAL, LLAMA, GENERIC = T.FORMATS


def takes(constraint: Any, text: str) -> bool:
    """Whether the grammar takes ``text`` whole (every byte allowed, complete at its end)."""
    from llguidance import LLMatcher

    _probe(constraint.grammar, "test")  # builds the byte tokenizer
    matcher = LLMatcher(_BYTES[0], constraint.grammar, log_level=0)
    return bool(matcher.consume_tokens(list(text.encode()))) and not matcher.is_error() and matcher.is_accepting()


def written(fmt: T.CallFormat, calls: list[tuple[str, dict[str, Any]]]) -> str:
    """Calls as a model of the format writes them (compact JSON, as the grammar has it)."""
    bodies = [fmt.open + json.dumps({"name": name, fmt.key: args}) + fmt.close for name, args in calls]
    return fmt.prefix + (fmt.sep or "").join(bodies) + fmt.suffix


def test_the_format_table_reads_the_template() -> None:
    assert T.call_format("{% if tools %}<tool_call>{% endif %}") is HERMES
    assert T.call_format("{% for t in tools %}[TOOL_CALLS]{% endfor %}") is MISTRAL
    assert T.call_format("{% if tools %}<|python_tag|>{% endif %}") is LLAMA
    assert T.call_format("{{ messages }}<tool_call>") is GENERIC  # it renders no tools
    assert T.call_format(None) is GENERIC


ONE_ADD = [("add", {"a": 1})]


@pytest.mark.parametrize("fmt", T.FORMATS, ids=lambda f: f.name)
def test_each_grammar_takes_calls_and_refuses_bad_ones(fmt: T.CallFormat) -> None:
    required = T.tool_constraint(TOOLS, "required", fmt)
    assert takes(required, written(fmt, ONE_ADD))
    assert not takes(required, written(fmt, [("add", {"b": 1})]))  # a's required, b unknown
    assert not takes(required, written(fmt, [("add", {"a": "1"})]))  # a is an integer
    assert not takes(required, written(fmt, [("sub", {"a": 1})]))  # not offered
    assert not takes(required, "hello")
    named = T.tool_constraint(TOOLS, "get_weather", fmt)
    assert takes(named, written(fmt, [("get_weather", {"city": "x"})])) and not takes(named, written(fmt, ONE_ADD))
    auto = T.tool_constraint(TOOLS, "auto", fmt)
    assert takes(auto, "hello") and takes(auto, written(fmt, ONE_ADD))
    assert not takes(auto, written(fmt, [("add", {"a": "x"})]))  # once the calls begin, they are exact
    assert T.tool_constraint(TOOLS, "none", fmt) is None
    if fmt.sep is not None:
        two = written(fmt, [("add", {"a": 1}), ("get_weather", {"city": "y"})])
        assert takes(required, two)
        assert not takes(T.tool_constraint(TOOLS, "required", fmt, parallel=False), two)


def test_auto_text_before_a_hermes_call_and_never_the_trigger_alone() -> None:
    auto = T.tool_constraint(TOOLS, "auto", HERMES)
    call = written(HERMES, ONE_ADD)
    assert takes(auto, "Let me see.\n" + call)
    assert not takes(auto, "a <tool_call> b")  # free text cannot hold the trigger: it starts a call
    assert not takes(auto, call + " and more text")


def test_a_thinking_block_comes_before_the_calls() -> None:
    call = written(HERMES, ONE_ADD)
    opened = T.tool_constraint(TOOLS, "required", HERMES, reasoning=T.Reasoning())
    assert takes(opened, "<think>hmm</think>\n\n" + call) and takes(opened, call)
    started = T.tool_constraint(TOOLS, "required", GENERIC, reasoning=T.Reasoning(started=True))
    assert takes(started, "hmm</think>\n" + written(GENERIC, ONE_ADD)) and not takes(started, written(GENERIC, ONE_ADD))


ARGS = st.dictionaries(st.text(min_size=1, max_size=5), st.integers(-1000, 1000) | st.text(max_size=6), max_size=3)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(fmt=st.sampled_from(T.FORMATS), args=st.lists(ARGS, min_size=1, max_size=3), before=st.text(max_size=8))
def test_calls_read_back_as_written(fmt: T.CallFormat, args: list[dict[str, Any]], before: str) -> None:
    calls = [("add", each) for each in (args if fmt.sep is not None else args[:1])]
    lead = before if fmt.anywhere and fmt.trigger not in before else ""
    content, read = T.split_tool_calls(lead + written(fmt, calls), fmt)
    assert content == lead
    assert [(call.name, json.loads(call.arguments)) for call in read] == calls


@settings(max_examples=60, deadline=None, derandomize=True)
@given(fmt=st.sampled_from(T.FORMATS), args=ARGS, before=st.text(max_size=8), think=st.text(max_size=8))
def test_a_streams_prefixes_only_grow(fmt: T.CallFormat, args: dict[str, Any], before: str, think: str) -> None:
    """At every prefix, content, reasoning and each call's arguments are prefixes of the whole
    answer's: what a stream has sent is never taken back."""
    reasoning = T.Reasoning()
    lead = before if fmt.anywhere and fmt.trigger not in before else ""
    think = think.replace("<", "")
    text = f"<think>{think}</think>\n\n" + lead + written(fmt, [("add", args)])
    thought, rest = T.split_reasoning(text, reasoning)
    content, calls = T.split_tool_calls(rest, fmt)
    assert thought == think and content == lead and len(calls) == 1
    for end in range(len(text) + 1):
        part_thought, part_rest = T.split_reasoning(text[:end], reasoning, final=False)
        part_content, part_calls = T.split_tool_calls(part_rest, fmt, final=False)
        assert thought.startswith(part_thought) and content.startswith(part_content)
        assert all(calls[i].arguments.startswith(call.arguments) for i, call in enumerate(part_calls))


def test_speculation_under_a_tool_grammar_decodes_the_plain_run(byte_lm) -> None:
    from llmsample.engine.loop import generate, run_to_end
    from llmsample.engine.prompt import encode_prompt
    from llmsample.engine.speculative import NgramDrafter
    from llmsample.events import RunStats
    from llmsample.sampling.config import SamplingConfig

    prompt = encode_prompt(byte_lm, "Copy: " + written(HERMES, ONE_ADD) * 2, raw=True)
    for choice in ("required", "auto"):
        constraint = T.tool_constraint(TOOLS, choice, HERMES)
        cfg = SamplingConfig(temperature=0.0, max_tokens=50, constraint=constraint)
        plain, _ = run_to_end(generate(byte_lm, prompt, cfg, RunStats("b", "t", 0)))
        drafter = NgramDrafter(byte_lm.model.config.vocab_size, byte_lm.sample_device, 1, 4)
        drafted, summary = run_to_end(
            generate(byte_lm, prompt, cfg, RunStats("b", "t", 0), drafter=drafter, draft_tokens=4)
        )
        assert [e.token_id for e in drafted] == [e.token_id for e in plain]
        if choice == "required":  # the call copies the prompt's: drafts are taken (auto writes free text)
            assert summary.facts.speculation is not None and summary.facts.speculation.accepted > 0


def test_a_batch_openai_line_calls_a_tool(tmp_path) -> None:
    from llmsample.api.local import LocalEngine
    from llmsample.batch.requests import read_requests
    from llmsample.batch.run import BatchSettings, run_batch
    from llmsample.models.loading import load_model
    from tests.conftest import with_chat_template
    from tests.constraints.conftest import make_byte_model
    from tests.serve.conftest import HERMES as TEMPLATE

    lm = load_model(str(with_chat_template(make_byte_model(tmp_path / "m"), TEMPLATE)), "cpu", "float32")
    tools = [{"type": "function", "function": {"name": "add", "parameters": ADD}}]
    body = {"messages": [{"role": "user", "content": "add"}], "tools": tools, "tool_choice": "required",
            "parallel_tool_calls": False, "max_tokens": 80, "seed": 3}  # fmt: skip
    line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body})
    records: list[dict[str, Any]] = []
    run_batch(LocalEngine(lambda: lm), list(read_requests([line])), frozenset(), BatchSettings(fmt="openai"), records.append)
    choice = records[0]["response"]["body"]["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "add" and isinstance(json.loads(call["function"]["arguments"])["a"], int)
    assert call["id"].startswith("call_")
