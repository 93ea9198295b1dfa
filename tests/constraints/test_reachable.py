"""The search for a constrained row's end under bans and ``--min-tokens``: a dead end is named
before the first token, a way out is found, and a search past its budget proves nothing."""

from __future__ import annotations

from llmsample.sampling import constraint as constraints
from llmsample.sampling import reachable
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.vocabulary import Vocabulary


def dead_end(lm, constraint, **settings: object) -> str | None:
    vocab = lm.model.config.vocab_size
    table = constraints.tokenizer_table(lm.tokenizer, vocab, sorted(lm.eos_ids))
    matcher = constraints.Matcher(constraint, table, vocab)
    cfg = SamplingConfig(constraint=constraint, **settings)
    reason = reachable.dead_end(matcher, cfg, Vocabulary.of(lm.tokenizer, vocab, lm.eos_ids))
    assert matcher.masks()[0].sum() > 0 and not matcher.matcher.is_error()  # its own state untouched
    return reason


def test_a_ban_every_spelling_needs_is_a_dead_end(byte_lm) -> None:
    assert dead_end(byte_lm, constraints.choice(["yes", "yeti"]), ban=("e",)) == (
        "--choice cannot be completed: it allows only tokens that --ban removes; loosen one of them"
    )
    assert dead_end(byte_lm, constraints.regex("ab?"), min_tokens=3, ban=("x",)) == (
        "--regex cannot be completed: it allows only tokens that --ban and --min-tokens remove; loosen one of them"
    )


def test_a_way_out_is_found(byte_lm) -> None:
    assert dead_end(byte_lm, constraints.choice(["yes", "no"]), ban=("y",)) is None
    assert dead_end(byte_lm, constraints.regex("[a-c]{2,4}"), ban=("b",), min_tokens=3) is None
    assert dead_end(byte_lm, constraints.any_json()) is None  # nothing removed: no search


def test_past_its_budget_the_search_proves_nothing(byte_lm, monkeypatch) -> None:
    monkeypatch.setattr(reachable, "BUDGET", 3)
    assert dead_end(byte_lm, constraints.choice(["abcdef", "abcdeg"]), ban=("f", "g")) is None
    monkeypatch.setattr(reachable, "BUDGET", 64)
    assert dead_end(byte_lm, constraints.choice(["abcdef", "abcdeg"]), ban=("f", "g")) is not None
