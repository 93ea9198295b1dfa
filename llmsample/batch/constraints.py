"""A batch request's constraint: our keys (``json``, ``json_schema``, ``regex``, ``choice``,
``grammar``) or an OpenAI body's ``response_format``, compiled per line so a bad one fails that
line alone (each row then has its own grammar, in one batch)."""

from __future__ import annotations

from typing import Any

from llmsample.errors import UserError
from llmsample.sampling import constraint as constraints
from llmsample.sampling.constraint import Constraint

KEYS = ("json", "json_schema", "regex", "choice", "grammar")
STRICT_KEY = "strict_schema"
"""``true``: a schema with keywords llguidance cannot enforce is refused (``--strict-schema``)."""


class ConstraintError(ValueError):
    """A request's constraint that cannot be compiled; the message names the key."""


def _compiled(make: Any, *args: Any) -> Constraint:
    try:
        return make(*args)
    except UserError as exc:
        raise ConstraintError(str(exc)) from None


def strict_schema(given: dict[str, Any]) -> bool:
    """The request's ``strict_schema`` key (not given: lenient)."""
    value = given.get(STRICT_KEY, False)
    if not isinstance(value, bool):
        raise ConstraintError(f"{STRICT_KEY}: expected true or false, got {value!r}")
    return value


def request_constraint(given: dict[str, Any]) -> Constraint | None:
    """From a request's own keys; at most one of them."""
    strict = strict_schema(given)
    keys = [key for key in KEYS if key in given]
    if not keys:
        return None
    if len(keys) > 1:
        raise ConstraintError(f"{keys[0]} and {keys[1]} are two constraints; give one")
    key, value = keys[0], given[keys[0]]
    if key == "json":
        if not isinstance(value, bool):
            raise ConstraintError(f"json: expected true or false, got {value!r}")
        return _compiled(constraints.any_json, "json") if value else None
    if key == "json_schema":
        return _compiled(constraints.json_schema, value, "json_schema", strict)
    if key == "choice":
        texts = [value] if isinstance(value, str) else value
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise ConstraintError(f"choice: expected a string or a list of strings, got {value!r}")
        return _compiled(constraints.choice, texts, "choice")
    if not isinstance(value, str):
        raise ConstraintError(f"{key}: expected a string, got {value!r}")
    if key == "regex":
        return _compiled(constraints.regex, value, "regex")
    return _compiled(constraints.grammar, value, "grammar")


def response_format(value: Any, strict: bool = False) -> Constraint | None:
    """OpenAI's ``response_format``: ``{"type": "text" | "json_object" | "json_schema", ...}``."""
    where = "body.response_format"
    if not isinstance(value, dict) or value.get("type") not in ("text", "json_object", "json_schema"):
        raise ConstraintError(f'{where}: expected {{"type": "text" | "json_object" | "json_schema"}}, got {value!r}')
    kind = value["type"]
    extra = sorted(set(value) - ({"type", "json_schema"} if kind == "json_schema" else {"type"}))
    if extra:
        raise ConstraintError(f"{where}.{extra[0]}: unknown key for type {kind!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        return _compiled(constraints.any_json, where)
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise ConstraintError(f'{where}.json_schema: expected {{"name", "schema", "strict"}}, got {spec!r}')
    unknown = sorted(set(spec) - {"name", "schema", "strict", "description"})
    if unknown:
        raise ConstraintError(f"{where}.json_schema.{unknown[0]}: unknown key; allowed keys: name, schema, strict")
    return _compiled(constraints.json_schema, spec.get("schema", {}), f"{where}.json_schema.schema", strict)
