"""What every command's options are built with: groups of options under one ``--help`` heading,
and the check that a text option is UTF-8."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from llmsample.errors import UserError


def option_group(*decorators: Callable[[Any], Any], panel: str | None = None) -> Callable[[Any], Any]:
    """Several options as one decorator; ``panel``: the heading they are listed under in ``--help``
    (rich-click reads an option's ``panel``)."""

    def apply(f: Any) -> Any:
        before = len(getattr(f, "__click_params__", []))
        for decorator in reversed(decorators):
            f = decorator(f)
        if panel is not None:
            for param in f.__click_params__[before:]:
                param.panel = getattr(param, "panel", None) or panel
        return f

    return apply


def check_utf8(text: str, source: str) -> str:
    """Bytes that are not UTF-8 reach Python as lone surrogates (argv) and fail deep in the
    tokenizer, after the model load; the same one line as for invalid stdin, up front."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        byte = len(text[: exc.start].encode("utf-8"))
        raise UserError(f"{source} is not valid UTF-8 (byte {byte}); convert it, e.g. with iconv -t UTF-8") from exc
    return text


def check_utf8_option(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Click callback for text options (one value or a tuple of them)."""
    for text in value if isinstance(value, tuple) else [value]:
        if text is not None:
            check_utf8(text, param.opts[0])
    return value
