"""HTTP request bodies to requests the engine runs: OpenAI's keys checked exactly as a batch
line's (:func:`llmsample.batch.requests.openai_body`), plus what only a server takes (``n``,
``stream``, ``stream_options``, ``user``) and llmsample's own keys beside them (every sampling
key, ``preset``, and ``llmsample: {"tokens": "none" | "ids" | "full"}`` for our per-token
records). Any other key is a 400 naming it."""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from llmsample.batch.requests import BODY_KEYS, SAMPLING_KEYS, BodyError, Request, openai_body
from llmsample.batch.responses import TOKEN_LEVELS, TokenLevel
from llmsample.serve.errors import ApiError, bad_request

SERVER_KEYS = ("n", "stream", "stream_options", "user", "preset", "llmsample")
MAX_CHOICES = 16


@dataclass(frozen=True)
class ServeRequest:
    """One HTTP request: the engine's view (``request``) and how the answer is shaped."""

    request: Request
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    tokens: TokenLevel = "none"
    model: str | None = None
    max_tokens_key: str | None = None  # the body's name for max_tokens, when it gave one


MAX_DEPTH = 64
"""How deep a body's arrays and objects may nest: a JSON schema a few levels deep needs a
dozen; thousands would exhaust the parser's stack (and every recursive walk after it)."""


def load_json(raw: bytes) -> Any:
    """Strict JSON, else a 400: no NaN or infinities, no key twice in one object (parsers
    disagree on which one wins, so a proxy and this server could read two requests in one: it is
    refused, not guessed), no lone surrogate in a string (it is not text: no tokenizer takes it),
    nested at most :data:`MAX_DEPTH` deep."""
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_constant, object_pairs_hook=_unique)
    except UnicodeDecodeError:
        raise ApiError(400, "the body is not valid UTF-8") from None
    except RecursionError:
        raise ApiError(400, f"the body nests arrays or objects more than {MAX_DEPTH} deep") from None
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except ValueError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}") from None
    _check_tree(body)
    return body


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    body = dict(pairs)
    if len(body) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ApiError(400, f"{key}: given twice in one object; give each key once", key, "duplicate_key")
            seen.add(key)
    return body


def _check_tree(body: Any) -> None:
    """Depth and strings, without recursion (the depth is what is being checked)."""
    stack = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value)
            continue
        if isinstance(value, dict):
            for key in value:
                _check_text(key)
            value = list(value.values())
        if isinstance(value, list):
            if depth > MAX_DEPTH:
                raise ApiError(400, f"the body nests arrays or objects more than {MAX_DEPTH} deep")
            stack += [(item, depth + 1) for item in value]


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        raise ApiError(400, f"the body has a lone surrogate (\\u{code:04x}) in a string: not text") from None


def parse_body(body: Any, url: str, known_presets: Collection[str]) -> ServeRequest:
    """``body`` of a POST to ``url`` (chat or completions) as a :class:`ServeRequest`."""
    if not isinstance(body, dict):
        raise ApiError(400, f"the body must be a JSON object, got {type(body).__name__}")
    openai_keys = BODY_KEYS[url]
    own_keys = tuple(key for key in SAMPLING_KEYS if key not in openai_keys)
    allowed = (*openai_keys, *SERVER_KEYS, *own_keys)
    for key in body:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ApiError(400, f"{key}: unknown parameter{hint}", key, "unknown_parameter")
    given = {key: value for key, value in body.items() if value is not None}
    n = _choices(given.get("n", 1))
    stream = _flag(given, "stream")
    include_usage = _stream_options(given.get("stream_options"), stream)
    tokens = _tokens(given.get("llmsample"))
    preset = given.get("preset")
    if preset is not None and preset not in known_presets:
        raise ApiError(
            400, f"preset: unknown preset {preset!r}; choose one of: {', '.join(sorted(known_presets))}", "preset"
        )
    if "user" in given and not isinstance(given["user"], str):
        raise ApiError(400, f"user: expected a string, got {given['user']!r}", "user")
    model = given.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, f"model: expected a string, got {model!r}", "model")
    try:
        request = openai_body(
            {key: value for key, value in body.items() if key in openai_keys and key != "n"},
            url,
            "request",
            {key: body[key] for key in own_keys if key in body},
        )
    except BodyError as exc:
        raise bad_request(str(exc)) from None
    if preset is not None:
        request = dataclasses.replace(request, preset=preset)
    max_key = next((key for key in ("max_completion_tokens", "max_tokens") if key in given), None)
    return ServeRequest(request, n, stream, include_usage, tokens, model, max_key)


def _choices(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CHOICES:
        raise ApiError(400, f"n: expected an integer in 1..{MAX_CHOICES}, got {value!r}", "n")
    return value


def _flag(given: dict[str, Any], key: str) -> bool:
    value = given.get(key, False)
    if not isinstance(value, bool):
        raise ApiError(400, f"{key}: expected true or false, got {value!r}", key)
    return value


def _stream_options(value: Any, stream: bool) -> bool:
    if value is None:
        return False
    if not stream:
        raise ApiError(400, "stream_options: only goes with stream: true", "stream_options")
    if not isinstance(value, dict) or set(value) - {"include_usage", "continuous_usage_stats"}:
        raise ApiError(400, f'stream_options: expected {{"include_usage": BOOL}}, got {value!r}', "stream_options")
    usage = value.get("include_usage", False)
    if not isinstance(usage, bool):
        raise ApiError(400, f"stream_options.include_usage: expected true or false, got {usage!r}", "stream_options")
    return usage


def _tokens(value: Any) -> TokenLevel:
    if value is None:
        return "none"
    if not isinstance(value, dict) or set(value) - {"tokens"}:
        raise ApiError(400, f'llmsample: expected {{"tokens": "none" | "ids" | "full"}}, got {value!r}', "llmsample")
    level = value.get("tokens", "none")
    if level not in TOKEN_LEVELS:
        raise ApiError(400, f"llmsample.tokens: expected one of {', '.join(TOKEN_LEVELS)}, got {level!r}", "llmsample")
    return level
