"""A chat request's tools and thinking block, between the request and the engine: the prompt
rendered with the tools (:func:`tool_prompt`), the call grammar on the row's settings
(:func:`with_tools`), and the answer's text split into OpenAI's ``message`` fields
(:func:`message`). Batch OpenAI lines and the server share it; the call formats and grammars
are :mod:`llmsample.sampling.tool_grammar`'s."""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmsample.batch.requests import Request
from llmsample.errors import UserError
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.tool_grammar import (
    GENERIC,
    CallFormat,
    Reasoning,
    call_format,
    generic_instructions,
    reasoning_of,
    split_reasoning,
    split_tool_calls,
    tool_constraint,
)


@dataclass(frozen=True)
class ChatShape:
    """How a chat answer's text is read back: ``fmt`` (None: no calls are read) and the
    template's thinking block (None: all text is content)."""

    fmt: CallFormat | None = None
    reasoning: Reasoning | None = None

    @property
    def plain(self) -> bool:
        return self.fmt is None and self.reasoning is None


PLAIN = ChatShape()


def template_of(tokenizer: Any) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    return template if isinstance(template, str) else None


def calls_tools(request: Request) -> bool:
    """Tools offered and not refused (``tool_choice: none`` renders and reads no calls)."""
    return bool(request.tools) and request.tool_choice != "none"


def tool_prompt(tokenizer: Any, request: Request) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages and the ``tools`` argument for the chat template: the template's own
    rendering when it renders tools, else a system message that offers them (the generic form)."""
    messages = request.chat_messages()
    if not calls_tools(request):
        return messages, None
    if call_format(template_of(tokenizer)) is not GENERIC:
        return messages, [tool.openai() for tool in request.tools]
    offer = generic_instructions(request.tools)
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": messages[0]["content"] + "\n\n" + offer}, *messages[1:]], None
    return [{"role": "system", "content": offer}, *messages], None


def chat_shape(tokenizer: Any, request: Request, prompt_tail: str) -> ChatShape:
    """The shape of a chat request's answer, ``prompt_tail`` the rendered prompt's last text
    (a template that opens the thinking block itself ends with it)."""
    if request.endpoint != "chat":
        return PLAIN
    template = template_of(tokenizer)
    fmt = call_format(template) if calls_tools(request) else None
    return ChatShape(fmt, reasoning_of(template, prompt_tail))


def with_tools(cfg: SamplingConfig, request: Request, shape: ChatShape) -> SamplingConfig:
    """The row's settings with the call grammar as its constraint (another constraint and
    tools that may be called are two constraints: an error)."""
    if shape.fmt is None:
        return cfg
    if cfg.constraint is not None:
        raise UserError(f"tools: {cfg.constraint.flag} is a constraint too; give tool_choice none or leave it out")
    grammar = tool_constraint(request.tools, request.tool_choice, shape.fmt, request.parallel_tool_calls,
                              shape.reasoning)  # fmt: skip
    return dataclasses.replace(cfg, constraint=grammar)


def call_id() -> str:
    return "call_" + secrets.token_hex(12)


def message(text: str, shape: ChatShape, id_of: Callable[[int], str] | None = None) -> tuple[dict[str, Any], bool]:
    """The assistant ``message`` for ``text`` (``reasoning_content``, ``content``,
    ``tool_calls``) and whether it ended with its calls (else the length cut it inside a call or
    after one began: its complete calls are kept, the one cut short is left out); ``id_of``: the
    i-th call's id, else fresh ones."""
    out: dict[str, Any] = {"role": "assistant"}
    content = text
    if shape.reasoning is not None:
        reasoning, content = split_reasoning(text, shape.reasoning)
        out["reasoning_content"] = reasoning or None
    calls = []
    if shape.fmt is not None:
        content, calls = split_tool_calls(content, shape.fmt)
    whole = [call for call in calls if call.complete]
    out["content"] = content if content.strip() or not whole else None
    if whole:
        out["tool_calls"] = [
            {"id": id_of(i) if id_of else call_id(), "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}}
            for i, call in enumerate(whole)
        ]  # fmt: skip
    return out, bool(calls) and calls[-1].ends


def call_start(text: str, shape: ChatShape) -> int | None:
    """Where in ``text`` the calls begin (None: it calls nothing)."""
    if shape.fmt is None:
        return None
    rest = split_reasoning(text, shape.reasoning)[1] if shape.reasoning is not None else text
    content, calls = split_tool_calls(rest, shape.fmt)
    return len(text) - len(rest) + len(content) if calls else None
