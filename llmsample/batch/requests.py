"""Input lines to typed requests; one bad line is one ``RequestError``, never an exception.

Each line is read on its own (line numbers are 1-based and count every physical line, blank
ones included). The format is decided per line:

1. Only whitespace: skipped.
2. The first non-blank character is not ``{``: a **plain text** prompt, the whole line without
   its line ending, sent through the chat template. Its ``custom_id`` is ``line-N``. (A prompt
   that starts with ``{`` must be written as a JSON line.)
3. A JSON object with any of ``method``, ``url`` or ``body``: an **OpenAI Batch** input line,
   ``{"custom_id", "method": "POST", "url": "/v1/chat/completions" | "/v1/completions", "body"}``.
   Chat bodies take ``messages``; completion bodies take one ``prompt`` string, which is sent
   raw (no chat template), as OpenAI's completions endpoint does. Body keys: ``model`` (allowed
   and ignored: the batch runs the model it was started with, and the response names that one),
   ``temperature``, ``top_p``, ``max_tokens`` (chat also ``max_completion_tokens``; not both),
   ``stop`` (a string or a list), ``seed``, ``frequency_penalty``, ``presence_penalty``, ``n``
   (only 1) and log probabilities: on chat ``logprobs`` (bool) with ``top_logprobs`` (0..20,
   which needs ``logprobs: true``); on completions ``logprobs`` is the legacy integer 0..5 (the
   number of alternatives), ``echo`` (bool: the prompt first, with ``logprobs`` its tokens
   scored) and ``max_tokens`` may be 0 (the prompt alone, nothing generated), as
   lm-evaluation-harness scores a text. Any other key is an error naming it.
4. Any other JSON object: **our format**, ``prompt`` (a string) or ``messages`` (a non-empty
   list of ``{role, content}``), optional ``custom_id`` (default ``line-N``), ``preset`` (a
   name), ``system`` (with ``prompt`` only), ``raw`` (bool, with ``prompt`` only) and any
   sampling key of ``SamplingConfig`` except ``description``.

In both JSON formats ``null`` means "not given" (the preset's value, or the default, applies),
as it does in OpenAI's API. Messages take the roles ``system``, ``developer`` (read as
``system``), ``user``, ``assistant`` (with ``tool_calls``, its content may be null) and ``tool``
(with ``tool_call_id``); ``content`` is a string or a list of ``{"type": "text", "text"}``
parts, joined with newlines. OpenAI chat bodies also take ``tools``, ``tool_choice`` and
``parallel_tool_calls`` (:mod:`llmsample.batch.tool_requests`). Values are checked with
``SamplingConfig``'s own ranges, so a line is refused exactly when ``--temperature`` & co. would
refuse the same value (``top_p`` 0, which OpenAI accepts, is refused: use ``temperature`` 0).

A line is an error, reported with its number and (when it could be read) its ``custom_id``, for:
invalid UTF-8, invalid JSON (including ``NaN``/``Infinity`` and a key given twice in one
object), a lone UTF-16 surrogate escape, a missing or doubled prompt, a wrong type, a value out
of range, an unknown key, an unknown preset (when the caller passes the known names), and a
``custom_id`` an earlier line already used (every later line with it is an error; the first
keeps it).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from llmsample.batch.constraints import KEYS as CONSTRAINT_KEYS
from llmsample.batch.constraints import STRICT_KEY, ConstraintError, request_constraint, response_format, strict_schema
from llmsample.errors import UserError
from llmsample.sampling.config import ConfigError, SamplingConfig
from llmsample.sampling.tool_grammar import Tool, parse_tool_choice, parse_tools

SAMPLING_KEYS = tuple(key for key in SamplingConfig.keys() if key != "description")  # noqa: SIM118 (a classmethod)
OUR_KEYS = ("custom_id", "prompt", "messages", "system", "raw", "preset", *SAMPLING_KEYS, *CONSTRAINT_KEYS, STRICT_KEY)
OPENAI_MARKERS = frozenset({"method", "url", "body"})
OPENAI_KEYS = ("custom_id", "method", "url", "body")
CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
TOOL_KEYS = ("tools", "tool_choice", "parallel_tool_calls")
_BODY_COMMON = (
    "model",
    "temperature",
    "top_p",
    "max_tokens",
    "stop",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "n",
    "logprobs",
    "response_format",
)
BODY_KEYS = {
    CHAT_URL: ("messages", *_BODY_COMMON, "max_completion_tokens", "top_logprobs", *TOOL_KEYS),
    COMPLETIONS_URL: ("prompt", *_BODY_COMMON),
}
MAX_TOP_LOGPROBS = {CHAT_URL: 20, COMPLETIONS_URL: 5}
ECHO_KEY = "echo"
"""A batch completion body's ``echo`` (the server reads it among its own keys: a chat request
that sends it is answered with a warning there, as before, not refused)."""
ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class Request:
    """One prompt to decode. Exactly one of ``prompt`` and ``messages`` is set; ``overrides``
    holds validated (normalised) ``SamplingConfig`` values to put on top of the preset."""

    line: int
    custom_id: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    system: str | None = None
    raw: bool = False
    preset: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    openai: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    tools: tuple[Tool, ...] = ()  # chat: the functions offered (body.tools)
    tool_choice: str = "auto"  # auto | none | required | a tool's name
    parallel_tool_calls: bool = True
    echo: bool = False  # completions: the prompt before the text (and its logprobs before the text's)
    prompt_only: bool = False  # completions' max_tokens 0: the prompt echoed or scored, nothing generated

    @property
    def endpoint(self) -> Literal["chat", "completion"]:
        """What the answer is: a chat message, or a plain continuation of raw text."""
        return "completion" if self.raw else "chat"

    def chat_messages(self) -> list[dict[str, Any]]:
        """The conversation for the chat template (``system`` first when given)."""
        if self.messages is not None:
            return self.messages
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": self.prompt or ""}]


@dataclass(frozen=True)
class RequestError:
    """A line that cannot run; ``custom_id`` is None when the line did not yield one.
    The engine may build these for failures at run time too (``code`` tells them apart)."""

    line: int
    custom_id: str | None
    message: str
    code: str = "invalid_request"


class _LineError(Exception):
    def __init__(self, message: str, custom_id: str | None = None) -> None:
        super().__init__(message)
        self.custom_id = custom_id


def read_requests(
    lines: Iterable[bytes | str], known_presets: Collection[str] | None = None
) -> Iterator[Request | RequestError]:
    """Every non-blank line as a ``Request`` or a ``RequestError``, in input order.

    ``known_presets``: names a ``preset`` key may take; None skips that check (the caller
    then resolves names itself)."""
    seen: dict[str, int] = {}
    for number, item in enumerate(lines, 1):
        try:
            text = _decode(item, number)
            if not text.strip():
                continue
            request = _parse(text, number)
        except _LineError as exc:
            if exc.custom_id is not None:
                seen.setdefault(exc.custom_id, number)
            yield RequestError(number, exc.custom_id, str(exc))
            continue
        except RecursionError:  # Python's JSON reader ran out of stack (deeper than MAX_NESTING)
            yield RequestError(number, None, TOO_DEEP)
            continue
        first = seen.setdefault(request.custom_id, number)
        if first != number:
            yield RequestError(
                number, request.custom_id, f"custom_id {request.custom_id!r} is already used on line {first}"
            )
        elif known_presets is not None and request.preset is not None and request.preset not in known_presets:
            choices = ", ".join(sorted(known_presets))
            yield RequestError(
                number, request.custom_id, f"preset: unknown preset {request.preset!r}; choose one of: {choices}"
            )
        else:
            yield request


def _decode(item: bytes | str, number: int) -> str:
    if isinstance(item, bytes):
        try:
            item = item.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _LineError(f"not valid UTF-8 ({exc.reason} at byte {exc.start} of the line)") from None
    if number == 1:
        item = item.removeprefix("\ufeff")  # a byte order mark some editors write
    return item.rstrip("\r\n")


def _parse(text: str, number: int) -> Request:
    _check_unicode(text)
    if not text.lstrip().startswith("{"):
        return Request(line=number, custom_id=f"line-{number}", prompt=text)
    data = _load_json(text)
    if OPENAI_MARKERS & data.keys():
        return _openai_request(data, number)
    return _our_request(data, number)


MAX_NESTING = 500
"""Levels of arrays and objects a line may nest: a deeper one is its error whatever reads it
next (a check that walks the value would run out of stack near 1000, as and when the stack
beneath it allowed)."""
TOO_DEEP = f"nested too deeply to read ({MAX_NESTING} levels at most); flatten the line"


def _load_json(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text, object_pairs_hook=_object, parse_constant=_constant)
    except json.JSONDecodeError as exc:
        raise _LineError(f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    if _nesting(data) > MAX_NESTING:
        raise _LineError(TOO_DEEP)
    return data


def _nesting(value: Any) -> int:
    """The deepest level of arrays and objects in ``value``, walked without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            todo += [(child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)]
    return deepest


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise _LineError(f"invalid JSON: the key {key!r} appears twice in one object")
        data[key] = value
    return data


