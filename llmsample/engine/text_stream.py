"""Token ids to printable text, incrementally, with stop strings that never leak."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PROMPT_CONTEXT_TOKENS = 4
"""Prompt tokens decoded as a prefix, so a SentencePiece leading space is kept on the first token."""


class Detokenizer:
    """Decodes the running window, never a token alone: a multi-byte character split across
    tokens comes out whole, and word-leading spaces survive (the approach of TGI and vLLM)."""

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        text = self._decode(self.ids[self.prefix_offset :])
        if len(text) > len(prefix) and not text.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return text[len(prefix) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held (an incomplete character at the very end)."""
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        text = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(prefix) :]


class StopMatcher:
    """Holds back any tail that could still grow into a stop string; releases the rest.
    ``keep``: the stop string that ends the text is released too (vLLM's
    ``include_stop_str_in_output``)."""

    def __init__(self, stops: Sequence[str], keep: bool = False) -> None:
        self.stops = tuple(stops)
        self.keep = keep
        self.held = ""

    def push(self, text: str) -> tuple[str, bool]:
        """Text safe to print, and whether a stop string was completed."""
        buffer = self.held + text
        hits = [(i, i + len(s)) for i, s in ((buffer.find(s), s) for s in self.stops) if i >= 0]
        if hits:
            self.held = ""
            return buffer[: min(end for _, end in hits) if self.keep else min(start for start, _ in hits)], True
        keep = max((n for s in self.stops for n in range(1, len(s)) if buffer.endswith(s[:n])), default=0)
        self.held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held


class TextStream:
    """Detokenizer plus stop strings: what each new token adds to the printed text."""

    def __init__(
        self, tokenizer: Any, stops: Sequence[str] = (), prompt_ids: Sequence[int] = (), keep_stop: bool = False
    ) -> None:
        self.detokenizer = Detokenizer(tokenizer, prompt_ids)
        self.stops = StopMatcher(stops, keep_stop)

    def push(self, token_id: int) -> tuple[str, bool]:
        return self.stops.push(self.detokenizer.push(token_id))

    def flush(self) -> str:
        text, _ = self.stops.push(self.detokenizer.flush())
        return text + self.stops.flush()
