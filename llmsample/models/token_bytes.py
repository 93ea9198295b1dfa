"""Each token's own bytes, as OpenAI's and vLLM's ``logprobs`` give them: a client rebuilds the
text from them even where a token holds part of a character (its text alone is U+FFFD, and
the detokenizer releases the character with the token that completes it).

Read from the token's piece, not decoded: GPT-2's byte-level alphabet maps back to bytes one
character each, a byte-fallback piece ``<0xNN>`` is that one byte, SentencePiece's ``▁`` is a
space, and an added token (``<|im_end|>``) is its own text. Other vocabularies (word-level
ones whose decoder puts the spaces between words) have no bytes of their own here."""

from __future__ import annotations

import re
from functools import cache
from typing import Any

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@cache
def byte_decoder() -> dict[str, int]:
    """GPT-2's ``bytes_to_unicode`` inverted: the printable character standing for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {byte: byte for byte in printable}
    for byte in range(256):
        if byte not in chars:
            chars[byte] = 256 + len(chars) - len(printable)
    return {chr(char): byte for byte, char in chars.items()}


class TokenBytes:
    """``token_bytes(id)``: the bytes the tokenizer maps ``id`` to, worked out once per id; None
    where the pieces are not bytes (a word-level vocabulary whose decoder adds the spaces: the
    caller keeps the token's text)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        decoder = repr(backend.decoder) if backend is not None else ""
        self.byte_level = "ByteLevel" in decoder
        self.sentencepiece = "Metaspace" in decoder or "ByteFallback" in decoder or hasattr(tokenizer, "sp_model")
        self.added = set(getattr(tokenizer, "added_tokens_decoder", {}))
        self.memo: dict[int, bytes | None] = {}

    def __call__(self, token: int) -> bytes | None:
        if token not in self.memo:
            self.memo[token] = self._bytes(token)
        return self.memo[token]

    def _bytes(self, token: int) -> bytes | None:
        piece = self.tokenizer.convert_ids_to_tokens(token)
        if not isinstance(piece, str) or not (self.byte_level or self.sentencepiece):
            return None
        if token in self.added:
            return piece.encode("utf-8")
        byte = _BYTE_PIECE.fullmatch(piece)
        if byte:
            return bytes([int(byte.group(1), 16)])
        decoder = byte_decoder()
        if self.byte_level and all(char in decoder for char in piece):
            return bytes(decoder[char] for char in piece)
        return piece.replace("\u2581", " ").encode("utf-8")
