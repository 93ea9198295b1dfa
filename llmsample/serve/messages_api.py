"""Anthropic's Messages API: ``POST /v1/messages`` (``system`` as text or blocks, content
blocks, ``tool_use`` / ``tool_result``, ``stop_sequences``, ``max_tokens`` required, whole or
streamed as its events) and ``POST /v1/messages/count_tokens``. Errors come in Anthropic's
shape, ``{"type": "error", "error": {"type", "message"}}``. The body becomes a chat completions
body (:mod:`llmsample.serve.convert`) on the engine path chat takes (:mod:`llmsample.serve.flow`)."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from llmsample.batch.result_lines import dumps
from llmsample.batch.tool_requests import ChatShape, tool_prompt
from llmsample.engine.row_state import RowFailed
from llmsample.errors import UserError
from llmsample.events import Summary, TokenEvent
from llmsample.serve import convert
from llmsample.serve.access import TOKENS
from llmsample.serve.api_errors import ApiError
from llmsample.serve.completion_bodies import cached_tokens, extension, token_records
from llmsample.serve.flow import failure, off_loop, read_json, records
from llmsample.serve.mailbox import Mailbox
from llmsample.serve.parsing import ServeRequest
from llmsample.serve.state import ServeState
from llmsample.serve.tool_stream import Block, Blocks, Step, whole_blocks

OWN = ("messages", "system", "max_tokens", "stop_sequences", "tools", "tool_choice", "metadata", "thinking",
       "service_tier", "top_k", "stream")  # fmt: skip
HINTS = {
    "metadata": "this server keeps no per-user records",
    "service_tier": "this server has one tier",
    "thinking": "the model reasons as its chat template has it (enabled with budget_tokens: the budget)",
}
NAMES = {"stop": "stop_sequences"}
ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    405: "invalid_request_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
    503: "overloaded_error",
}  # fmt: skip
STOP_REASONS = {"eos": "end_turn", "stop": "stop_sequence"}


def error_body(error: ApiError) -> dict[str, Any]:
    """Anthropic's error object for ``error``'s status."""
    kind = ERROR_TYPES.get(error.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def error_response(error: ApiError) -> Response:
    return JSONResponse(error_body(error), status_code=error.status, headers=error.headers)


def chat_body(body: Any, strict: bool, counting: bool = False) -> tuple[dict[str, Any], list[str]]:
    """The body as chat completions takes it, and the warnings of what it ignores; ``counting``
    (count_tokens): no ``max_tokens`` needed."""
    if not isinstance(body, dict):
        raise ApiError(400, f"the body must be a JSON object, got {type(body).__name__}")
    given = {key: value for key, value in body.items() if value is not None}
    for key in ("model", "messages", *(() if counting else ("max_tokens",))):
        if key not in given:
            raise ApiError(400, f"{key}: Field required", key)
    warnings: list[str] = []
    budget = _thinking_budget(given.get("thinking"))
    for key, reason in HINTS.items():
        if given.get(key) is not None and not (key == "thinking" and budget is not None):
            convert.hint(key, reason, strict, warnings)
    stops = given.get("stop_sequences", [])
    if not isinstance(stops, list) or not all(isinstance(stop, str) for stop in stops):
        raise ApiError(400, f"stop_sequences: expected a list of strings, got {stops!r}", "stop_sequences")
    chat = {key: value for key, value in given.items() if key not in OWN}
    chat["messages"] = _messages(given["messages"], given.get("system"))
    for ours, theirs in (("max_tokens", "max_tokens"), ("stop", "stop_sequences"), ("top_k", "top_k")):
        if theirs in given:
            chat[ours] = given[theirs]
    if "stream" in given and not counting:
        chat["stream"] = given["stream"]
    if budget:
        chat["reasoning_budget"] = budget
    if "tools" in given:
        chat["tools"] = _tools(given["tools"])
    if "tool_choice" in given:
        chat["tool_choice"] = _tool_choice(given["tool_choice"])
    return convert.without_empty_tools(chat), warnings


def _thinking_budget(value: Any) -> int | None:
    """``thinking``: disabled is 0 (the template's own way), enabled with ``budget_tokens`` is the
    reasoning budget (the block closed by force after that many tokens); None: neither. A budget
    that is no positive whole number is a 400, as chat completions' ``reasoning_budget`` is:
    the same bad value gets the same answer from both APIs."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "disabled":
        return 0
    if kind != "enabled" or "budget_tokens" not in value:
        return None
    budget = value["budget_tokens"]
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise ApiError(400, f"thinking.budget_tokens: expected a positive integer, got {budget!r}", "thinking")
    return budget


def _messages(value: Any, system: Any) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if system is not None:
        messages.append({"role": "system", "content": convert.joined_text(system, "system", ("text",))})
    if not isinstance(value, list) or not value:
        raise ApiError(400, f"messages: expected a non-empty list of messages, got {value!r}", "messages")
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise ApiError(400, f"{where}.role: expected user or assistant, got {role!r}", "messages")
        content = message.get("content")
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise ApiError(400, f"{where}.content: expected a string or a list of blocks, got {content!r}", "messages")
        for j, block in enumerate(content):
            _block(messages, role, block, f"{where}.content[{j}]")
    return messages


def _block(messages: list[dict[str, Any]], role: str, block: Any, where: str) -> None:
    """One content block onto the chat messages: text joins its turn's message, a ``tool_use``
    its calls, a ``tool_result`` is a tool message; thinking blocks are left out."""
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text" and isinstance(block.get("text"), str):
        last = messages[-1] if messages else None
        if last is not None and last["role"] == role and "tool_calls" not in last:
            last["content"] += "\n" + block["text"]
        else:
            messages.append({"role": role, "content": block["text"]})
    elif kind == "tool_use" and role == "assistant":
        arguments = json.dumps(block.get("input", {}), ensure_ascii=False)
        convert.add_tool_call(messages, convert.tool_call(block.get("id"), block.get("name"), arguments, where))
    elif kind == "tool_result" and role == "user":
        content = block.get("content", "")
        text = convert.joined_text(content, f"{where}.content", ("text",))
        messages.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text})
    elif kind not in ("thinking", "redacted_thinking"):
        raise ApiError(400, f"{where}: blocks of type {kind!r} are not supported here", "messages")


TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def _tools(value: Any) -> list[dict[str, Any]]:
    """Anthropic's tools as chat tools, checked in Anthropic's own terms first (``name``,
    ``input_schema``, ``description``): a caller of this API never reads about ``function.parameters``."""
    if not isinstance(value, list):
        raise ApiError(400, f"tools: expected a list of tools, got {value!r}", "tools")
    tools, names = [], set()
    for i, tool in enumerate(value):
        at = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
            raise ApiError(400, f"{at}: only custom tools (name, input_schema) are supported", "tools")
        name, schema, description = tool.get("name"), tool.get("input_schema"), tool.get("description")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise ApiError(400, f"{at}.name: expected letters, digits, _ . - (at most 64), got {name!r}", "tools")
        if name in names:
            raise ApiError(400, f"{at}.name: {name!r} is offered twice", "tools")
        if schema is not None and not isinstance(schema, dict):
            raise ApiError(400, f"{at}.input_schema: expected a JSON Schema object, got {schema!r}", "tools")
        if description is not None and not isinstance(description, str):
            raise ApiError(400, f"{at}.description: expected a string, got {description!r}", "tools")
        names.add(name)
        tools.append(convert.function_tool(name, description, schema, "tools"))
    return tools


def _tool_choice(value: Any) -> Any:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(value.get("name"), str):
        return {"type": "function", "function": {"name": value["name"]}}
    raise ApiError(
        400, f'tool_choice: expected {{"type": "auto" | "any" | "tool" | "none"}}, got {value!r}', "tool_choice"
    )


