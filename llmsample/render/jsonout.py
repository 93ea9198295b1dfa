"""Strict JSON for everything written to stdout (JSONL records, preset values); no torch, so the
light commands stay light."""

from __future__ import annotations

import json
import math
from typing import Any

from llmsample.errors import RuntimeFailure


def strict_json(data: Any, name: str = "a value") -> str:
    """JSON as every parser reads it: NaN and Infinity are not JSON, so a non-finite number
    (a bug upstream) fails the run in one line, naming the field, instead of corrupting output."""
    try:
        return json.dumps(data, ensure_ascii=False, allow_nan=False)
    except ValueError as exc:
        where = _non_finite_field(data) or name
        raise RuntimeFailure(
            f"refusing to write invalid JSON: {where} is NaN or infinite (a bug; please report it)"
        ) from exc


def _non_finite_field(data: Any, path: str = "") -> str | None:
    """Where the first non-finite number sits, as ``top[1].prob``."""
    if isinstance(data, float) and not math.isfinite(data):
        return path
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list | tuple) else ()
    for key, value in items:
        found = _non_finite_field(value, f"{path}.{key}" if isinstance(key, str) else f"{path}[{key}]")
        if found:
            return found.lstrip(".")
    return None
