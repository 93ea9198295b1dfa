"""Prompt lookup (``--draft ngram``, and each row's own lookup under ``--draft suffix``): the
indexed lookup proposes exactly what a scan of the sequence back to front proposes, as the
sequence grows token by token, for another sequence, and for one grown shorter."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsample.engine.speculative import NgramDrafter

CPU = torch.device("cpu")


def scanned(seq: list[int], k: int, ngram_min: int, ngram_max: int) -> list[int]:
    """The definition: the latest earlier occurrence of the last n tokens, longest n first."""
    for n in range(min(ngram_max, len(seq) - 1), ngram_min - 1, -1):
        pattern = seq[-n:]
        for start in range(len(seq) - n - 1, -1, -1):
            if seq[start : start + n] == pattern:
                return seq[start + n : start + n + k]
    return []


def test_hand_computed_proposals() -> None:
    drafter = NgramDrafter(16, CPU, 2, 4)
    seq = [1, 2, 3, 9, 1, 2, 3]
    assert drafter.lookup(seq, 2) == [9, 1]  # "1 2 3" ended at 3 before
    seq += [7, 1, 2, 3]
    assert drafter.lookup(seq, 3) == [7, 1, 2]  # the latest occurrence wins
    seq += [5]
    assert drafter.lookup(seq, 3) == []  # "3 5" never occurred, nor did "5" (n >= 2)
    seq += [1, 2]
    assert drafter.lookup(seq, 1) == [3]
    assert drafter.lookup([4, 4, 4], 5) == [4]  # another list: indexed afresh; the 2-gram "4 4" ended at 2
    assert drafter.lookup([4], 5) == []  # nothing before the last token


@settings(deadline=None)  # a stall of the loaded host is not a failure of the index
@given(
    tokens=st.lists(st.integers(0, 3), min_size=1, max_size=60),
    steps=st.lists(st.integers(1, 4), min_size=1, max_size=30),
    ngram=st.tuples(st.integers(1, 3), st.integers(1, 5)).map(sorted),
    k=st.integers(1, 6),
)
def test_the_index_proposes_what_a_scan_proposes(tokens: list[int], steps: list[int], ngram: list[int], k: int) -> None:
    """One row's sequence grows by a few tokens between lookups (a pass's accepted drafts)."""
    low, high = ngram
    drafter = NgramDrafter(16, CPU, low, high)
    seq: list[int] = []
    at = 0
    for step in steps:
        seq += tokens[at : at + step]
        at += step
        if seq:
            assert drafter.lookup(seq, k) == scanned(seq, k, low, high)


@settings(deadline=None)
@given(
    first=st.lists(st.integers(0, 2), min_size=2, max_size=30),
    second=st.lists(st.integers(0, 2), min_size=2, max_size=30),
    cut=st.integers(1, 29),
)
def test_other_and_shorter_sequences_are_indexed_afresh(first: list[int], second: list[int], cut: int) -> None:
    """A drafter shared by rows, or handed its sequence cut short, still answers as the scan does."""
    drafter = NgramDrafter(16, CPU, 1, 3)
    for seq in (first, second, first):
        assert drafter.lookup(seq, 3) == scanned(seq, 3, 1, 3)
    del first[cut:]
    if first:
        assert drafter.lookup(first, 3) == scanned(first, 3, 1, 3)
