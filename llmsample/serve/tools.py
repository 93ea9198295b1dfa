"""A streamed chat answer's deltas when its text is more than content: ``reasoning_content``
apart from ``content``, and ``tool_calls`` (each call's id and name once, then its
``function.arguments`` in pieces), as OpenAI streams them. The text so far is read whole at
each token (:func:`llmsample.sampling.tools.split_tool_calls` and ``split_reasoning`` with
``final=False``: what may still become a tag or a call is held back), and only what grew since
the last token goes out, so the deltas add up to the whole answer's fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmsample.batch.tools import ChatShape, call_id
from llmsample.sampling.tools import split_reasoning, split_tool_calls


@dataclass
class StreamSplit:
    """One choice's stream: the text so far and how much of each field has gone out."""

    shape: ChatShape
    text: str = ""
    sent: dict[str, int] = field(default_factory=lambda: {"reasoning_content": 0, "content": 0})
    calls: list[tuple[str, int]] = field(default_factory=list)  # per call: its id, arguments sent
    ends: list[tuple[int, int]] = field(default_factory=list)  # per token: its index, where its text ends

    called: bool = False  # the answer ended with whole calls

    def feed(self, text: str, final: bool = False) -> list[dict[str, Any]]:
        """The deltas ``text`` (a token's, appended) releases; ``final``: the answer has ended."""
        self.text += text
        fields: dict[str, str] = {}
        content = self.text
        if self.shape.reasoning is not None:
            fields["reasoning_content"], content = split_reasoning(self.text, self.shape.reasoning, final)
        calls = []
        if self.shape.fmt is not None:
            content, calls = split_tool_calls(content, self.shape.fmt, final)
        fields["content"] = content
        self.called = final and bool(calls)
        deltas = []
        for key, value in fields.items():
            if len(value) > self.sent[key]:
                deltas.append({key: value[self.sent[key] :]})
                self.sent[key] = len(value)
        for index, call in enumerate(calls):
            if index == len(self.calls):
                self.calls.append((call_id(), 0))
                function = {"name": call.name, "arguments": ""}
                deltas.append({"tool_calls": [{"index": index, "id": self.calls[index][0], "type": "function",
                                               "function": function}]})  # fmt: skip
            ident, sent = self.calls[index]
            if len(call.arguments) > sent:
                piece = call.arguments[sent:]
                deltas.append({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                self.calls[index] = (ident, len(call.arguments))
        return deltas
