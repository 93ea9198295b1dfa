"""Whether a constrained row can end at all once ``--ban`` and ``--min-tokens`` have taken their
tokens out. The grammar alone allows some text, but every spelling of it may need a token a ban
removes (``--choice yes --ban s``): the loop would find no token left part-way, with the text so
far already printed. A depth-first search over the grammar's states answers before the first
token; past its budget (or the length limit) it proves nothing, and the loop's own check stays."""

from __future__ import annotations

import numpy as np

from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.constraint import Matcher
from llmsample.sampling.vocabulary import Vocabulary, ban_table

BUDGET = 256
"""Grammar states the search visits at most (each one mask over the vocabulary)."""


def removed_by(cfg: SamplingConfig) -> list[str]:
    """The flags whose stages take tokens out of a constrained row's choices."""
    return [flag for key, flag in (("ban", "--ban"), ("min_tokens", "--min-tokens")) if getattr(cfg, key)]


def dead_end(matcher: Matcher, cfg: SamplingConfig, vocabulary: Vocabulary) -> str | None:
    """The one line saying the constraint cannot be completed under ``cfg``'s bans and
    ``--min-tokens`` (proven within :data:`BUDGET`); None when it can, or when the search cannot
    tell."""
    others = removed_by(cfg)
    if not others:
        return None
    search = _Search(matcher, cfg, vocabulary)
    if search.completes([]) is not False:
        return None
    flag = matcher.constraint.origin or matcher.constraint.flag
    removes = "removes" if len(others) == 1 else "remove"
    return (
        f"{flag} cannot be completed: it allows only tokens that {' and '.join(others)} {removes}; loosen one of them"
    )


class _Search:
    def __init__(self, matcher: Matcher, cfg: SamplingConfig, vocabulary: Vocabulary) -> None:
        self.llm = matcher.matcher.deep_copy()  # the row's own state stays where it is
        self.vocab = matcher.vocab_size
        self.eos = matcher.eos
        self.cfg = cfg
        self.vocabulary = vocabulary
        self.bans = ban_table(vocabulary, cfg.ban) if cfg.ban else None
        self.left = BUDGET

    def allowed(self, generated: list[int]) -> list[int]:
        """The grammar's tokens here less those the bans and ``--min-tokens`` take out."""
        bits = np.unpackbits(np.frombuffer(self.llm.compute_bitmask(), dtype=np.uint8), bitorder="little")
        tokens = set(np.flatnonzero(bits[: self.vocab]).tolist())
        if self.bans is not None:
            tail = self.vocabulary.generated_text_tail(generated, self.bans.longest - 1)
            tokens -= self.bans.banned(tail)
        if len(generated) < self.cfg.min_tokens:
            tokens -= self.eos
        return sorted(tokens)

    def completes(self, generated: list[int]) -> bool | None:
        """True: some completion is left; False: none (proven); None: the search cannot tell."""
        if self.left <= 0 or len(generated) >= self.cfg.max_tokens or self.llm.is_error():
            return None
        self.left -= 1
        tokens = self.allowed(generated)
        if any(t in self.eos for t in tokens):
            return True
        answer: bool | None = False
        for token in tokens:
            if not self.llm.consume_token(token):
                return None
            found = self.completes([*generated, token])
            self.llm.rollback(1)
            if found:
                return True
            if found is None:
                answer = None
            if self.left <= 0:
                return None
        return answer