def _constant(name: str) -> Any:
    raise _LineError(f"invalid JSON: {name} is not a JSON number")


def _check_unicode(value: Any) -> None:
    """A ``\\ud800`` escape decodes to a lone surrogate, which no UTF-8 output can hold."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end].encode("utf-8", "backslashreplace").decode("ascii")
        raise _LineError(f"contains a lone UTF-16 surrogate ({bad}), which is not valid Unicode") from None


def _unknown(key: str, allowed: Iterable[str], where: str = "") -> _LineError:
    allowed = list(allowed)
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return _LineError(f"{where}{key}: unknown key{hint}; allowed keys: {', '.join(allowed)}")


def _custom_id(data: dict[str, Any], number: int, required: bool) -> str:
    value = data.get("custom_id")
    if value is None:
        if required:
            raise _LineError("custom_id: missing; every OpenAI Batch line needs a unique string custom_id")
        return f"line-{number}"
    if not isinstance(value, str) or not value:
        raise _LineError(f"custom_id: expected a non-empty string, got {value!r}")
    _check_unicode(value)
    return value


def _given(data: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in data.items() if value is not None}


def _our_request(data: dict[str, Any], number: int) -> Request:
    custom_id = _custom_id(data, number, required=False)
    try:
        _check_unicode(data)
        for key in data:
            if key not in OUR_KEYS:
                raise _unknown(key, OUR_KEYS)
        given = _given(data)
        if ("prompt" in given) == ("messages" in given):
            raise _LineError("give exactly one of prompt (a string) and messages (a list of {role, content})")
        raw = given.get("raw", False)
        if not isinstance(raw, bool):
            raise _LineError(f"raw: expected true or false, got {raw!r}")
        system = given.get("system")
        if system is not None and not isinstance(system, str):
            raise _LineError(f"system: expected a string, got {system!r}")
        preset = given.get("preset")
        if preset is not None and (not isinstance(preset, str) or not preset):
            raise _LineError(f"preset: expected a preset name, got {preset!r}")
        prompt, messages = None, None
        if "messages" in given:
            for key in ("raw", "system"):
                if key in given:
                    raise _LineError(f"{key}: only goes with prompt; with messages, put a system message in the list")
            messages = _messages(given["messages"])
        else:
            prompt = given["prompt"]
            if not isinstance(prompt, str):
                raise _LineError(f"prompt: expected a string, got {prompt!r}")
            if not raw and not prompt.strip():
                raise _LineError("prompt: empty; write a prompt (or set raw to let the model start on its own)")
            if raw and system is not None:
                raise _LineError("system: needs the chat template; drop raw or drop system")
        overrides = _overrides({key: given[key] for key in SAMPLING_KEYS if key in given})
        overrides |= _constraint(request_constraint, given)
    except _LineError as exc:
        raise _LineError(str(exc), custom_id) from None
    return Request(
        line=number,
        custom_id=custom_id,
        prompt=prompt,
        messages=messages,
        system=system,
        raw=raw,
        preset=preset,
        overrides=overrides,
    )


def _openai_request(data: dict[str, Any], number: int) -> Request:
    custom_id = _custom_id(data, number, required=True)
    try:
        _check_unicode(data)
        for key in data:
            if key not in OPENAI_KEYS:
                raise _unknown(key, OPENAI_KEYS)
        if data.get("method") != "POST":
            raise _LineError(f'method: expected "POST", got {data.get("method")!r}')
        url = data.get("url")
        if url not in BODY_KEYS:
            raise _LineError(f"url: expected {CHAT_URL!r} or {COMPLETIONS_URL!r}, got {url!r}")
        body = data.get("body")
        if not isinstance(body, dict):
            raise _LineError(f"body: expected an object, got {body!r}")
        return _openai_body(body, url, number, custom_id)
    except _LineError as exc:
        raise _LineError(str(exc), custom_id) from None


def _openai_body(body: dict[str, Any], url: str, number: int, custom_id: str, strict: bool = False) -> Request:
    allowed = (*BODY_KEYS[url], ECHO_KEY) if url == COMPLETIONS_URL else BODY_KEYS[url]
    for key in body:
        if key not in allowed:
            other = next(u for u in BODY_KEYS if u != url)
            if key in BODY_KEYS[other]:
                raise _LineError(f"body.{key}: not a key of {url} (it belongs to {other})")
            raise _unknown(key, allowed, "body.")
    body = _given(body)
    prompt_only = url == COMPLETIONS_URL and type(body.get("max_tokens")) is int and body["max_tokens"] == 0
    if prompt_only:  # scoring a prompt (lm-evaluation-harness): no row's setting, SamplingConfig's >= 1 kept
        del body["max_tokens"]
    n = body.get("n", 1)
    if isinstance(n, bool) or n != 1:
        raise _LineError(f"body.n: only one choice per request is supported (n = 1), got {n!r}")
    if "max_tokens" in body and "max_completion_tokens" in body:
        raise _LineError("body: give max_tokens or max_completion_tokens, not both")
    sampling = {"max_tokens": "max_completion_tokens"} if "max_completion_tokens" in body else {}
    names = {key: sampling.get(key, key) for key in SAMPLING_KEYS}  # our key -> the body's name for it
    overrides = _overrides({key: body[name] for key, name in names.items() if name in body}, "body.", names)
    if "response_format" in body:
        overrides |= _constraint(lambda value: response_format(value, strict), body["response_format"])
    logprobs, top_logprobs = _logprobs(body, url)
    if url == CHAT_URL:
        if "messages" not in body:
            raise _LineError("body.messages: missing; a chat completion needs a list of {role, content}")
        return Request(
            line=number,
            custom_id=custom_id,
            messages=_messages(body["messages"], "body."),
            overrides=overrides,
            openai=True,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            **_tools(body),
        )
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        got = "missing" if prompt is None else f"got {prompt!r}"
        raise _LineError(f"body.prompt: expected one string ({got}); write one line per prompt")
    echo = body.get(ECHO_KEY, False)
    if not isinstance(echo, bool):
        raise _LineError(f"body.echo: expected true or false, got {echo!r}")
    return Request(
        line=number,
        custom_id=custom_id,
        prompt=prompt,
        raw=True,
        overrides=overrides,
        openai=True,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        echo=echo,
        prompt_only=prompt_only,
    )


def _tools(body: dict[str, Any]) -> dict[str, Any]:
    """A chat body's ``tools``, ``tool_choice`` and ``parallel_tool_calls`` as Request fields."""
    if "tools" not in body:
        for key in ("tool_choice", "parallel_tool_calls"):
            if key in body and body[key] != "none":
                raise _LineError(f"body.{key}: needs body.tools")
        return {}
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise _LineError(f"body.parallel_tool_calls: expected true or false, got {parallel!r}")
    try:
        tools = parse_tools(body["tools"], "body.tools")
        choice = parse_tool_choice(body.get("tool_choice"), tools, "body.tool_choice")
    except UserError as exc:
        raise _LineError(str(exc)) from None
    return {"tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel}


def _logprobs(body: dict[str, Any], url: str) -> tuple[bool, int]:
    """Chat: ``logprobs`` bool plus ``top_logprobs``; completions: the legacy integer."""
    limit = MAX_TOP_LOGPROBS[url]
    value = body.get("logprobs")
    if url == COMPLETIONS_URL:
        if value is None:
            return False, 0
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
            raise _LineError(
                f"body.logprobs: expected an integer in 0..{limit} (alternatives per token), got {value!r}"
            )
        return True, value
    if value is not None and not isinstance(value, bool):
        raise _LineError(f"body.logprobs: expected true or false, got {value!r}")
    top = body.get("top_logprobs")
    if top is None:
        return bool(value), 0
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= limit:
        raise _LineError(f"body.top_logprobs: expected an integer in 0..{limit}, got {top!r}")
    if not value:
        raise _LineError('body.top_logprobs: needs "logprobs": true')
    return True, top


def _overrides(values: dict[str, Any], where: str = "", names: dict[str, str] | None = None) -> dict[str, Any]:
    """Validated by ``SamplingConfig`` itself, so batch lines and flags share one set of ranges."""
    try:
        config = SamplingConfig.from_mapping(values)
    except ConfigError as exc:
        name = (names or {}).get(exc.key, exc.key)
        detail = str(exc).removeprefix(f"{exc.key}: ")
        raise _LineError(f"{where}{name}: {detail}") from None
    return {key: getattr(config, key) for key in values}


def _strict(given: dict[str, Any]) -> bool:
    """``strict_schema`` of our keys: a schema's unenforceable keywords refused, not left out."""
    try:
        return strict_schema(given)
    except ConstraintError as exc:
        raise _LineError(str(exc)) from None


def _constraint(parse: Any, value: Any) -> dict[str, Any]:
    """The ``constraint`` override of a line's constraint keys (none: nothing)."""
    try:
        constraint = parse(value)
    except ConstraintError as exc:
        raise _LineError(str(exc)) from None
    return {"constraint": constraint} if constraint is not None else {}


MESSAGE_KEYS = {"assistant": ("role", "content", "tool_calls"), "tool": ("role", "content", "tool_call_id")}


def _messages(value: Any, where: str = "") -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise _LineError(f"{where}messages: expected a non-empty list of {{role, content}} objects, got {value!r}")
    messages = []
    for i, message in enumerate(value):
        at = f"{where}messages[{i}]"
        if not isinstance(message, dict):
            raise _LineError(f"{at}: expected an object with role and content, got {message!r}")
        role = message.get("role")
        if role not in ROLES:
            raise _LineError(f"{at}.role: expected one of {', '.join(ROLES)}, got {role!r}")
        allowed = MESSAGE_KEYS.get(role, ("role", "content"))
        for key in message:
            if key not in allowed:
                raise _LineError(f"{at}.{key}: unknown key; allowed keys: {', '.join(allowed)}")
        role = "system" if role == "developer" else role
        calls = message.get("tool_calls")
        if calls is not None:
            out: dict[str, Any] = {"role": role, "content": "", "tool_calls": _calls(calls, f"{at}.tool_calls")}
            if message.get("content") is not None:
                out["content"] = _content(message["content"], f"{at}.content")
            messages.append(out)
            continue
        out = {"role": role, "content": _content(message.get("content"), f"{at}.content")}
        if role == "tool" and message.get("tool_call_id") is not None:
            out["tool_call_id"] = str(message["tool_call_id"])
        messages.append(out)
    return messages


def _calls(value: Any, at: str) -> list[dict[str, Any]]:
    """An assistant message's earlier calls, their arguments as objects (what templates render)."""
    if not isinstance(value, list) or not value:
        raise _LineError(f"{at}: expected a non-empty list of calls, got {value!r}")
    calls = []
    for i, call in enumerate(value):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        arguments = function.get("arguments", "{}") if isinstance(function, dict) else None
        if not isinstance(name, str) or not isinstance(arguments, str):
            raise _LineError(f'{at}[{i}]: expected {{"id", "type": "function", "function": {{"name", "arguments"}}}}, '
                             f"got {call!r}")  # fmt: skip
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            raise _LineError(f"{at}[{i}].function.arguments: not JSON text: {arguments!r}") from None
        entry = {"type": "function", "function": {"name": name, "arguments": parsed}}
        calls.append({"id": str(call["id"]), **entry} if call.get("id") is not None else entry)
    return calls


def _content(value: Any, at: str) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise _LineError(f"{at}: expected a string or a list of text parts, got {value!r}")
    texts = []
    for i, part in enumerate(value):
        ok = isinstance(part, dict) and part.keys() == {"type", "text"} and part["type"] == "text"
        if not ok or not isinstance(part["text"], str):
            raise _LineError(f'{at}[{i}]: only {{"type": "text", "text": STRING}} parts are supported, got {part!r}')
        texts.append(part["text"])
    return "\n".join(texts)


class BodyError(ValueError):
    """A request body that cannot run; the message starts with the key it names (``body.KEY:``)."""


def openai_body(body: dict[str, Any], url: str, custom_id: str, own: dict[str, Any] | None = None) -> Request:
    """One OpenAI request body as a server receives it, checked exactly as a batch line's body
    (``n`` left out: the server makes the choices); ``own``: llmsample's keys sent beside
    OpenAI's, sampling keys (``top_k``, ``min_p``, ...) checked with the same ranges and
    constraint keys (``regex``, ``choice``, ...) as a line of ours takes them."""
    own = _given(own or {})
    try:
        _check_unicode(body)
        _check_unicode(own)
        request = _openai_body(body, url, 0, custom_id, _strict(own))
        extra = _overrides({key: value for key, value in own.items() if key in SAMPLING_KEYS}, "body.")
        extra |= _constraint(request_constraint, own)
        if "constraint" in extra and "constraint" in request.overrides:
            given = next(key for key in CONSTRAINT_KEYS if key in own)
            raise _LineError(f"{given}: response_format is a constraint too; give one of them")
    except _LineError as exc:
        raise BodyError(str(exc)) from None
    return dataclasses.replace(request, overrides={**request.overrides, **extra})
