"""openai-agents against ``llmsample serve``: its default model (the Responses API, through the
real ``openai-agents`` package, tracing off, no network) runs an Agent without tools, which
sends ``tools: []`` on every turn, and an Agent with an ``output_type`` (structured output
through ``text.format``). An empty ``tools`` list means no tools on the Responses and Messages
APIs, as OpenAI and Anthropic take it; chat completions refuses it, as OpenAI's chat API does."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from llmsample.serve import messages_api, responses_api
from llmsample.serve.api_errors import ApiError
from tests.serve.conftest import Server


class Verdict(BaseModel):
    ok: bool


def run_agent(server: Server, extra: dict[str, Any], **agent: Any) -> Any:
    """One run of an Agent on the server through openai-agents' default (Responses) model
    (``extra``: our keys; a run must end, and the byte model ends where a constraint does)."""
    import openai
    from agents import Agent, ModelSettings, RunConfig, Runner
    from agents.models.openai_provider import OpenAIProvider

    client = openai.AsyncOpenAI(base_url=server.base, api_key="none", max_retries=0, timeout=120)
    model = server.client().models.list().data[0].id
    provider = OpenAIProvider(openai_client=client, use_responses=True)
    settings = ModelSettings(max_tokens=24, extra_body={"seed": 3, **extra})
    config = RunConfig(model_provider=provider, tracing_disabled=True, model_settings=settings)
    return Runner.run_sync(Agent(name="plain", model=model, **agent), "Is the sky blue?", run_config=config)


def test_an_agent_without_tools(tools_server: Server) -> None:
    result = run_agent(tools_server, {"regex": "[a-z]{3,9}"}, instructions="Answer briefly.")
    assert isinstance(result.final_output, str) and 3 <= len(result.final_output) <= 9


def test_an_agent_with_an_output_type(tools_server: Server) -> None:
    result = run_agent(tools_server, {}, instructions="Judge it.", output_type=Verdict)
    assert isinstance(result.final_output, Verdict)


@pytest.mark.parametrize("choice", [None, "auto", "none"])
def test_empty_tools_are_no_tools_on_responses_and_messages(choice: str | None) -> None:
    with_choice = {} if choice is None else {"tool_choice": choice}
    chat, _ = responses_api.chat_body({"input": "hi", "tools": [], "parallel_tool_calls": True, **with_choice}, False)
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(chat)
    anthropic_choice = {} if choice is None else {"tool_choice": {"type": choice}}
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "tools": [],
            **anthropic_choice}  # fmt: skip
    chat, _ = messages_api.chat_body(body, False)
    assert not {"tools", "tool_choice"} & set(chat)


def test_empty_tools_with_a_call_required_is_a_400() -> None:
    for body in ({"input": "hi", "tools": [], "tool_choice": "required"},
                 {"input": "hi", "tools": [], "tool_choice": {"type": "function", "name": "f"}}):  # fmt: skip
        with pytest.raises(ApiError) as caught:
            responses_api.chat_body(body, False)
        assert caught.value.status == 400 and caught.value.param == "tool_choice"
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "tools": [],
            "tool_choice": {"type": "any"}}  # fmt: skip
    with pytest.raises(ApiError) as caught:
        messages_api.chat_body(body, False)
    assert caught.value.param == "tool_choice"


def test_empty_tools_through_each_api(tools_server: Server) -> None:
    import anthropic
    import openai

    client = tools_server.client()
    model = client.models.list().data[0].id
    answer = client.responses.create(model=model, input="hi", tools=[], max_output_tokens=4, extra_body={"seed": 1})
    assert answer.output and answer.tools == []
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=model, input="hi", tools=[], tool_choice="required", max_output_tokens=4)
    assert caught.value.body["param"] == "tool_choice"
    talk = anthropic.Anthropic(base_url=tools_server.url, api_key="none", max_retries=0, timeout=60)
    message = talk.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": "hi"}], tools=[])
    assert message.content[0].type == "text"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], tools=[], max_tokens=4)
    assert caught.value.body["param"] == "tools"
