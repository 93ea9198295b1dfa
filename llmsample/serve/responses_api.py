"""OpenAI's Responses API, ``POST /v1/responses``, stateless: ``input`` (text or items),
``instructions``, ``text.format`` (structured output), ``max_output_tokens``, ``temperature``,
``top_p``, ``tools`` and function-call items, whole or streamed as its typed events. The body
becomes a chat completions body (:mod:`llmsample.serve.convert`) and runs on the engine path
chat completions takes (:mod:`llmsample.serve.flow`); this module shapes the answer."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from llmsample.batch.result_lines import dumps
from llmsample.batch.tool_requests import ChatShape
from llmsample.engine.row_state import RowFailed
from llmsample.events import Summary, TokenEvent
from llmsample.serve import compat, convert
from llmsample.serve.access import TOKENS
from llmsample.serve.api_errors import ApiError
from llmsample.serve.completion_bodies import cached_tokens, extension, token_records
from llmsample.serve.flow import failure, records
from llmsample.serve.mailbox import Mailbox
from llmsample.serve.parsing import ServeRequest
from llmsample.serve.state import ServeState
from llmsample.serve.tool_stream import Block, Blocks, Step, whole_blocks

OWN = (
    "input", "instructions", "text", "reasoning", "max_output_tokens", "tools", "tool_choice", "store",
    "metadata", "include", "truncation", "service_tier", "prompt_cache_key", "safety_identifier",
    "top_logprobs", "stream_options", "max_tool_calls", "background", "previous_response_id",
    "conversation", "prompt",
)  # fmt: skip
REFUSED = {
    "previous_response_id": "this server is stateless: send the whole conversation in input",
    "conversation": "this server is stateless: send the whole conversation in input",
    "prompt": "this server keeps no stored prompts",
}
CHAT_ONLY = ("messages", "n", "max_tokens", "max_completion_tokens", "response_format", "logprobs")
HINTS = {
    "metadata": "this server stores no responses",
    "service_tier": "this server has one tier",
    "prompt_cache_key": compat.HINTS["prompt_cache_key"],
    "safety_identifier": "this server keeps no per-user records",
    "top_logprobs": "log probabilities are not reported on /v1/responses",
    "stream_options": "the stream's events are sent as they are",
    "max_tool_calls": "the calls are as many as the model makes",
    "reasoning": "the model reasons as its chat template has it",
}
NAMES = {
    "max_tokens": "max_output_tokens", "messages": "input",
    "response_format.json_schema": "text.format", "response_format": "text.format",
}  # fmt: skip
ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")


def chat_body(body: Any, strict: bool) -> tuple[dict[str, Any], list[str]]:
    """The body as chat completions takes it, and the warnings of what it ignores."""
    if not isinstance(body, dict):
        raise ApiError(400, f"the body must be a JSON object, got {type(body).__name__}")
    given = {key: value for key, value in body.items() if value is not None}
    for key in given:
        if key in REFUSED:
            raise ApiError(400, f"{key}: {REFUSED[key]}", key, "unsupported_parameter")
        if key in CHAT_ONLY:
            raise ApiError(
                400, f"{key}: a chat completions key; /v1/responses does not take it", key, "unknown_parameter"
            )
    if given.get("background"):
        raise ApiError(400, "background: responses are answered in the request", "background", "unsupported_parameter")
    warnings: list[str] = []
    for key, reason in HINTS.items():
        if key in given:
            convert.hint(key, reason, strict, warnings)
    if given.get("store"):
        convert.hint("store", "this server stores no responses", strict, warnings)
    if given.get("include"):
        convert.hint("include", "nothing more is included", strict, warnings)
    if given.get("truncation", "disabled") != "disabled":
        convert.hint("truncation", "a conversation too long for the context is a 400", strict, warnings)
    chat = {key: value for key, value in given.items() if key not in OWN}
    if "input" not in given:
        raise ApiError(400, "input: missing; give a string or a list of items", "input")
    chat["messages"] = _messages(given["input"], given.get("instructions"))
    if "max_output_tokens" in given:
        chat["max_tokens"] = given["max_output_tokens"]
    text = given.get("text", {})
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise ApiError(400, f'text: expected {{"format": {{...}}}}, got {text!r}', "text")
    if text.get("verbosity") is not None:
        convert.hint("text.verbosity", "the answer is as long as the model makes it", strict, warnings)
    if text.get("format") is not None:
        chat["response_format"] = _response_format(text["format"])
    if "tools" in given:
        chat["tools"] = _tools(given["tools"])
    if "tool_choice" in given:
        chat["tool_choice"] = _tool_choice(given["tool_choice"])
    return convert.without_empty_tools(chat), warnings


def _response_format(value: Any) -> dict[str, Any]:
    """``text.format`` (the schema beside ``type``) as chat's ``response_format``."""
    if not isinstance(value, dict) or value.get("type") != "json_schema":
        return value
    spec = {key: item for key, item in value.items() if key != "type"}
    return {"type": "json_schema", "json_schema": spec}


