"""Tool calls under an exact grammar: the call formats chat templates use (one table), the tools
a request offers, the grammar built from their parameter schemas, and the text split back into
content and calls. Package-neutral: the server, batch lines and any other endpoint call

- :func:`parse_tools` (``body.tools``) and :func:`parse_tool_choice` (``body.tool_choice``),
- :func:`call_format` (the format a chat template speaks, from its text),
- :func:`tool_constraint` (the grammar: enforced from the first token, so exact under
  speculation as every constraint is),
- :func:`split_tool_calls` (an answer's text to its content and calls; a prefix of a stream's
  text too, with what may still become a call held back).

The grammar for ``auto`` is ``FREE | FREE TRIGGER calls``: free text that cannot hold the
trigger, as one lexeme with the trigger, so llguidance's greedy lexer never has to undo a
lexeme; a model that writes the trigger is in the call's grammar from that byte on."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from llmsample.errors import UserError
from llmsample.sampling.constraint import JSON_OPTIONS, Constraint, _check

NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""OpenAI's function names (letters, digits, ``_``, ``-``; we allow ``.`` as vLLM does)."""


@dataclass(frozen=True)
class CallFormat:
    """How a template's model writes calls: ``prefix`` before the first call, each call as
    ``open`` + ``{"name": NAME, "<key>": ARGS}`` + ``close``, calls apart by ``sep`` (None: one
    call at most), ``suffix`` after the last. ``anywhere``: calls may follow text (else the
    answer is text or calls). ``marker``: the text in a template that says it speaks this format."""

    name: str
    marker: str
    prefix: str = ""
    open: str = ""
    close: str = ""
    sep: str | None = None
    suffix: str = ""
    key: str = "arguments"
    anywhere: bool = False
    starts: str = ""  # the text that shows calls have begun, when not the whole trigger

    @property
    def trigger(self) -> str:
        """The text that starts the calls."""
        return self.prefix + self.open

    @property
    def begins(self) -> str:
        """The text an answer that calls starts with (or, ``anywhere``, holds): free text never does."""
        return self.starts or self.trigger


FORMATS = (
    CallFormat("hermes", "<tool_call>", open="<tool_call>\n", close="\n</tool_call>", sep="\n", anywhere=True,
               starts="<tool_call>"),
    CallFormat("mistral", "[TOOL_CALLS]", prefix="[TOOL_CALLS][", sep=", ", suffix="]"),
    CallFormat("llama3", "<|python_tag|>", key="parameters", starts="{"),
    CallFormat("generic", "", prefix='{"tool_calls": [', sep=", ", suffix="]}"),
)
"""Hermes/Qwen ``<tool_call>`` JSON, Mistral ``[TOOL_CALLS]``, Llama 3.x JSON, and the generic
form for templates that render no tools (the tools then go into a system message). A new
format is a row here; the first whose marker the template holds wins."""

GENERIC = FORMATS[-1]


def call_format(template: str | None) -> CallFormat:
    """The format a chat template's model calls tools in: the first row of :data:`FORMATS` whose
    marker it holds when it renders ``tools``; else the generic form."""
    if template and "tools" in template:
        for fmt in FORMATS[:-1]:
            if fmt.marker in template:
                return fmt
    return GENERIC


@dataclass(frozen=True)
class Tool:
    """One function a request offers: its name, description and parameters' JSON Schema."""

    name: str
    description: str = ""
    parameters: str = '{"type": "object"}'  # the schema's JSON text (hashable)

    @property
    def schema(self) -> dict[str, Any]:
        return json.loads(self.parameters)

    def openai(self) -> dict[str, Any]:
        """As ``apply_chat_template(tools=...)`` and OpenAI take it."""
        function = {"name": self.name, "description": self.description, "parameters": self.schema}
        return {"type": "function", "function": function}


