"""HTTP request bodies to requests the engine runs: OpenAI's keys checked exactly as a batch
line's (:func:`llmsample.batch.requests.openai_body`), plus what only a server takes (``n``,
``stream``, ``stream_options``, ``user``, ``ignore_eos``; completions ``echo``, ``best_of`` and
a list of prompts) and llmsample's own keys beside them (every sampling and constraint key,
``preset``, and ``llmsample: {"tokens": "none" | "ids" | "full"}`` for our per-token records).
Other clients' keys are read first (:mod:`llmsample.serve.compat`): aliases renamed, hints
ignored with a warning, what would change the answer a 400 naming it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmsample.batch.constraints import KEYS as CONSTRAINT_KEYS
from llmsample.batch.constraints import STRICT_KEY
from llmsample.batch.requests import (
    BODY_KEYS,
    CHAT_URL,
    COMPLETIONS_URL,
    SAMPLING_KEYS,
    BodyError,
    Request,
    openai_body,
)
from llmsample.batch.result_lines import TOKEN_LEVELS, TokenLevel
from llmsample.serve.api_errors import ApiError, bad_request
from llmsample.serve.compat import translate

if TYPE_CHECKING:
    from llmsample.events import PromptLogprobs

SERVER_KEYS = (
    "n", "stream", "stream_options", "user", "preset", "llmsample",
    "ignore_eos", "stop_token_ids", "include_stop_str_in_output",
)  # fmt: skip
COMPLETION_KEYS = ("echo", "best_of")
MAX_CHOICES = 16


@dataclass(frozen=True)
class ServeRequest:
    """One HTTP request: the engine's view (``request``) and how the answer is shaped."""

    requests: tuple[Request, ...]  # one per prompt (completions take a list), n choices each
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    tokens: TokenLevel = "none"
    model: str | None = None
    max_tokens_key: str | None = None  # the body's name for max_tokens, when it gave one
    echo: bool = False  # completions: the prompt before each choice's text
    ignore_eos: bool = False  # vLLM's: decode to max_tokens, the end of text never drawn
    unlimited: bool = False  # max_tokens -1: to the end of the context
    stop_ids: tuple[int, ...] = ()  # vLLM's stop_token_ids: they end the text as the end of text does
    keep_stop: bool = False  # vLLM's include_stop_str_in_output
    warnings: tuple[str, ...] = ()  # keys ignored, one line each
    token_prompts: tuple[tuple[int, ...] | None, ...] = ()  # per prompt: its token ids, when sent as ids
    prompt_logprobs: tuple[PromptLogprobs, ...] = ()  # per prompt, echo with logprobs: its tokens scored

    @property
    def request(self) -> Request:
        """The first prompt's request: what every prompt of the body shares."""
        return self.requests[0]


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


def parse_body(body: Any, url: str, known_presets: Collection[str], strict: bool = False) -> ServeRequest:
    """``body`` of a POST to ``url`` (chat or completions) as a :class:`ServeRequest`; other
    clients' keys are read first (:mod:`llmsample.serve.compat`; ``strict``: none ignored)."""
    if not isinstance(body, dict):
        raise ApiError(400, f"the body must be a JSON object, got {type(body).__name__}")
    openai_keys = (*BODY_KEYS[CHAT_URL], *BODY_KEYS[COMPLETIONS_URL])  # the other's: refused as a batch line's
    own_keys = tuple(key for key in (*SAMPLING_KEYS, *CONSTRAINT_KEYS, STRICT_KEY) if key not in openai_keys)
    extra = COMPLETION_KEYS if url == COMPLETIONS_URL else ()
    read = translate(body, (*openai_keys, *SERVER_KEYS, *extra, *own_keys), strict)
    body = read.body
    given = {key: value for key, value in body.items() if value is not None}
    n = _choices(given.get("n", 1))
    stream = _flag(given, "stream")
    include_usage = _stream_options(given.get("stream_options"), stream, read.warnings, strict)
    tokens = _tokens(given.get("llmsample"))
    _check_names(given, known_presets)
    _best_of(given.get("best_of"), n)
    prompts = _prompts(given.get("prompt"), n) if url == COMPLETIONS_URL else [None]
    requests = []
    for prompt in prompts:
        openai = {key: value for key, value in body.items() if key in openai_keys and key != "n"}
        if prompt is not None:
            openai["prompt"] = "" if isinstance(prompt, tuple) else prompt  # ids: the text comes with the tokenizer
        try:
            request = openai_body(openai, url, "request", {key: body[key] for key in own_keys if key in body})
        except BodyError as exc:
            raise bad_request(str(exc)) from None
        if given.get("preset") is not None:
            request = dataclasses.replace(request, preset=given["preset"])
        requests.append(request)
    read.warnings += _unenforced(requests[0])
    max_key = next((key for key in ("max_completion_tokens", "max_tokens") if key in given), None)
    if read.unlimited and max_key is not None:
        raise ApiError(400, f"{max_key}: -1 (no limit) and a limit given twice; give one", max_key)
    return ServeRequest(
        tuple(requests), n, stream, include_usage, tokens, given.get("model"), max_key,
        echo=_flag(given, "echo"), ignore_eos=_flag(given, "ignore_eos"), unlimited=read.unlimited,
        stop_ids=_token_ids(given.get("stop_token_ids", [])), keep_stop=_flag(given, "include_stop_str_in_output"),
        warnings=tuple(read.warnings), token_prompts=tuple(p if isinstance(p, tuple) else None for p in prompts),
    )  # fmt: skip