class Answer:
    """One message being built: its id, the request's stop sequences, the tokens' bytes (to tell
    which stop sequence ended it), and a stream's blocks (thinking, text, tool uses)."""

    def __init__(
        self, serve: ServeRequest, model: str, token_bytes: Callable[[int], bytes | None], shape: ChatShape
    ) -> None:
        self.serve = serve
        self.model = model
        self.token_bytes = token_bytes
        self.shape = shape
        self.id = "msg_" + secrets.token_hex(12)
        self.events: list[TokenEvent] = []
        self.blocks = Blocks(shape, eager=shape.plain)
        self.pending: list[TokenEvent] = []  # tokens whose records no event carried yet

    def message(self, summary: Summary | None, events: list[TokenEvent]) -> dict[str, Any]:
        """The message: whole (``summary``) or as ``message_start`` opens it."""
        body: dict[str, Any] = {"id": self.id, "type": "message", "role": "assistant", "model": self.model}
        if summary is None:
            usage = {"input_tokens": 0, "output_tokens": 0}
            return {**body, "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}
        blocks, called = whole_blocks(summary.text, self.shape)
        body["content"] = [_content_block(block, final=True) for block in blocks]
        body.update(self.stopped(summary, events, called))
        body["usage"] = _usage(summary)
        if self.serve.tokens != "none":
            body["llmsample"] = {**extension(summary), "tokens": token_records(events, self.serve.tokens)}
        return {**body, **self.warnings()}

    def warnings(self) -> dict[str, Any]:
        return {"warnings": list(self.serve.warnings)} if self.serve.warnings else {}

    def stopped(self, summary: Summary, events: list[TokenEvent], called: bool) -> dict[str, Any]:
        """``stop_reason`` and ``stop_sequence``: the one the raw text goes on with after the answer."""
        reason = "tool_use" if called else STOP_REASONS.get(summary.stop_reason, "max_tokens")
        if reason != "stop_sequence":
            return {"stop_reason": reason, "stop_sequence": None}
        raw = b"".join(self.token_bytes(event.token_id) or b"" for event in events).decode("utf-8", "replace")
        rest = raw[len(summary.text) :] if raw.startswith(summary.text) else raw
        stops = self.serve.request.overrides.get("stop") or ()
        matched = next((stop for stop in stops if rest.startswith(stop)), None)
        if matched is None:  # the tokens' text is not the answer's (a split character): the earliest found
            found = [(rest.find(stop), stop) for stop in stops if stop in rest]
            matched = min(found)[1] if found else None
        return {"stop_reason": reason, "stop_sequence": matched}

    def steps(self, steps: list[Step]) -> str:
        """The events of the blocks' steps: a block's start, its deltas (the first carrying the
        records of the tokens so far, where asked), its stop."""
        out = []
        for kind, index, piece in steps:
            block = self.blocks.blocks[index]
            if kind == "open":
                out.append(_sse("content_block_start", {"index": index, "content_block": _content_block(block)}))
            elif kind == "close":
                out.append(_sse("content_block_stop", {"index": index}))
            else:
                data: dict[str, Any] = {"index": index, "delta": _delta_of(block, piece)}
                if self.pending:
                    data["llmsample"] = {"tokens": token_records(self.pending, self.serve.tokens)}
                    self.pending = []
                out.append(_sse("content_block_delta", data))
        return "".join(out)


def _content_block(block: Block, final: bool = False) -> dict[str, Any]:
    """A block as Anthropic's content block: whole (``final``) or as its start event has it."""
    if block.kind == "call":
        arguments = json.loads(block.text) if final else {}
        return {"type": "tool_use", "id": "toolu_" + block.ident.removeprefix("call_"), "name": block.name,
                "input": arguments}  # fmt: skip
    text = block.text if final else ""
    if block.kind == "reasoning":
        return {"type": "thinking", "thinking": text, "signature": ""}
    return {"type": "text", "text": text}


def _delta_of(block: Block, piece: str) -> dict[str, Any]:
    if block.kind == "call":
        return {"type": "input_json_delta", "partial_json": piece}
    if block.kind == "reasoning":
        return {"type": "thinking_delta", "thinking": piece}
    return {"type": "text_delta", "text": piece}


def _sse(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {dumps({'type': kind, **data})}\n\n"


async def messages(state: ServeState, request: HttpRequest) -> Response:
    """``POST /v1/messages``."""
    return await convert.answer_converted(state, request, MESSAGES_API)


async def _stream(
    state: ServeState, request: HttpRequest, answer: Answer, keys: dict[Any, int], queue: Mailbox
) -> AsyncIterator[str]:
    yield _opening(answer)
    usage = request.scope.setdefault(TOKENS, [0, 0])
    async for batch in records(state, request, keys, queue):
        out = []
        for _, record in batch:
            if isinstance(record, TokenEvent):
                answer.events.append(record)
                out.append(_delta(answer, record))
            elif isinstance(record, RowFailed):
                if record.message != "cancelled":
                    out.append(_sse("error", {"error": error_body(failure(record))["error"]}))
            else:
                usage[0], usage[1] = record.prompt_tokens, record.tokens
                out.append(_closing(answer, record))
        yield "".join(out)


def _opening(answer: Answer) -> str:
    """``message_start`` (its usage is the last event's: the prompt's tokens come with the
    answer's end), a plain answer's text block, a ping."""
    message = {**answer.message(None, []), **answer.warnings()}
    return _sse("message_start", {"message": message}) + answer.steps(answer.blocks.start()) + _sse("ping", {})


def _delta(answer: Answer, event: TokenEvent) -> str:
    """A token's events; its records (where asked) on its first delta, or an empty delta of the
    open block when it grows none."""
    if answer.serve.tokens != "none":
        answer.pending.append(event)
    steps = answer.blocks.feed(event.text)
    if answer.pending and answer.blocks.blocks and not any(kind == "grow" for kind, _, _ in steps):
        steps.append(("grow", len(answer.blocks.blocks) - 1, ""))
    return answer.steps(steps)


def _usage(summary: Summary) -> dict[str, Any]:
    """Anthropic's usage: ``input_tokens`` are the prompt's tokens read past the cache, and
    ``cache_read_input_tokens`` those the prompt cache held (together the prompt)."""
    cached = cached_tokens(summary)
    return {
        "input_tokens": summary.prompt_tokens - cached, "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0, "output_tokens": summary.tokens,
    }  # fmt: skip


def _closing(answer: Answer, summary: Summary) -> str:
    steps = answer.steps(answer.blocks.feed("", final=True))
    delta = answer.stopped(summary, answer.events, answer.blocks.called)
    tail: dict[str, Any] = {"delta": delta, "usage": _usage(summary)}
    if answer.serve.tokens != "none":
        tail["llmsample"] = extension(summary)
    return steps + _sse("message_delta", tail) + _sse("message_stop", {})


async def count_tokens(state: ServeState, request: HttpRequest) -> Response:
    """``POST /v1/messages/count_tokens``: the prompt's tokens as ``/v1/messages`` would send them
    (the tools rendered as that request renders them)."""
    body = await read_json(request, state.max_body, state.read_timeout)
    chat, _ = chat_body(body, strict=False, counting=True)
    serve = convert.chat_request(chat, state.presets, False, [], NAMES)
    return JSONResponse({"input_tokens": await off_loop(_prompt_tokens, state, serve)})


def _prompt_tokens(state: ServeState, serve: ServeRequest) -> int:
    from llmsample.engine.prompt import encode_messages

    messages, tools = tool_prompt(state.lm.tokenizer, serve.request)
    try:
        return int(encode_messages(state.lm, messages, tools=tools).shape[-1])
    except UserError as exc:
        raise ApiError(400, str(exc), "messages") from None


MESSAGES_API = convert.ConvertedApi(
    NAMES, chat_body, lambda state, serve, body, shape: Answer(serve, state.lm.name, state.lm.token_bytes, shape),
    lambda answer, summary, events: answer.message(summary, events), _stream,
)