def parse_tools(value: Any, where: str = "tools") -> tuple[Tool, ...]:
    """``body.tools``: ``[{"type": "function", "function": {name, description?, parameters?,
    strict?}}]``; a bad entry is a ``UserError`` naming it."""
    if not isinstance(value, list) or not value:
        raise UserError(f"{where}: expected a non-empty list of {{type: function, function}} objects, got {value!r}")
    tools: list[Tool] = []
    for i, entry in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(entry, dict) or entry.get("type") != "function" or not isinstance(entry.get("function"), dict):
            raise UserError(f'{at}: expected {{"type": "function", "function": {{...}}}}, got {entry!r}')
        function = entry["function"]
        unknown = sorted(set(function) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise UserError(f"{at}.function.{unknown[0]}: unknown key; allowed: name, description, parameters, strict")
        name = function.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise UserError(f"{at}.function.name: expected letters, digits, _ . - (at most 64), got {name!r}")
        if any(tool.name == name for tool in tools):
            raise UserError(f"{at}.function.name: {name!r} is offered twice")
        parameters = function.get("parameters", {"type": "object"})
        if not isinstance(parameters, dict):
            raise UserError(f"{at}.function.parameters: expected a JSON Schema object, got {parameters!r}")
        description = function.get("description") or ""
        if not isinstance(description, str):
            raise UserError(f"{at}.function.description: expected a string, got {description!r}")
        tools.append(Tool(name, description, json.dumps(parameters)))
    return tuple(tools)


def parse_tool_choice(value: Any, tools: tuple[Tool, ...], where: str = "tool_choice") -> str:
    """``auto`` | ``none`` | ``required`` | ``{"type": "function", "function": {"name"}}``: the
    mode, or the one function's name."""
    if value is None:
        return "auto"
    if value in ("auto", "none", "required"):
        return value
    function = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise UserError(f'{where}: expected "auto", "none", "required" or {{"type": "function", "function": '
                        f'{{"name": NAME}}}}, got {value!r}')  # fmt: skip
    if not any(tool.name == name for tool in tools):
        raise UserError(f"{where}: {name!r} is not one of the tools offered ({', '.join(t.name for t in tools)})")
    return name


@dataclass(frozen=True)
class Reasoning:
    """A template's thinking block: ``open`` ... ``close``; ``started``: the prompt opened it."""

    open: str = "<think>"
    close: str = "</think>"
    started: bool = False


def reasoning_of(template: str | None, prompt_text: str = "") -> Reasoning | None:
    """The thinking block a template has (``<think>``), and whether its prompt opened it."""
    if not template or "<think>" not in template:
        return None
    return Reasoning(started=prompt_text.rstrip().endswith("<think>"))


def _lit(text: str) -> str:
    return json.dumps(text) if text else ""


def _rx(text: str) -> str:
    """``text`` as a regex inside a lark ``/.../`` (slashes and line ends escaped)."""
    special = {"\n": "\\n", "\t": "\\t", "/": "\\/"}
    return "".join(special.get(char) or re.escape(char) for char in text)


def _free(avoid: str) -> str:
    """A lark terminal expression: any text that does not hold ``avoid``."""
    return f"/(?s:.*)/ & ~/(?s:.*{_rx(avoid)}.*)/"


def tool_constraint(
    tools: tuple[Tool, ...], choice: str, fmt: CallFormat, parallel: bool = True, reasoning: Reasoning | None = None
) -> Constraint | None:
    """The grammar of an answer under ``tool_choice`` (``none``: None, no constraint): for
    ``required`` or a name, calls from the first token (after the thinking block); for ``auto``,
    text or calls as the format allows, the calls' JSON built from the tools' schemas."""
    if choice == "none":
        return None
    offered = [tool for tool in tools if choice in ("auto", "required", tool.name)]
    variants = [
        {"type": "object", "properties": {"name": {"const": tool.name}, fmt.key: tool.schema},
         "required": ["name", fmt.key], "additionalProperties": False}
        for tool in offered
    ]  # fmt: skip
    schema = {**(variants[0] if len(variants) == 1 else {"anyOf": variants}), "x-guidance": JSON_OPTIONS}
    call = f"%json {json.dumps(schema)} {_lit(fmt.close)}"
    more = f' ({_lit(fmt.sep)} {_lit(fmt.open)} call)*' if parallel and fmt.sep is not None else ""
    rules = [f"calls: call{more} {_lit(fmt.suffix)}", f"call: {call}", f"FREE: {_free(fmt.begins)}"]
    think, first = "", _rx(fmt.begins)
    if reasoning is not None:
        opened = "" if reasoning.started else f"{json.dumps(reasoning.open)} "
        rules.append(f"THINK: {opened}{_free(reasoning.close)} {json.dumps(reasoning.close)} /\\s*/")
        think = "THINK " if reasoning.started else "THINK? "
        first += "" if reasoning.started else "|" + _rx(reasoning.open)
    if choice != "auto":
        rules.append(f"start: {think}{_lit(fmt.trigger)} calls")
    elif fmt.anywhere:
        rules += ["start: FREE | OPEN calls", f"OPEN: FREE {json.dumps(fmt.trigger)}"]
    else:  # text that does not start as calls (nor as the thinking block), or calls
        rules[2] = f"FREE: /(?s:.*)/ & ~/(?s:({first}).*)/"
        rules.append(f"start: {think}(FREE | {_lit(fmt.trigger)} calls)")
    from llguidance import LLMatcher

    origin = "tools" if choice in ("auto", "required") else f"tool_choice {choice}"
    try:
        text = LLMatcher.grammar_from_lark("\n".join(rules))
    except ValueError as exc:
        raise UserError(f"{origin}: {' '.join(str(exc).split())}") from exc
    return Constraint("tools", _check(text, origin, "leave this keyword out of the tool's parameters"), origin)


@dataclass(frozen=True)
class Call:
    """One call as written: its name and its arguments' JSON text (as the model wrote it);
    ``complete``: its JSON has ended (a stream's last call, or one cut short, may not have);
    ``ends``: only the calls' closing text follows it, whole or begun (no other call was begun)."""

    name: str
    arguments: str
    complete: bool = True
    ends: bool = False


def split_tool_calls(text: str, fmt: CallFormat, final: bool = True) -> tuple[str, list[Call]]:
    """``text`` as its content (before the calls) and its calls, the last of which may be
    incomplete. ``final``: the whole answer (with no complete call, all its text is content: a
    call cut short alone is no call); else a stream's prefix: content that may still turn into
    the trigger is held back."""
    begun = len(text) - len(text.lstrip())
    at = text.find(fmt.trigger) if fmt.anywhere else (begun if text.startswith(fmt.begins, begun) else -1)
    if at < 0:
        if final:
            return text, []
        if fmt.anywhere:
            keep = next((n for n in range(len(fmt.trigger) - 1, 0, -1) if text.endswith(fmt.trigger[:n])), 0)
            return text[: len(text) - keep], []
        return ("" if fmt.begins.startswith(text.lstrip()) else text), []
    content, pos = text[:at], at + len(fmt.trigger)
    calls: list[Call] = []
    head = re.compile(r'\{"name": "(' + NAME.pattern + r')", "' + re.escape(fmt.key) + '": ')
    while True:
        found = head.match(text, pos)
        if found is None:
            break
        try:
            _, end = json.JSONDecoder().raw_decode(text, pos)
        except json.JSONDecodeError:
            calls.append(Call(found.group(1), text[found.end() : len(text) - 1], complete=False))
            break
        ends = (fmt.close + fmt.suffix).startswith(text[end:])
        calls.append(Call(found.group(1), text[found.end() : end - 1], ends=ends))
        pos = end + len(fmt.close)
        if fmt.sep is None or not text.startswith(fmt.sep + fmt.open, pos):
            break
        pos += len(fmt.sep + fmt.open)
    if final and not any(call.complete for call in calls):
        return text, []
    return content, calls


def split_reasoning(text: str, reasoning: Reasoning, final: bool = True) -> tuple[str, str]:
    """``text`` as its thinking block's text and the rest (the answer, leading newlines off);
    not ``final``: a close tag that may be coming is held back."""
    body = text
    if not reasoning.started:
        stripped = text.lstrip()
        if not stripped.startswith(reasoning.open):
            if not final and reasoning.open.startswith(stripped):
                return "", ""  # it may still open the block
            return "", text
        body = stripped[len(reasoning.open) :]
    at = body.find(reasoning.close)
    if at < 0:
        if final:
            return body, ""
        keep = next((n for n in range(len(reasoning.close) - 1, 0, -1) if body.endswith(reasoning.close[:n])), 0)
        return body[: len(body) - keep], ""
    return body[:at], body[at + len(reasoning.close) :].lstrip("\n")


def generic_instructions(tools: tuple[Tool, ...]) -> str:
    """The system message that offers the tools to a template that renders none."""
    listing = "\n".join(json.dumps(tool.openai()["function"]) for tool in tools)
    return (
        "You may call these functions:\n" + listing + '\nTo call them, answer with only {"tool_calls": '
        '[{"name": NAME, "arguments": {...}}]}.'
    )
