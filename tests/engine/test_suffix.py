"""``--draft suffix``: a pool of every request's tokens drafts for the others. Hand-made pools
first, then the loop: greedy rows equal plain ones, sampled rows follow the target's
distribution (χ²), and a request that repeats an earlier answer drafts it whole."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import llmsample.engine.suffix_pool
from llmsample.engine.continuous_batch import decode_batch
from llmsample.engine.loop import generate, run_to_end
from llmsample.engine.pass_cost import machine_shape
from llmsample.engine.prompt import encode_prompt
from llmsample.engine.row_state import BatchItem, RowFailed
from llmsample.engine.speculative import NgramDrafter
from llmsample.engine.suffix_pool import PRIOR, REACH, SuffixDrafter, SuffixPool, auto_drafter
from llmsample.events import RunStats, TokenEvent
from llmsample.models.loading import load_model
from llmsample.sampling.config import SamplingConfig
from tests.conftest import make_tiny_model
from tests.engine.test_decode import SETTINGS, VOCAB, check_pairs, expected_joint, later_pairs

CPU = torch.device("cpu")
PROMPT_TEXT = "w4 w8 w15 w16 w23 w4 w8 w15"


def test_the_pool_proposes_what_followed_the_latest_occurrence_longest_n_first() -> None:
    pool = SuffixPool(2, 4, min_prob=0.0)  # every continuation, however rarely seen
    a, b = pool.open(), pool.open()
    pool.extend(a, [1, 2, 3, 4, 5, 6], 6)
    pool.extend(b, [9, 2, 3, 7, 8], 5)
    assert pool.lookup([0, 2, 3], 3)[0] == [7, 8]  # b is the latest "2 3"; a match of 2 drafts 2 at most
    assert pool.lookup([1, 2, 3], 3)[0] == [4, 5, 6]  # "1 2 3" (n = 3) beats b's "2 3"
    assert pool.lookup([5, 6], 2)[0] == []  # a ends there: nothing followed it
    assert pool.lookup([4, 4], 2)[0] == []


def test_the_pool_forgets_the_oldest_sequences_past_its_budget() -> None:
    pool = SuffixPool(2, 3, max_tokens=8, min_prob=0.0)
    a, b = pool.open(), pool.open()
    pool.extend(a, [1, 2, 3, 4, 5], 5)
    pool.extend(b, [6, 7, 8, 9, 10], 5)
    assert a not in pool.sequences and pool.tokens == 5
    assert pool.lookup([1, 2], 2)[0] == [] and pool.lookup([6, 7], 2)[0] == [8, 9]
    assert pool.counts[(1, 2)] == 0 and pool.counts[(6, 7, 8)] == 1  # its counts went with it


def test_a_row_drafts_from_other_rows_and_from_itself_whichever_is_longer() -> None:
    pool = SuffixPool(2, 4, min_prob=0.0)
    own = NgramDrafter(32, CPU, 2, 4)
    earlier = SuffixDrafter(pool, own)
    cfg = SamplingConfig(temperature=0.0)
    for end in range(2, 9):  # an earlier row wrote 5 6 7 8 9 10 11 after 3 4
        earlier.propose([3, 4, 5, 6, 7, 8, 9, 10, 11][:end], 4, None, cfg, None)  # type: ignore[arg-type]
    row = SuffixDrafter(pool, own)
    drafted, q = row.propose([20, 3, 4], 4, None, cfg, None)  # type: ignore[arg-type]
    assert drafted.tolist() == [5, 6] and q.argmax(-1).tolist() == [5, 6]  # as long as the match
    # Its own earlier "20 21 22 23 24 20" repeats longer than the pool's one-token continuation.
    drafted, _ = row.propose([20, 21, 22, 23, 24, 20, 21], 4, None, cfg, None)  # type: ignore[arg-type]
    assert drafted.tolist() == [22, 23, 24, 20]


def test_a_draft_goes_as_far_as_the_pool_has_seen_it_go_and_no_further_than_the_match() -> None:
    """Each token's chance is its share of what followed its longest context seen twice or more;
    the draft stops where the product falls below min_prob, and at the match's length."""
    pool = SuffixPool(2, 3, min_prob=0.6)
    for tail in ([5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 9], [5, 6, 7, 9]):
        pool.extend(pool.open(), [0, 1, 2, 3, 4, *tail], 9)
    # "4 5 6 7" followed "2 3" four times (chance 1), then 8 or 9 half the time each (0.5 < 0.6).
    assert pool.lookup([0, 2, 3], 8)[0] == [4, 5]  # a match of two tokens drafts two at most
    assert pool.lookup([0, 1, 2, 3], 8)[0] == [4, 5, 6, 7]  # a match of four, measured past the 3-grams
    pool.min_prob = 0.5
    assert pool.confident([2, 3], [4, 5, 6, 7, 9])[0] == [4, 5, 6, 7, 9]
    pool = SuffixPool(2, 3, min_prob=0.6)
    pool.extend(pool.open(), [1, 2, 3, 4, 5, 6], 6)
    assert pool.lookup([1, 2, 3], 3)[0] == []  # seen once: no evidence
    assert SuffixPool(2, 3, min_prob=0.6).confident([1, 2, 3], [4]) == ([], [])  # an empty pool drafts nothing


