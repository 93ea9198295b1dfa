"""A chat template rendered with jinja2 exactly as transformers' ``apply_chat_template`` renders
it (``transformers.utils.chat_template_utils``), without importing transformers' package (0.6 s of
a cold llama.cpp start): the same sandboxed environment (trim_blocks, lstrip_blocks, loop
controls, the ``{% generation %}`` tag), the same globals (``raise_exception``, ``strftime_now``,
``dict``, a ``namespace`` refusing underscore names), the same ``tojson`` filter, and the same
variables (the messages with None values dropped and reasoning aliased, ``tools``, ``documents``,
``add_generation_prompt``, the named special tokens, extra keyword arguments).

Proven equal to transformers' rendering in tests/models/test_fast_tokenizer.py."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import cache
from typing import Any

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # transformers' _REASONING_FIELDS


def render(template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
           documents: list[dict[str, Any]] | None = None, add_generation_prompt: bool = False,
           **variables: Any) -> str:  # fmt: skip
    """One conversation through ``template``, as ``render_jinja_template`` renders it without
    ``continue_final_message`` or assistant masks; ``variables``: the special tokens and extra
    keyword arguments (which win over the special tokens, as there)."""
    chat = [{k: v for k, v in message.items() if v is not None} for message in messages]
    if documents is not None and not all(isinstance(d, dict) for d in documents):
        raise TypeError("Documents should be a list of dicts with 'title' and 'text' keys!")
    if tools is not None and not all(isinstance(tool, dict) for tool in tools):
        raise ValueError("tools: only JSON schemas (dicts) here")  # the caller falls back before this
    return compiled(template).render(
        messages=aliased(plain(chat)), tools=plain(tools), documents=plain(documents),
        add_generation_prompt=add_generation_prompt, **plain(variables),
    )  # fmt: skip


def plain(value: Any) -> Any:
    """What the template may see: plain JSON types rebuilt (subclasses stripped), anything else a
    placeholder naming its type, as ``_plain_template_data`` (dataclasses and pydantic models
    aside: the callers here pass JSON)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain(key): plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(plain(item) for item in value)
    return f"<{type(value).__name__}>"


def aliased(chat: list[Any]) -> list[Any]:
    """A message's reasoning under every name templates read (``_alias_reasoning_fields``)."""
    out = []
    for message in chat:
        if isinstance(message, dict):
            reasoning = next((message[key] for key in REASONING_FIELDS if message.get(key) is not None), None)
            if reasoning is not None:
                message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


@cache
def compiled(template: str) -> Any:
    """``template`` compiled in transformers' environment, once per process."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: transformers marks the assistant's text
        with it for its masks; rendering only emits the body."""

        tags = {"generation"}  # noqa: RUF012 (jinja's own class attribute)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                TemplateNamespace.check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace.check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                    "Please rename the attribute."
                )

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:  # fmt: skip
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])  # fmt: skip
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env.from_string(template)
