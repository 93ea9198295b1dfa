"""A streamed chat answer's deltas when its text is more than content: ``reasoning_content``
apart from ``content``, and ``tool_calls`` (each call's id and name once, then its
``function.arguments`` in pieces), as OpenAI streams them. The text so far is read whole at
each token (:func:`llmsample.sampling.tool_grammar.split_tool_calls` and ``split_reasoning`` with
``final=False``: what may still become a tag or a call is held back), and only what grew since
the last token goes out, so the deltas add up to the whole answer's fields. The Responses and
Messages APIs read the same deltas as :class:`Blocks` (reasoning, text, each call), their output
items and content blocks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmsample.batch.tool_requests import ChatShape, call_id
from llmsample.sampling.tool_grammar import split_reasoning, split_tool_calls


@dataclass
class StreamSplit:
    """One choice's stream: the text so far and how much of each field has gone out."""

    shape: ChatShape
    text: str = ""
    sent: dict[str, int] = field(default_factory=lambda: {"reasoning_content": 0, "content": 0})
    calls: list[tuple[str, int]] = field(default_factory=list)  # per call: its id, arguments sent
    ends: list[tuple[int, int]] = field(default_factory=list)  # per token: its index, where its text ends

    called: bool = False  # the answer ended with its calls, nothing cut
    cut: bool = False  # the answer ended inside its last call (the length cut it)

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
        self.called = final and bool(calls) and calls[-1].ends
        self.cut = final and bool(calls) and not calls[-1].complete
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


@dataclass
class Block:
    """One part of an answer as the Responses and Messages APIs give it: ``kind`` reasoning,
    content or call (``ident`` and ``name`` a call's), ``text`` so far (a call's arguments)."""

    kind: str
    ident: str = ""
    name: str = ""
    text: str = ""
    complete: bool = True  # False: a call the length cut short (a stream sent its start)


Step = tuple[str, int, str]  # ("open" | "grow" | "close", the block's index, a grown piece)


@dataclass
class Blocks:
    """A chat answer's text as blocks in order (its reasoning, its content, each call), each
    opened, grown and closed as the text comes (a :class:`StreamSplit`'s deltas), so a stream's
    items and a whole answer's are the same. Content that is only whitespace is held back until
    more comes: before calls it is dropped, as a whole chat message drops it."""

    shape: ChatShape
    eager: bool = False  # the content block is open from the start (a plain answer's one block)
    blocks: list[Block] = field(default_factory=list)
    split: StreamSplit = field(init=False)
    held: str = ""  # whitespace content not yet given to a block

    def __post_init__(self) -> None:
        self.split = StreamSplit(self.shape)

    def start(self) -> list[Step]:
        return self._open(Block("content")) if self.eager else []

    def feed(self, text: str, final: bool = False) -> list[Step]:
        """The steps ``text`` (a token's, appended) releases; ``final``: the answer has ended,
        its last block is closed."""
        steps: list[Step] = []
        for delta in self.split.feed(text, final):
            if "reasoning_content" in delta:
                steps += self._grow("reasoning", delta["reasoning_content"])
            elif "content" in delta:
                self.held += delta["content"]
                if self.held.strip() or (self.blocks and self.blocks[-1].kind == "content"):
                    steps += self._grow("content", self.held)
                    self.held = ""
            else:
                [call] = delta["tool_calls"]
                if "id" in call:
                    self.held = ""
                    steps += self._open(Block("call", call["id"], call["function"]["name"]))
                steps += self._grow("call", call["function"]["arguments"])
        if final:
            if self.held:
                steps += self._grow("content", self.held)
            if self.split.cut:
                self.blocks[-1].complete = False
            if self.blocks:
                steps.append(("close", len(self.blocks) - 1, ""))
        return steps

    def _open(self, block: Block) -> list[Step]:
        steps: list[Step] = [("close", len(self.blocks) - 1, "")] if self.blocks else []
        self.blocks.append(block)
        return [*steps, ("open", len(self.blocks) - 1, "")]

    def _grow(self, kind: str, piece: str) -> list[Step]:
        steps = [] if self.blocks and self.blocks[-1].kind == kind else self._open(Block(kind))
        if not piece:
            return steps
        self.blocks[-1].text += piece
        return [*steps, ("grow", len(self.blocks) - 1, piece)]

    @property
    def called(self) -> bool:
        return self.split.called


def whole_blocks(text: str, shape: ChatShape) -> tuple[list[Block], bool]:
    """A whole answer's blocks (one empty content block when it has none; a call cut short left
    out) and whether it ended with its calls."""
    blocks = Blocks(shape)
    blocks.feed(text, final=True)
    return [block for block in blocks.blocks if block.complete] or [Block("content")], blocks.called
