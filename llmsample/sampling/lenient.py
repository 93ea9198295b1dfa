"""Schemas from the wild, read as a validator reads them: what llguidance cannot enforce is left
unenforced and named, never a refusal (``--strict-schema`` keeps the refusal). llguidance's own
``lenient`` and ``coerce_one_of`` options leave out the keywords it does not implement and
enforce ``oneOf`` as ``anyOf``; its warnings name them (:func:`ignored_keywords`). Two things
its options do not cover are taken out of the schema before it compiles (:func:`loosened`): a
``pattern`` in a regex dialect it does not read (look-around, backreferences), and a ``$schema``
naming a dialect it does not know (a validator falls back to its default dialect too)."""

from __future__ import annotations

import json
import re
from typing import Any

OPTIONS: dict[str, Any] = {"coerce_one_of": True, "lenient": True}
"""llguidance's options for the lenient compile."""

VALUES = frozenset({"enum", "const", "default", "examples"})
"""Keys whose values are data, not schemas: a ``pattern`` key inside them is left as it is."""


def ignored_keywords(messages: list[str]) -> tuple[str, ...]:
    """The keywords llguidance's warnings name, in order, once each: ``Unimplemented keys:
    ["if", "then"] (2 times)`` gives ``if``, ``then``; ``Unknown format: x`` gives ``format: x``;
    the oneOf fallback gives ``oneOf`` (enforced as anyOf: one branch, not exactly one)."""
    found: list[str] = []
    for message in messages:
        if message.startswith("Unimplemented keys:"):
            listed = re.sub(r"\s*\(\d+ times\)$", "", message.split(":", 1)[1])
            try:
                found += [str(key) for key in json.loads(listed)]
            except ValueError:
                found.append(message)
        elif message.startswith("Unknown format:"):
            found.append("format: " + message.split(":", 1)[1].strip())
        elif message.startswith("oneOf"):
            found.append("oneOf")
    return tuple(dict.fromkeys(found))


def loosened(schema: Any) -> tuple[Any, tuple[str, ...]]:
    """``schema`` without the patterns llguidance cannot read, and what was taken out
    (``pattern: REGEX``); the schema itself when nothing was."""
    removed: list[str] = []

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(item) for item in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str) and not _readable(value):
                removed.append(f"pattern: {value}")
            else:
                out[key] = value if key in VALUES else walk(value)
        return out

    result = walk(schema)
    return (result, tuple(dict.fromkeys(removed))) if removed else (schema, ())


_READABLE: dict[str, bool] = {}


def _readable(pattern: str) -> bool:
    """Whether llguidance's regex engine reads ``pattern`` (an invalid one is left for the
    compile to refuse: only a feature it lacks is loosened)."""
    if pattern not in _READABLE:
        from llguidance import LLMatcher

        is_error, messages = LLMatcher.validate_grammar_with_warnings(LLMatcher.grammar_from_regex(pattern), None)
        _READABLE[pattern] = not (is_error and "not supported" in " ".join(messages))
    return _READABLE[pattern]


def unknown_dialect(schema: Any, message: str) -> str | None:
    """The top-level ``$schema`` llguidance tried and failed to fetch (an unknown dialect's
    URI), when ``message`` says so; None otherwise."""
    uri = schema.get("$schema") if isinstance(schema, dict) else None
    if isinstance(uri, str) and f"Resource '{uri.rstrip('#')}'" in message:
        return uri
    return None


def warning(origin: str, ignored: tuple[str, ...]) -> str | None:
    """The one warning line for a schema's unenforced keywords; None when every one is enforced."""
    if not ignored:
        return None
    return f"{origin}: not enforced (llguidance cannot): {', '.join(ignored)}; --strict-schema refuses such a schema"
