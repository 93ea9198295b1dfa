"""llmsample: generate text with a Hugging Face causal LM and see how every token was sampled.

``llmsample.Engine`` is the Python API (docs/python.md); it is imported when first used, so the
CLI's start-up does not pay for it."""

from __future__ import annotations

from typing import Any

from llmsample.version import __version__

__all__ = ["Engine", "Result", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("Engine", "Result"):
        from llmsample.api import public

        return getattr(public, name)
    raise AttributeError(f"module 'llmsample' has no attribute {name!r}")