def test_the_pools_estimate_is_taken_as_the_target_kept_tokens_it_was_as_sure_of() -> None:
    pool = SuffixPool(2, 3, min_prob=0.6)
    for _ in range(5):
        pool.extend(pool.open(), [0, 1, 2, 3, 4, 5, 6, 7, 8], 9)
    assert pool.confident([1, 2, 3], [4, 5, 6, 7, 8]) == ([4, 5, 6, 7, 8], [1.0] * 5)  # nothing measured yet
    pool.scored([1.0, 1.0, 1.0], 1)  # the first kept, the second rejected, the third never verified
    assert (pool.kept[-1], pool.tested[-1]) == (1, 2)
    for _ in range(19):
        pool.scored([1.0, 1.0], 1)  # sure tokens kept half of the time
    pool.scored([0.6, 0.6], 2)
    assert pool.calibrated(1.0) == pytest.approx((20 + PRIOR) / (40 + PRIOR))
    assert pool.calibrated(0.6) == pytest.approx((2 + PRIOR * 0.6) / (2 + PRIOR))  # its own bin
    assert pool.calibrated(0.0) == 0.0  # a context seen once is no evidence, whatever was kept
    assert pool.confident([1, 2, 3], [4, 5, 6, 7, 8]) == ([], [])  # 0.55 < 0.6
    while pool.tested[-1] > 3:  # proposals without drafts: the evidence fades, and drafting probes again
        pool.faded()
    assert pool.confident([1, 2, 3], [4, 5, 6, 7, 8])[0] == [4]
    assert pool.kept[-1] / pool.tested[-1] == pytest.approx(20 / 40)


def run(lm, prompts: list[list[int]], cfg: SamplingConfig, maker) -> tuple[dict[int, list[int]], dict[int, object]]:
    items = [BatchItem(i, p, dataclasses.replace(cfg, seed=100 + i), RunStats("t", "t", 100 + i), maker)
             for i, p in enumerate(prompts)]  # fmt: skip
    tokens: dict[int, list[int]] = {}
    ends: dict[int, object] = {}
    for key, record in decode_batch(lm, items, 2, ignore_eos=True):
        assert not isinstance(record, RowFailed)
        if isinstance(record, TokenEvent):
            tokens.setdefault(key, []).append(record.token_id)
        else:
            ends[key] = record
    return tokens, ends


def test_greedy_rows_drafting_from_the_pool_give_the_plain_tokens(tiny_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    """(Sampled rows draw their uniforms as their drafts go: the distribution test below.)"""
    monkeypatch.setattr(llmsample.engine.suffix_pool, "WINDOW", float("inf"))  # the pool's counts never fade
    cfg = SamplingConfig(temperature=0.0, max_tokens=12)
    prompts = [[0, 5, 9, 3, 17], [0, 5, 9, 3, 17], [0, 4, 9, 3, 17], [0, 5, 9, 3, 17]]
    plain, _ = run(tiny_lm, prompts, cfg, None)
    pool = SuffixPool(2, 6)
    drafted, ends = run(tiny_lm, prompts, cfg, lambda: SuffixDrafter(pool, NgramDrafter(32, CPU, 2, 4)))
    assert drafted == plain
    # Every verified draft was scored in the pool (its acceptance: the cut's evidence).
    speculation = [end.facts.speculation for end in ends.values()]
    assert (
        sum(pool.kept)
        == sum(s.accepted for s in speculation)
        <= sum(pool.tested)
        <= sum(s.drafted for s in speculation)
    )
    assert ends[3].facts.speculation.accepted >= 8  # it repeats the first's answer: drafted from the pool
    # Every row's whole sequence, the tokens after its last proposal too, is in the pool.
    assert sorted(pool.sequences.values()) == sorted(p + plain[i] for i, p in enumerate(prompts))


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory):
    path = make_tiny_model(tmp_path_factory.mktemp("vocab12-suffix") / "t", vocab_size=VOCAB, seed=10, init=0.15)
    return load_model(str(path), "cpu", "float32")


