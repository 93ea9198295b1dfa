"""Other APIs' requests as a chat completions body, so the Responses and Messages endpoints run
through the same checks and engine path as ``/v1/chat/completions``: their messages, tool
calls and tool results become chat messages (assistant ``tool_calls``, ``role: "tool"``), their
tools chat tools, and a chat error's key is renamed back to the caller's name for it."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse

from llmsample.batch.requests import CHAT_URL
from llmsample.batch.tool_requests import ChatShape
from llmsample.events import Summary, TokenEvent
from llmsample.serve.access import TOKENS
from llmsample.serve.api_errors import ApiError
from llmsample.serve.compat import warned
from llmsample.serve.flow import gather, read_json, submit
from llmsample.serve.mailbox import Mailbox
from llmsample.serve.parsing import ServeRequest, parse_body
from llmsample.serve.state import ServeState


def joined_text(value: Any, where: str, kinds: Collection[str]) -> str:
    """A content string, or a list of text parts (``{"type": KIND, "text"}``, ``KIND`` one of
    ``kinds``) joined with newlines, as chat completions joins its text parts."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ApiError(400, f"{where}: expected a string or a list of text parts, got {value!r}", where)
    texts = []
    for i, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds or not isinstance(part.get("text"), str):
            allowed = " | ".join(sorted(kinds))
            message = f'{where}[{i}]: only text parts ({{"type": "{allowed}", "text"}}) are supported, got {part!r}'
            raise ApiError(400, message, where)
        texts.append(part["text"])
    return "\n".join(texts)


def function_tool(name: Any, description: Any, parameters: Any, where: str) -> dict[str, Any]:
    """A chat completions tool (``{"type": "function", "function": {...}}``)."""
    if not isinstance(name, str) or not name:
        raise ApiError(400, f"{where}.name: expected a function name, got {name!r}", where)
    function: dict[str, Any] = {"name": name, "parameters": parameters if parameters is not None else {}}
    if description is not None:
        function["description"] = description
    return {"type": "function", "function": function}


def without_empty_tools(chat: dict[str, Any]) -> dict[str, Any]:
    """``chat`` with an empty ``tools`` list read as no tools, as OpenAI's Responses API and
    Anthropic's take it (openai-agents sends one for every agent without tools): it goes, with
    ``tool_choice`` (absent, auto or none) and ``parallel_tool_calls``; a choice that must call
    a tool is a 400. Chat completions refuses an empty list, as OpenAI's chat API does."""
    if chat.get("tools") != []:
        return chat
    if chat.get("tool_choice", "auto") not in ("auto", "none"):
        raise ApiError(400, "tool_choice: a tool must be called, but tools is empty", "tool_choice")
    return {key: value for key, value in chat.items() if key not in ("tools", "tool_choice", "parallel_tool_calls")}


def tool_call(call_id: Any, name: Any, arguments: str, where: str) -> dict[str, Any]:
    """An assistant message's chat ``tool_calls`` entry."""
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise ApiError(400, f"{where}: a tool call needs a string id and name", where)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def add_tool_call(messages: list[dict[str, Any]], call: dict[str, Any]) -> None:
    """A tool call joins the assistant message just before it (the text it came with, or the
    calls made beside it), as one chat message carries a turn's text and calls."""
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
        return
    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def chat_request(
    chat: dict[str, Any], presets: Collection[str], strict: bool, warnings: list[str], names: dict[str, str]
) -> ServeRequest:
    """``chat`` read as a chat completions body; its errors name the caller's keys (``names``:
    chat's name to the API's), and ``warnings`` (the API's own ignored keys) come first."""
    try:
        serve = parse_body(chat, CHAT_URL, presets, strict)
    except ApiError as exc:
        raise renamed(exc, names) from None
    return dataclasses.replace(serve, warnings=(*warnings, *(_renamed_text(w, names) for w in serve.warnings)))


def renamed(exc: ApiError, names: dict[str, str]) -> ApiError:
    """``exc`` with chat's key names (in its message and ``param``) as the caller's API has them."""
    param = _renamed_text(exc.param, names) if exc.param else exc.param
    return ApiError(exc.status, _renamed_text(exc.message, names), param, exc.code, exc.headers)


def _renamed_text(text: str, names: dict[str, str]) -> str:
    """``text`` with its leading key path (``response_format.json_schema.schema: ...``) renamed by
    the longest of ``names`` it starts with."""
    text = text.removeprefix("body.")
    for name in sorted(names, key=len, reverse=True):
        if text.startswith(name) and text[len(name) : len(name) + 1] in ("", ".", ":", "["):
            return names[name] + text[len(name) :]
    return text


def hint(key: str, reason: str, strict: bool, warnings: list[str]) -> None:
    """A key this server acts not on: one warning line, or under ``--strict-api`` a 400."""
    if strict:
        raise ApiError(400, f"{key}: {reason}", key, "unknown_parameter")
    warnings.append(f"{key}: ignored ({reason})")


@dataclass(frozen=True)
class ConvertedApi:
    """An API answered as chat completions (Responses, Messages): its body read as chat's, and
    its answer built, whole or streamed, from the one row the request runs."""

    names: dict[str, str]  # chat's keys by the API's own names, for errors
    chat_body: Callable[[Any, bool], tuple[dict[str, Any], list[str]]]
    answer: Callable[[ServeState, ServeRequest, Any, ChatShape], Any]  # the API's answer object: request, body, shape
    whole: Callable[[Any, Summary, list[TokenEvent]], dict[str, Any]]
    stream: Callable[[ServeState, HttpRequest, Any, dict[Any, int], Mailbox], AsyncIterator[str]]


async def answer_converted(state: ServeState, request: HttpRequest, api: ConvertedApi) -> Response:
    """One request of ``api``: read, checked and decoded as chat completions are, answered in the API's shape."""
    body = await read_json(request, state.max_body, state.read_timeout)
    chat, warnings = api.chat_body(body, state.strict_api)
    serve = chat_request(chat, state.presets, state.strict_api, warnings, api.names)
    headers = warned(request.scope, serve.warnings)
    serve, keys, queue, shape = await submit(state, serve, True, request.scope)
    answer = api.answer(state, serve, body, shape)
    if serve.stream:
        stream = api.stream(state, request, answer, keys, queue)
        return StreamingResponse(
            stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache", **headers}
        )
    gathered = await gather(state, request, keys, queue)
    if gathered is None:
        return Response(status_code=499)  # the client went away; nobody reads this
    [summary], [events] = gathered
    request.scope[TOKENS] = [summary.prompt_tokens, summary.tokens]
    return JSONResponse(api.whole(answer, summary, events), headers=headers)
