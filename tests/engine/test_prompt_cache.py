"""The prompt cache across requests (:mod:`llmsample.engine.prompt_cache`): a row that starts
from a cached prefix gets the logits and the tokens a cold prefill gets (float32, greedy and
seeded sampling), kept rows leave under the budget oldest first, rows sharing a prefix in one
admission prefill it once, and a cancelled row's cache serves the next request."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from llmsample.engine.decode import DecodeOptions, decode
from llmsample.engine.padded import PaddedBatch
from llmsample.engine.prompt_cache import MIN_REUSE, CachingBackend, PromptCache
from llmsample.engine.row_state import BatchItem
from llmsample.events import RunStats, Summary, TokenEvent
from llmsample.sampling.config import SamplingConfig

GREEDY = SamplingConfig(temperature=0.0, max_tokens=6)
# top-k 8: a random model's row is near flat; over the whole vocabulary each token's share of the
# draw (~2e-5) is close to what a pass of another shape moves the sum before it by, so a seeded
# draw could land on the next token (a unified llama.cpp cache on an AVX2 CPU did).
SAMPLED = SamplingConfig(temperature=0.9, top_k=8, top_p=0.95, max_tokens=6, seed=5)
SYSTEM = [0, 5, 9, 3, 17, 4, 8, 12, 13, 14, 6, 7]  # a shared "system prompt"
BIG = 2**30


def items(prompts: list[list[int]], cfg: SamplingConfig) -> list[BatchItem]:
    return [BatchItem(k, p, cfg, RunStats("t", "t", cfg.seed)) for k, p in enumerate(prompts)]


def run(lm: Any, todo: Any, rows: int, cache: PromptCache | None) -> tuple[dict[Any, list[int]], dict[Any, Summary]]:
    tokens: dict[Any, list[int]] = {}
    summaries: dict[Any, Summary] = {}
    for key, record in decode(lm, todo, rows, DecodeOptions(ignore_eos=True, prompt_cache=cache)):
        if isinstance(record, TokenEvent):
            tokens.setdefault(key, []).append(record.token_id)
        else:
            summaries[key] = record
    return tokens, summaries


def test_a_hit_gives_the_logits_of_a_cold_prefill(tiny_lm) -> None:
    prompt = [*SYSTEM, 20, 21, 22]
    expected = PaddedBatch(tiny_lm.model).admit([prompt])
    warm = CachingBackend(PaddedBatch(tiny_lm.model), PromptCache(BIG))
    warm.admit([[*SYSTEM, 25], [3, 4, 5]])  # beside a row of its own, padded
    warm.step(torch.tensor([26, 6]))
    warm.keep([1])  # the first row leaves: kept
    got = warm.admit([prompt])
    assert warm.reused == [len(SYSTEM)]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert got.argmax(-1).tolist() == expected.argmax(-1).tolist()


@pytest.mark.parametrize("cfg", [GREEDY, SAMPLED])
def test_requests_after_one_another_reuse_it_and_decode_as_cold(tiny_lm, cfg: SamplingConfig) -> None:
    prompts = [[*SYSTEM, 20 + i, 3 + i] for i in range(4)]
    cold, _ = run(tiny_lm, items(prompts, cfg), 1, None)
    cache = PromptCache(BIG)
    warm, summaries = run(tiny_lm, items(prompts, cfg), 1, cache)
    assert warm == cold
    assert [summaries[k].facts.cache.reused for k in range(4)] == [0] + [len(SYSTEM)] * 3
    assert [summaries[k].facts.cache.prefilled for k in range(4)] == [len(SYSTEM) + 2] + [2] * 3
    assert len(cache.entries) == 4  # each row's whole sequence, none a prefix of another


@pytest.mark.parametrize("cfg", [GREEDY, SAMPLED])
def test_concurrent_requests_sharing_a_prefix_prefill_it_once(tiny_lm, cfg: SamplingConfig) -> None:
    prompts = [[*SYSTEM, 20 + i] for i in range(3)] + [[4, 5, 6, 7, 8, 9]]
    cold, _ = run(tiny_lm, items(prompts, cfg), 4, None)
    warm, summaries = run(tiny_lm, items(prompts, cfg), 4, PromptCache(BIG))
    assert warm == cold
    assert [summaries[k].facts.cache.reused for k in range(4)] == [0, len(SYSTEM), len(SYSTEM), 0]


class CancelFirst:
    """A feed: the first request, cancelled after its first step; then the second."""

    def __init__(self, todo: list[BatchItem]) -> None:
        self.todo, self.steps = list(todo), 0

    def take(self, n: int, wait: bool) -> list[BatchItem]:
        if self.steps == 0 or not wait:
            taken, self.todo = self.todo[:1] if self.steps == 0 else [], self.todo[1:] if self.steps == 0 else self.todo
            return taken
        taken, self.todo = self.todo[:n], self.todo[n:]
        return taken

    def cancelled(self) -> frozenset[Any]:
        self.steps += 1
        return frozenset({0}) if self.steps == 1 else frozenset()


def test_a_cancelled_rows_cache_serves_the_next_request(tiny_lm) -> None:
    first, second = [*SYSTEM, 20], [*SYSTEM, 20, 21, 22]
    cold, _ = run(tiny_lm, items([first, second], GREEDY)[1:], 1, None)
    cache = PromptCache(BIG)
    warm, summaries = run(tiny_lm, CancelFirst(items([first, second], GREEDY)), 1, cache)
    assert summaries[0].stop_reason == "cancelled"
    assert summaries[1].facts.cache.reused == len(first)  # its prompt; the token it drew was never fed
    assert warm[1] == cold[1]


class Block:
    def __init__(self, nbytes: int) -> None:
        self.nbytes, self.released = nbytes, False

    def release(self) -> None:
        self.released = True


def test_entries_leave_least_recently_used_first_under_the_budget() -> None:
    cache = PromptCache(100)
    a, b, c = Block(40), Block(40), Block(40)
    cache.put([1, 2, 3, 4, 5], a)
    cache.put([6, 7, 8, 9, 10], b)
    assert cache.longest([1, 2, 3, 4, 9])[1] == 4  # a is used: b is now the oldest
    cache.put([11, 12, 13, 14], c)
    assert (a.released, b.released, c.released) == (False, True, False)
    assert cache.used == 80 and cache.longest([6, 7, 8, 9])[1] == 0


def test_an_entry_extending_another_replaces_it_and_one_over_budget_is_not_kept() -> None:
    cache = PromptCache(100)
    short, long, huge = Block(10), Block(20), Block(101)
    cache.put([1, 2, 3, 4], short)
    cache.put([1, 2, 3, 4, 5, 6], long)
    assert short.released and cache.used == 20 and len(cache.entries) == 1
    assert cache.keeps([1, 2, 3, 4]) and not cache.keeps([1, 2, 3, 5])
    cache.put([7, 8, 9, 10], huge)
    assert huge.released and cache.used == 20


def test_a_short_shared_prefix_is_prefilled_with_the_others(tiny_lm) -> None:
    warm = CachingBackend(PaddedBatch(tiny_lm.model), PromptCache(BIG))
    warm.admit([[*SYSTEM[: MIN_REUSE - 1], 20], [*SYSTEM[: MIN_REUSE - 1], 21]])
    assert warm.reused == [0, 0]


@pytest.mark.parametrize("cfg", [GREEDY, SAMPLED])
def test_the_next_turn_of_a_conversation_reuses_the_reply_too(tiny_lm, cfg: SamplingConfig) -> None:
    cache = PromptCache(BIG)
    prompt = [*SYSTEM, 20]
    reply, _ = run(tiny_lm, items([prompt], cfg), 1, cache)  # a run of its own: the cache outlives it
    turn = [*prompt, *reply[0], 21, 22]
    warm, summaries = run(tiny_lm, items([turn], cfg), 1, cache)
    cold, _ = run(tiny_lm, items([turn], cfg), 1, None)
    assert summaries[0].facts.cache.reused == len(prompt) + len(reply[0]) - 1  # the last reply token was never fed
    assert warm == cold


def test_speculative_rows_keep_what_their_cache_holds_through_rollbacks(tiny_lm) -> None:
    """Verified drafts and rolled-back ones: the next turn reuses exactly the kept tokens."""
    from llmsample.engine.speculative import NgramDrafter

    drafter = NgramDrafter(32, torch.device("cpu"), 1, 3)
    cfg = dataclasses.replace(GREEDY, max_tokens=10)
    prompt = [*SYSTEM, 5, 9, 3]

    def spec(prompts: list[list[int]], cache: PromptCache | None) -> tuple[dict, dict]:
        todo = [dataclasses.replace(item, drafter=lambda: drafter) for item in items(prompts, cfg)]
        return run(tiny_lm, todo, 1, cache)

    cache = PromptCache(BIG)
    reply, ends = spec([prompt], cache)
    assert ends[0].facts.speculation.drafted > ends[0].facts.speculation.accepted  # some drafts were rolled back
    turn = [*prompt, *reply[0], 21]
    warm, summaries = spec([turn], cache)
    assert summaries[0].facts.cache.reused == len(prompt) + len(reply[0]) - 1
    assert warm == spec([turn], None)[0]