def _messages(value: Any, instructions: Any) -> list[dict[str, Any]]:
    """``input`` (and ``instructions`` first, as a system message) as chat messages."""
    messages: list[dict[str, Any]] = []
    if instructions is not None:
        messages.append({"role": "system", "content": convert.joined_text(instructions, "instructions", TEXT_PARTS)})
    if isinstance(value, str):
        return [*messages, {"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise ApiError(400, f"input: expected a string or a non-empty list of items, got {value!r}", "input")
    for i, item in enumerate(value):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise ApiError(400, f"{where}.role: expected one of {', '.join(ROLES)}, got {role!r}", "input")
            messages.append({"role": role, "content": convert.joined_text(item.get("content"), where, TEXT_PARTS)})
        elif kind == "function_call":
            arguments = item.get("arguments", "")
            call = convert.tool_call(item.get("call_id"), item.get("name"), arguments, where)
            convert.add_tool_call(messages, call)
        elif kind == "function_call_output":
            output = convert.joined_text(item.get("output"), f"{where}.output", TEXT_PARTS)
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
        elif kind != "reasoning":  # a earlier answer's reasoning item: the template has no place for it
            raise ApiError(400, f"{where}: items of type {kind!r} are not supported", "input")
    return messages


def _tools(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise ApiError(400, f"tools: expected a list of function tools, got {value!r}", "tools")
    tools = []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise ApiError(400, f"tools[{i}]: only function tools are supported, got {tool!r}", "tools")
        tools.append(convert.function_tool(tool.get("name"), tool.get("description"), tool.get("parameters"), "tools"))
    return tools


def _tool_choice(value: Any) -> Any:
    if value in ("none", "auto", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return {"type": "function", "function": {"name": value["name"]}}
    raise ApiError(400, f'tool_choice: expected "none", "auto", "required" or a function, got {value!r}', "tool_choice")


class Answer:
    """One response being built: its ids, what the request asked (echoed), its events' numbers,
    and a stream's blocks (reasoning, text, calls: each an output item)."""

    def __init__(self, serve: ServeRequest, model: str, body: dict[str, Any], shape: ChatShape) -> None:
        self.serve = serve
        self.shape = shape
        self.id = "resp_" + secrets.token_hex(12)
        self.created_at = int(time.time())
        self.sequence = 0
        self.blocks = Blocks(shape, eager=shape.plain)
        self.item_ids: list[str] = []
        self.pending: list[TokenEvent] = []  # tokens whose records no event carried yet
        self.head = {
            "id": self.id, "object": "response", "created_at": self.created_at, "model": model,
            "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or "auto",
            "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
            "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}},
            "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
            "metadata": body.get("metadata") or {}, "store": False, "background": False,
            "previous_response_id": None, "truncation": body.get("truncation") or "disabled",
            "user": body.get("user"), "error": None,
        }  # fmt: skip

    def item(self, index: int, block: Block, status: str) -> dict[str, Any]:
        """The output item of block ``index``: a reasoning item, the message or a function call."""
        while len(self.item_ids) <= index:
            self.item_ids.append(secrets.token_hex(12))
        ident = self.item_ids[index]
        if block.kind == "call":
            status = "completed" if status != "in_progress" and block.complete else status  # cut: incomplete
            return {"type": "function_call", "id": "fc_" + ident, "call_id": block.ident, "name": block.name,
                    "arguments": block.text, "status": status}  # fmt: skip
        if block.kind == "reasoning":
            content = [] if status == "in_progress" else [{"type": "reasoning_text", "text": block.text}]
            return {"type": "reasoning", "id": "rs_" + ident, "summary": [], "content": content, "status": status}
        content = [] if status == "in_progress" else [_text_part(block.text)]
        return {"type": "message", "id": "msg_" + ident, "status": status, "role": "assistant", "content": content}

    def response(self, summary: Summary | None = None, events: list[TokenEvent] | None = None) -> dict[str, Any]:
        """The response object: in progress (no summary yet) or finished (its blocks a stream's,
        else its text's)."""
        if summary is None:
            body = {**self.head, "status": "in_progress", "incomplete_details": None, "output": [], "usage": None}
            return {**body, **self._warnings()}
        blocks, called = (self.blocks.blocks, self.blocks.called) if events is None else whole_blocks(
            summary.text, self.shape)  # fmt: skip
        status = "completed" if called or summary.stop_reason in ("eos", "stop") else "incomplete"
        body = {
            **self.head, "status": status, "output": [self.item(i, b, status) for i, b in enumerate(blocks)],
            "incomplete_details": None if status == "completed" else {"reason": "max_output_tokens"},
            "usage": _usage(summary), "completed_at": int(time.time()),
        }  # fmt: skip
        if self.serve.tokens != "none":
            tokens = events if events is not None else (self.pending or None)
            body["llmsample"] = {**extension(summary), **({"tokens": token_records(tokens, self.serve.tokens)}
                                                          if tokens is not None else {})}  # fmt: skip
        return {**body, **self._warnings()}

    def _warnings(self) -> dict[str, Any]:
        return {"warnings": list(self.serve.warnings)} if self.serve.warnings else {}

    def event(self, kind: str, **fields: Any) -> str:
        """One server-sent event, named and numbered as OpenAI's are."""
        record = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {dumps(record)}\n\n"

    def opening(self) -> str:
        created = self.event("response.created", response=self.response())
        return created + self.event("response.in_progress", response=self.response()) + self._steps(
            self.blocks.start(), "in_progress")  # fmt: skip

    def delta(self, event: TokenEvent) -> str:
        """A token's events: the blocks it opens, grows and closes; its records on the first
        delta (an empty one on the open block when it grows none)."""
        if self.serve.tokens != "none":
            self.pending.append(event)
        steps = self.blocks.feed(event.text)
        if self.pending and self.blocks.blocks and not any(kind == "grow" for kind, _, _ in steps):
            steps.append(("grow", len(self.blocks.blocks) - 1, ""))
        return self._steps(steps, "completed")

    def closing(self, summary: Summary) -> str:
        steps = self.blocks.feed("", final=True)
        finished = self.response(summary)
        return self._steps(steps, finished["status"]) + self.event(f"response.{finished['status']}", response=finished)

    def _steps(self, steps: list[Step], status: str) -> str:
        return "".join(self._step(kind, index, piece, status) for kind, index, piece in steps)

    def _step(self, kind: str, index: int, piece: str, status: str) -> str:
        block = self.blocks.blocks[index]
        item = self.item(index, block, "in_progress" if kind != "close" else status)
        where = {"output_index": index, "item_id": item["id"]}
        if kind == "open":
            added = self.event("response.output_item.added", output_index=index, item=item)
            if block.kind != "content":
                return added
            return added + self.event("response.content_part.added", **where, content_index=0, part=_text_part(""))
        if kind == "grow":
            extra = {}
            if self.pending:
                extra = {"llmsample": {"tokens": token_records(self.pending, self.serve.tokens)}}
                self.pending = []
            if block.kind == "call":
                return self.event("response.function_call_arguments.delta", **where, delta=piece, **extra)
            if block.kind == "reasoning":
                return self.event("response.reasoning_text.delta", **where, content_index=0, delta=piece, **extra)
            return self.event("response.output_text.delta", **where, content_index=0, delta=piece, logprobs=[],
                              **extra)  # fmt: skip
        if block.kind == "call":
            ended = [self.event("response.function_call_arguments.done", **where, name=block.name, arguments=block.text)]
        elif block.kind == "reasoning":
            ended = [self.event("response.reasoning_text.done", **where, content_index=0, text=block.text)]
        else:
            ended = [
                self.event("response.output_text.done", **where, content_index=0, text=block.text, logprobs=[]),
                self.event("response.content_part.done", **where, content_index=0, part=item["content"][0]),
            ]
        return "".join(ended) + self.event("response.output_item.done", output_index=index, item=item)


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _usage(summary: Summary) -> dict[str, Any]:
    """OpenAI's usage: the input's tokens found in the prompt cache among the input tokens."""
    prompt, completion = summary.prompt_tokens, summary.tokens
    return {
        "input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached_tokens(summary), "cache_write_tokens": 0},
        "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }  # fmt: skip


async def responses(state: ServeState, request: HttpRequest) -> Response:
    """``POST /v1/responses``."""
    return await convert.answer_converted(state, request, RESPONSES_API)


async def _stream(
    state: ServeState, request: HttpRequest, answer: Answer, keys: dict[Any, int], queue: Mailbox
) -> AsyncIterator[str]:
    yield answer.opening()
    usage = request.scope.setdefault(TOKENS, [0, 0])
    async for batch in records(state, request, keys, queue):
        out = []
        for _, record in batch:
            if isinstance(record, TokenEvent):
                out.append(answer.delta(record))
            elif isinstance(record, RowFailed):
                if record.message != "cancelled":
                    out.append(_error_event(answer, failure(record)))
            else:
                usage[0], usage[1] = record.prompt_tokens, record.tokens
                out.append(answer.closing(record))
        yield "".join(out)


def _error_event(answer: Answer, error: ApiError) -> str:
    return answer.event("error", code=error.code, message=error.message, param=error.param)


RESPONSES_API = convert.ConvertedApi(
    NAMES, chat_body, lambda state, serve, body, shape: Answer(serve, state.lm.name, body, shape),
    lambda answer, summary, events: answer.response(summary, events), _stream,
)
