"""What other clients send, read as this server's keys before the body is checked: a client's
first request should not be a 400 because its library adds a key we do not act on (vLLM and
llama-server learned this). Every key gets one of three outcomes (the table in
docs/serve-api.md):

- **implemented**: other servers' names for our keys (``ALIASES``) and the values peers give a
  meaning (``seed: -1`` random, ``max_tokens: -1`` to the end of the context, a message's
  ``name`` dropped);
- **ignored with a warning** (``HINTS``, and any key nobody knows): it would change nothing
  here; the answer's ``warnings`` and its ``X-Llmsample-Warnings`` header say so, and the
  request's line of the access log names the keys;
- **refused** (``REFUSED``): ignoring it would silently change the answer.

``strict`` (``serve --strict-api``) refuses every key that would be ignored, as the server did
before it read other clients' keys."""

from __future__ import annotations

import difflib
import json
from collections.abc import Collection, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmsample.serve.access import WARNINGS
from llmsample.serve.api_errors import ApiError

ALIASES = {
    "n_predict": "max_tokens",  # llama-server
    "repeat_penalty": "repetition_penalty",  # llama-server
    "guided_json": "json_schema",  # vLLM
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}
HINTS = {
    "metadata": "this server stores no requests",
    "store": "this server stores no requests",
    "service_tier": "this server has one tier",
    "prompt_cache_key": "the prompt cache (--prompt-cache-mb) finds a prompt's cached prefix by its tokens, with no key",
    "cache_prompt": "the prompt cache (--prompt-cache-mb) serves every request; a request cannot turn it off",
    "reasoning_effort": "the model reasons as its chat template has it",
    "skip_special_tokens": "special tokens other than the end of text are written as text",
    "guided_decoding_backend": "constraints always run on llguidance",
}
REFUSED = {
    "functions": "the legacy function calls are not supported; send tools",
    "function_call": "the legacy function calls are not supported; send tools and tool_choice",
    "suffix": "insertion (text after the completion) is not supported",
    "chat_template_kwargs": "the chat template's variables cannot be set per request",
    "use_beam_search": "beam search is not supported",
    "length_penalty": "beam search is not supported",
}


@dataclass
class Translated:
    """The body in our keys, what was ignored (one line each), and ``max_tokens: -1``."""

    body: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    unlimited: bool = False


def translate(body: dict[str, Any], allowed: Collection[str], strict: bool) -> Translated:
    """``body`` with aliases renamed and ignored keys dropped; a refused key is a 400."""
    out = Translated({})
    for key, value in body.items():
        name = ALIASES.get(key, key)
        if key in REFUSED:
            raise ApiError(400, f"{key}: {REFUSED[key]}", key, "unsupported_parameter")
        if name in out.body or (name != key and name in body):
            raise ApiError(400, f"{key}: another name for {name}; give one of them", key)
        if name in allowed:
            out.body[name] = value
        else:
            out.warnings.append(_ignored(key, allowed, strict))
    for key in ("max_tokens", "max_completion_tokens"):
        if out.body.get(key) == -1:
            del out.body[key]
            out.unlimited = True
    if out.body.get("seed") == -1:  # llama-server's "random"
        del out.body["seed"]
    if isinstance(out.body.get("messages"), list):
        out.body["messages"] = [_unnamed(message, i, out, strict) for i, message in enumerate(out.body["messages"])]
    return out


def _ignored(key: str, allowed: Collection[str], strict: bool) -> str:
    if key in HINTS:
        reason = HINTS[key]
    else:
        close = difflib.get_close_matches(key, list(allowed), n=1)
        reason = "unknown parameter" + (f"; did you mean {close[0]!r}?" if close else "")
    if strict:
        raise ApiError(400, f"{key}: {reason}", key, "unknown_parameter")
    return f"{key}: ignored ({reason})"


def _unnamed(message: Any, index: int, out: Translated, strict: bool) -> Any:
    """A message's ``name`` (AutoGen, CrewAI): chat templates take a role and content only."""
    if not isinstance(message, dict) or "name" not in message:
        return message
    where = f"messages[{index}].name"
    if strict:
        raise ApiError(400, f"{where}: unknown key; allowed keys: role, content", where, "unknown_parameter")
    out.warnings.append(f"{where}: ignored (the chat template gets each message's role and content)")
    return {key: value for key, value in message.items() if key != "name"}


WARNINGS_HEADER = "X-Llmsample-Warnings"


def warned(scope: MutableMapping[str, Any], warnings: Sequence[str]) -> dict[str, str]:
    """The answer's headers for ``warnings`` (a JSON list: a client that reads no extra field of a
    body or a stream's first event still sees them), noted for the request's access-log line."""
    if not warnings:
        return {}
    scope[WARNINGS] = list(warnings)
    return {WARNINGS_HEADER: json.dumps(list(warnings))}  # ASCII: a header's value is latin-1
