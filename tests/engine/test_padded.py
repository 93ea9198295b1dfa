"""The padded batch gives the model no mask exactly when no row has padding or holes, and the
logits are the same either way: those of the whole sequence recomputed without a cache."""

from __future__ import annotations

import pytest
import torch

from llmsample.engine.padded import PaddedBatch
from llmsample.errors import RuntimeFailure
from llmsample.models.loading import load_model
from tests.conftest import make_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_model(str(make_tiny_model(tmp_path_factory.mktemp("tiny"))), "cpu", "float32")


def masks_given(batch: PaddedBatch, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each forward pass from now on was given a mask."""
    seen: list[bool] = []
    real = batch.model.forward

    def spy(*args, **kwargs):
        if kwargs.get("use_cache"):  # the batch's own passes, not a recomputation
            seen.append(kwargs.get("attention_mask") is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr(batch.model, "forward", spy)
    return seen


@torch.inference_mode()
def recomputed(lm, ids: list[int]) -> torch.Tensor:
    """The next-token logits of ``ids`` from scratch, no cache, no mask."""
    return lm.model(input_ids=torch.tensor([ids])).logits[0, -1].float()


def test_rows_without_padding_or_holes_step_without_a_mask(tiny, monkeypatch) -> None:
    batch = PaddedBatch(tiny.model)
    seqs = [[0, 5, 6, 7], [0, 9]]
    batch.admit(seqs)
    seen = masks_given(batch, monkeypatch)
    logits = batch.step(torch.tensor([3, 4]))  # row 1 is left-padded: a mask
    seqs = [seqs[0] + [3], seqs[1] + [4]]
    batch.keep([0])  # row 0 alone, its leading columns all real: dense
    logits = batch.step(torch.tensor([8]))
    seqs = [seqs[0] + [8]]
    assert torch.allclose(logits[0], recomputed(tiny, seqs[0]), atol=1e-5)
    batch.verify([[10, 11, 12]])
    batch.rollback(0, len(seqs[0]) + 1)  # two rejected drafts: trailing holes, cropped before the step
    logits = batch.step(torch.tensor([13]))
    seqs = [seqs[0] + [10, 13]]
    assert torch.allclose(logits[0], recomputed(tiny, seqs[0]), atol=1e-5)
    assert seen == [True, False, True, False]


def test_holes_that_outlive_the_crop_are_masked(tiny, monkeypatch) -> None:
    """Two rows of one prompt verify 3 and 1 tokens; the first keeps one of its drafts: the
    second's padding after its one token stays a hole under the first's kept draft."""
    batch = PaddedBatch(tiny.model)
    prompt = [0, 5, 6, 7]
    batch.admit_copies(prompt, 2)
    seen = masks_given(batch, monkeypatch)
    batch.verify([[3, 10, 11], [4]])
    batch.rollback(0, len(prompt) + 2)
    logits = batch.step(torch.tensor([12, 13]))
    assert seen == [True, True]
    assert torch.allclose(logits[0], recomputed(tiny, [*prompt, 3, 10, 12]), atol=1e-5)
    assert torch.allclose(logits[1], recomputed(tiny, [*prompt, 4, 13]), atol=1e-5)


def test_a_dense_step_gives_the_logits_a_masked_one_gives(tiny) -> None:
    """The same rows stepped with and without their all-ones mask."""
    outputs = []
    for dense in (True, False):
        batch = PaddedBatch(tiny.model)
        batch.admit_copies([0, 5, 6, 7, 8], 3)
        if not dense:
            batch._lengths = [n - 1 for n in batch._lengths]  # claims a hole: the mask is passed
        outputs.append([batch.step(torch.tensor([t, t + 1, t + 2])) for t in (3, 9, 12)])
    for with_none, with_mask in zip(*outputs, strict=True):
        assert torch.equal(with_none, with_mask)


def test_out_of_memory_on_a_dense_step_names_rows_and_positions(tiny, monkeypatch) -> None:
    batch = PaddedBatch(tiny.model)
    batch.admit([[0, 5, 6]])

    def full(*args, **kwargs):
        raise torch.OutOfMemoryError("no room")

    monkeypatch.setattr(batch.model, "forward", full)
    with pytest.raises(RuntimeFailure, match=r"1 rows of 4 positions; try a smaller --batch-size"):
        batch.step(torch.tensor([3]))