@pytest.mark.parametrize("min_prob", [0.0, 0.2])
def test_rows_drafting_from_the_pool_follow_the_target_distribution(target, min_prob: float) -> None:
    """Every row's second and third tokens, drafted from what the rows before it wrote (accepted
    or not; a row's first comes from the prefill, and its fourth lets its third into the pool),
    against the plain chain's. At a floor of 0 the pool drafts wherever it
    matched (the most rejections to keep exact); at 0.2 its cut moves with how often the target kept the drafts of the rows
    before."""
    samples = 1500
    prompt = [0, 5, 7, 5]
    pool = SuffixPool(1, 4, min_prob=min_prob)
    own = NgramDrafter(VOCAB, CPU, 1, 4)
    names = list(SETTINGS)
    requests = [
        BatchItem((names[i % len(names)], i), prompt, dataclasses.replace(SETTINGS[names[i % len(names)]], seed=7 + i, max_tokens=4),
                  RunStats("t", "t", None), lambda: SuffixDrafter(pool, own), 2)
        for i in range(len(names) * samples)
    ]  # fmt: skip
    pairs: dict[str, list[tuple[int, ...]]] = {name: [] for name in names}
    tokens: dict[tuple[str, int], list[int]] = {}
    drafted = 0
    for key, record in decode_batch(target, requests, 64, ignore_eos=True):
        if isinstance(record, TokenEvent):
            tokens.setdefault(key, []).append(record.token_id)
        else:
            pairs[key[0]].append(tuple(tokens.pop(key))[1:3])
            drafted += record.facts.speculation.drafted
    if min_prob == 0:
        assert drafted >= len(requests) * 9 // 10  # the pool proposed after nearly every first token
    else:  # the tiny model's flat distributions keep few drafts: the cut rises, and falls back to probe
        assert len(requests) // 20 < drafted < len(requests) // 2
    for name in names:
        expected = later_pairs(expected_joint(target, prompt, SETTINGS[name]))
        observed = torch.zeros(VOCAB * VOCAB, dtype=torch.float64)
        for x2, x3 in pairs[name]:
            observed[x2 * VOCAB + x3] += 1
        check_pairs(observed, expected, samples, name)


def primed(pool: SuffixPool) -> SuffixPool:
    """A pool sure of a next token after every pair of tokens (each pair seen twice, followed by
    one token): it drafts at every step of any row, and a sampled row keeps few of its drafts."""
    for _ in range(2):
        for a in range(32):
            for b in range(32):
                pool.extend(pool.open(), [a, b, (a + b) % 32], 3)
    return pool


def test_auto_drafts_on_llama_cpp_and_the_torch_forward_only(tiny_lm) -> None:
    assert auto_drafter(tiny_lm) is None  # transformers' own forward: no drafting unless asked
    for backend in ("llama.cpp", "torch"):
        made = auto_drafter(dataclasses.replace(tiny_lm, backend=backend), (2, 4))
        assert made is not None and isinstance(made(), SuffixDrafter)
        assert (made.pool.ngram_min, made.pool.ngram_max, made.pool.min_prob, made.pool.shape) == (2, 6, REACH, machine_shape())


def test_auto_stops_drafting_where_the_target_rejects_its_drafts(tiny_lm) -> None:
    """The same confident pool, gated by the target's measured acceptance (``--draft auto``'s
    pool) and not gated (a floor of 0): ungated, the row drafts at nearly every step and keeps
    few; gated, a rejection or two and it stops, probing again only as that evidence fades. Both
    give the plain run's text (fixed drafts checked against the row's own draws)."""
    cfg = SamplingConfig(temperature=1.0, max_tokens=200, seed=3)
    ids = encode_prompt(tiny_lm, PROMPT_TEXT, raw=True)
    plain, _ = run_to_end(generate(tiny_lm, ids, cfg, RunStats("t", "t", 3), ignore_eos=True))
    auto = auto_drafter(dataclasses.replace(tiny_lm, backend="llama.cpp"))
    assert auto is not None
    ungated = SuffixDrafter(primed(SuffixPool(2, 6, min_prob=0.0)), NgramDrafter(32, CPU, 2, 4))
    spec = {}
    for name, drafter in (("auto", dataclasses.replace(auto, pool=primed(auto.pool))()), ("ungated", ungated)):
        tokens, summary = run_to_end(generate(tiny_lm, ids, cfg, RunStats("t", "t", 3), drafter=drafter, ignore_eos=True))
        assert [t.token_id for t in tokens] == [t.token_id for t in plain], name
        spec[name] = summary.facts.speculation
    assert spec["ungated"].drafted >= 100 and spec["ungated"].accepted < spec["ungated"].drafted / 3
    assert spec["auto"].drafted <= 10, spec