def _unenforced(request: Request) -> list[str]:
    """A lenient schema's warning line (its keywords llguidance left unenforced), if any."""
    from llmsample.sampling.lenient import warning as unenforced

    constraint = request.overrides.get("constraint")
    warning = unenforced(constraint.origin, constraint.ignored) if constraint is not None else None
    return [warning] if warning else []


def _check_names(given: dict[str, Any], known_presets: Collection[str]) -> None:
    preset = given.get("preset")
    if preset is not None and preset not in known_presets:
        raise ApiError(
            400, f"preset: unknown preset {preset!r}; choose one of: {', '.join(sorted(known_presets))}", "preset"
        )
    for key in ("user", "model"):
        if key in given and not isinstance(given[key], str):
            raise ApiError(400, f"{key}: expected a string, got {given[key]!r}", key)


def _best_of(value: Any, n: int) -> None:
    """``best_of`` equal to ``n`` asks for nothing more; a larger one would rank candidates."""
    if value is not None and (isinstance(value, bool) or value != n):
        raise ApiError(
            400, f"best_of: {value!r} would rank candidates, which this server does not; give n only", "best_of"
        )


def _token_ids(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(_is_id(i) for i in value):
        raise ApiError(400, f"stop_token_ids: expected a list of token ids, got {value!r}", "stop_token_ids")
    return tuple(value)


def _prompts(value: Any, n: int) -> list[Any]:
    """A completion's prompts, as OpenAI takes them: a string, token ids, or a list of either
    (each prompt gets ``n`` choices, in order); token ids come as a tuple."""
    if not isinstance(value, list):
        return [value]
    if value and all(_is_id(item) for item in value):
        value = [value]
    if not value or not all(isinstance(item, str) or _ids(item) for item in value):
        raise ApiError(
            400, f"prompt: expected a string, token ids, or a non-empty list of them; got {value!r}", "prompt"
        )
    if len(value) * n > MAX_CHOICES:
        raise ApiError(400, f"prompt: {len(value)} prompts with n {n} make over {MAX_CHOICES} choices", "prompt")
    return [item if isinstance(item, str) else tuple(item) for item in value]


def _is_id(item: Any) -> bool:
    return isinstance(item, int) and not isinstance(item, bool) and item >= 0


def _ids(item: Any) -> bool:
    return isinstance(item, list) and bool(item) and all(_is_id(i) for i in item)


def _choices(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CHOICES:
        raise ApiError(400, f"n: expected an integer in 1..{MAX_CHOICES}, got {value!r}", "n")
    return value


def _flag(given: dict[str, Any], key: str) -> bool:
    value = given.get(key, False)
    if not isinstance(value, bool):
        raise ApiError(400, f"{key}: expected true or false, got {value!r}", key)
    return value


def _stream_options(value: Any, stream: bool, warnings: list[str], strict: bool) -> bool:
    if value is None:
        return False
    if not stream:
        raise ApiError(400, "stream_options: only goes with stream: true", "stream_options")
    if not isinstance(value, dict) or set(value) - {"include_usage", "continuous_usage_stats"}:
        raise ApiError(400, f'stream_options: expected {{"include_usage": BOOL}}, got {value!r}', "stream_options")
    if value.get("continuous_usage_stats"):
        where, why = "stream_options.continuous_usage_stats", "usage comes in the last chunk only"
        if strict:
            raise ApiError(400, f"{where}: {why}", "stream_options", "unknown_parameter")
        warnings.append(f"{where}: ignored ({why})")
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
