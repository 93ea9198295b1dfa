"""``/tokenize`` and ``/detokenize`` (vLLM's shapes): what a prompt costs in tokens, and the text
of ids, without decoding anything."""

from __future__ import annotations

from typing import Any

from llmsample.batch.requests import _LineError, _messages
from llmsample.engine.prompt import encode_messages
from llmsample.errors import UserError
from llmsample.models.loading import LoadedModel
from llmsample.serve.api_errors import ApiError, bad_request


def _keys(body: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, f"the body must be a JSON object, got {type(body).__name__}")
    for key in body:
        if key not in allowed:
            raise ApiError(400, f"{key}: unknown parameter; allowed: {', '.join(allowed)}", key, "unknown_parameter")
    return {key: value for key, value in body.items() if value is not None}


def tokenize_body(lm: LoadedModel, body: Any) -> dict[str, Any]:
    """``prompt`` (plain text, special tokens added as the tokenizer does) or ``messages``."""
    given = _keys(body, ("model", "prompt", "messages", "add_special_tokens"))
    if ("prompt" in given) == ("messages" in given):
        raise ApiError(400, "give exactly one of prompt (a string) and messages (a list of {role, content})")
    if "prompt" in given:
        prompt, special = given["prompt"], given.get("add_special_tokens", True)
        if not isinstance(prompt, str):
            raise ApiError(400, f"prompt: expected a string, got {prompt!r}", "prompt")
        if not isinstance(special, bool):
            raise ApiError(400, f"add_special_tokens: expected true or false, got {special!r}", "add_special_tokens")
        ids = lm.tokenizer(prompt, add_special_tokens=special)["input_ids"]
    else:
        try:
            messages = _messages(given["messages"])
            ids = encode_messages(lm, messages)[0].tolist()
        except _LineError as exc:
            raise bad_request(str(exc)) from None
        except UserError as exc:
            raise ApiError(400, str(exc), "messages") from None
    return {"tokens": ids, "count": len(ids), "max_model_len": lm.context_length}


def detokenize_body(lm: LoadedModel, body: Any) -> dict[str, Any]:
    given = _keys(body, ("model", "tokens"))
    ids = given.get("tokens")
    size = len(lm.tokenizer)
    ok = isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < size for i in ids)
    if not ok:
        raise ApiError(400, f"tokens: expected a list of token ids in 0..{size - 1}, got {ids!r}", "tokens")
    return {"prompt": lm.tokenizer.decode(ids)}
