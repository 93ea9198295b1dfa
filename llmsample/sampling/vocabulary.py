"""What the text-aware stages need from a tokenizer, prepared once: each token's text, the EOS
ids, texts resolved to token ids, and per banned string the tokens that would complete it.

Everything here runs on the host from token lists the loops already hold, so these stages add
no device synchronisation; the precomputed tables make a step cost a few set unions."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch import Tensor


class Vocabulary:
    """A tokenizer seen as ``size`` token texts (ids past the tokenizer's own length, embedding
    padding, have the empty text) plus the ids that end a sequence."""

    def __init__(self, tokenizer: Any, size: int, eos_ids: Iterable[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.size = size
        self.eos_ids = tuple(sorted(i for i in set(eos_ids) if 0 <= i < size))

    @classmethod
    def of(cls, tokenizer: Any, size: int, eos_ids: Iterable[int] = ()) -> Vocabulary:
        """One per tokenizer, size and EOS set: its tables are built once per process."""
        eos = tuple(sorted(set(eos_ids)))
        key = (id(tokenizer), size, eos)
        found = _VOCABULARIES.get(key)
        if found is None or found.tokenizer is not tokenizer:
            found = _VOCABULARIES[key] = cls(tokenizer, size, eos)
        return found

    @cached_property
    def texts(self) -> tuple[str, ...]:
        """The text each token adds after ordinary text. Decoded after an anchor token and cut
        after the anchor's text, so a SentencePiece word-leading space is kept (a token decoded
        alone loses it). A token that holds part of a multi-byte character reads as U+FFFD."""
        tokenizer = self.tokenizer
        known = min(self.size, len(tokenizer))
        anchor = tokenizer("a", add_special_tokens=False)["input_ids"][-1:] if known else []
        kwargs = {"skip_special_tokens": False, "clean_up_tokenization_spaces": False}
        if not anchor:
            return (*tokenizer.batch_decode([[t] for t in range(known)], **kwargs), *[""] * (self.size - known))
        head = tokenizer.decode(anchor, **kwargs)
        joined = tokenizer.batch_decode([[*anchor, t] for t in range(known)], **kwargs)
        texts = [
            j[len(head) :] if j.startswith(head) else tokenizer.decode([t], **kwargs) for t, j in enumerate(joined)
        ]
        return (*texts, *[""] * (self.size - known))

    def token_id(self, token: str) -> int:
        """A token id written in digits, or a text that encodes to exactly one token."""
        if token.isdigit():
            index = int(token)
            if index >= self.size:
                raise ValueError(f"token id {index} is outside the vocabulary (0..{self.size - 1})")
            return index
        ids = self.tokenizer(token, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise ValueError(
                f"{token!r} encodes to {len(ids)} tokens {ids}; give a token id, or a text that is one token"
            )
        if not 0 <= ids[0] < self.size:  # a token the tokenizer added past the model's vocabulary
            raise ValueError(f"{token!r} is token {ids[0]}, outside the model's vocabulary (0..{self.size - 1})")
        return int(ids[0])

    def generated_text_tail(self, tokens: Sequence[int], chars: int) -> str:
        """At least the last ``chars`` characters of the text of ``tokens`` (all of it if shorter)."""
        texts, parts, length = self.texts, [], 0
        for token in reversed(tokens):
            if length >= chars:
                break
            text = texts[token] if 0 <= token < self.size else ""
            parts.append(text)
            length += len(text)
        return "".join(reversed(parts))


_VOCABULARIES: dict[tuple[int, int, tuple[int, ...]], Vocabulary] = {}


@dataclass(frozen=True, eq=False)
class BanTable:
    """For each banned string s: the tokens whose text contains s, and for each split j
    (0 < j < len(s)) the tokens whose text starts with ``s[j:]`` — which complete s when the text
    so far ends with ``s[:j]``. A step then only tests which prefixes the text so far ends with."""

    strings: tuple[str, ...]
    anywhere: frozenset[int]
    completing: tuple[tuple[tuple[str, frozenset[int]], ...], ...]  # per string: (s[:j], tokens)
    longest: int

    def banned(self, text_so_far: str) -> set[int]:
        out = set(self.anywhere)
        for splits in self.completing:
            for prefix, tokens in splits:
                if tokens and text_so_far.endswith(prefix):
                    out |= tokens
        return out


@functools.lru_cache(maxsize=64)
def ban_table(vocabulary: Vocabulary, strings: tuple[str, ...]) -> BanTable:
    texts = vocabulary.texts
    anywhere: set[int] = set()
    completing = []
    for s in strings:
        anywhere.update(t for t, text in enumerate(texts) if s in text)
        splits = []
        for j in range(1, len(s)):
            suffix = s[j:]
            # a text shorter than the suffix cannot complete s now; it may be a prefix of a later
            # completion, which the next step masks
            splits.append((s[:j], frozenset(t for t, text in enumerate(texts) if text.startswith(suffix))))
        completing.append(tuple(splits))
    return BanTable(strings, frozenset(anywhere), tuple(completing), max((len(s) for s in strings), default=0))


@functools.lru_cache(maxsize=64)
def breaker_ids(vocabulary: Vocabulary, breakers: tuple[str, ...]) -> frozenset[int]:
    """DRY's sequence breakers as tokens: every token whose text contains one of the strings (as
    llama.cpp matches them; text-generation-webui takes the last token of each string encoded)."""
    return frozenset(t for t, text in enumerate(vocabulary.texts) if any(b in text for b in breakers))


@functools.lru_cache(maxsize=64)
def bias_vector(vocabulary: Vocabulary, logit_bias: tuple[tuple[str, float], ...]) -> Tensor:
    """The dense ``[vocab]`` bias of ``--logit-bias`` (a later entry for the same token wins)."""
    from llmsample.sampling.config import ConfigError

    bias = torch.zeros(vocabulary.size)
    for token, value in logit_bias:
        try:
            bias[vocabulary.token_id(token)] = value
        except ValueError as exc:
            raise ConfigError("logit_bias", str(exc)) from exc
    return bias


def dry_penalties(
    tokens: Sequence[int],
    multiplier: float,
    base: float,
    allowed_length: int,
    breakers: frozenset[int],
    last_n: int = 0,
) -> dict[int, float]:
    """DRY ("Don't Repeat Yourself", p-e-w, text-generation-webui PR #5677; llama.cpp's
    ``llama_sampler_dry``): for every earlier occurrence of the sequence's last token, extend the
    match backwards; the token that followed that occurrence would repeat a sequence of length n,
    and when n >= ``allowed_length`` its logit loses ``multiplier * base ** (n - allowed_length)``
    (the longest match per candidate counts). A sequence breaker ends every match and is never
    penalised. Written from the published description, not copied; like webui, matches stop at
    50 tokens, and like llama.cpp the exponent is capped so the penalty stays a finite float32."""
    if last_n > 0:
        tokens = tokens[-last_n:]
    if len(tokens) < 2 or tokens[-1] in breakers:
        return {}
    last = tokens[-1]
    end = len(tokens) - 1
    longest: dict[int, int] = {}
    for i in range(end):
        if tokens[i] != last:
            continue
        follower = tokens[i + 1]
        if follower in breakers:
            continue
        n = 1
        while n < 50 and i - n >= 0:
            earlier = tokens[end - n]
            if tokens[i - n] != earlier or earlier in breakers:
                break
            n += 1
        if n > longest.get(follower, 0):
            longest[follower] = n
    limit = torch.finfo(torch.float32).max
    cap = math.log(limit / multiplier) / math.log(base) if base > 1 and multiplier > 0 else math.inf
    return {
        token: multiplier * base ** min(n - allowed_length, cap) for token, n in longest.items() if n >= allowed_length
    }


def named_tokens(vocabulary: Vocabulary, given: Iterable[str], flag: str) -> tuple[tuple[str, int], ...]:
    """Tokens named on the command line (``--watch``) as ``(text as given, token id)`` pairs,
    each once, resolved as :meth:`Vocabulary.token_id` resolves them; one that is not a token is
    the user's error, naming ``flag``."""
    from llmsample.errors import UserError

    pairs = []
    for token in dict.fromkeys(given):
        try:
            pairs.append((token, vocabulary.token_id(token)))
        except ValueError as exc:
            raise UserError(f"{flag}: {exc}") from exc
    return tuple(pairs)
