"""The cache layer that appends in place (transformers' and llmsample's own models' alike) holds
exactly what concatenation would, through every edit the padded batch makes between updates
(crops, row selections, leading columns dropped)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsample.engine import kv_growth as growing_cache_module
from llmsample.engine.hf_growing_cache import GrowingLayer, growing_cache
from llmsample.engine.kv_growth import NativeLayer
from llmsample.engine.padded import PaddedBatch
from tests.conftest import make_tiny_model


@pytest.fixture(autouse=True)
def _restore_threshold():
    before = growing_cache_module.CONCAT_BELOW
    yield
    growing_cache_module.CONCAT_BELOW = before


EDITS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 40)),
        st.tuples(st.just("crop"), st.integers(0, 5)),
        st.tuples(st.just("select"), st.lists(st.integers(0, 5), min_size=1, max_size=4)),
        st.tuples(st.just("lead"), st.integers(0, 3)),
    ),
    max_size=25,
)


@pytest.mark.parametrize("kind", [GrowingLayer, NativeLayer], ids=["transformers", "native"])
@pytest.mark.parametrize("concat_below", [0, 200], ids=["in-place", "concatenated-while-small"])
@given(edits=EDITS)
@settings(deadline=None)  # a stall of the loaded host is not a failure of the layer
def test_a_growing_layer_holds_what_concatenation_holds(
    kind: type, concat_below: int, edits: list[tuple[str, Any]]
) -> None:
    growing_cache_module.CONCAT_BELOW = concat_below  # restored by the fixture below
    layer, keys = kind(), torch.zeros(3, 2, 0, 4)
    rows = 3
    for kind, n in edits:
        length = keys.shape[2]
        if kind == "append":
            new = torch.randn(rows, 2, n, 4)
            got, values = layer.update(new, -new)
            keys = torch.cat([keys, new], 2)
            assert torch.equal(got, keys) and torch.equal(values, -keys)
        elif layer.keys is None or length == 0:
            continue
        elif kind == "crop":  # the padded batch's trailing holes
            end = max(0, length - n)
            layer.keys, layer.values, keys = layer.keys[:, :, :end], layer.values[:, :, :end], keys[:, :, :end]
        elif kind == "select":  # rows leave, are reordered or replicated
            index = torch.tensor([i % rows for i in n])
            layer.keys, layer.values, keys = layer.keys[index], layer.values[index], keys[index]
            rows = len(n)
            assert layer._key_buffer is None and layer._value_buffer is None  # the old cache let go at once
        else:  # leading columns every row pads
            first = min(n, length)
            layer.keys, layer.values, keys = layer.keys[:, :, first:], layer.values[:, :, first:], keys[:, :, first:]
    if layer.keys is not None:
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, -keys)


def test_a_step_writes_in_place(tmp_path) -> None:
    """The point of it: a one-token step copies none of the cache (the buffer stays, the view grows)."""
    from llmsample.models.loading import load_model

    growing_cache_module.CONCAT_BELOW = 0  # the tiny model's cache is far below the threshold

    lm = load_model(str(make_tiny_model(tmp_path)), "cpu", "float32")
    batch = PaddedBatch(lm.model)
    batch.admit([[3, 4, 5], [6, 7]])
    first = batch.cache.layers[0]
    before = first._key_buffer.data_ptr()
    for _ in range(5):
        batch.step(torch.tensor([1, 2]))
    assert first.keys.shape[2] == 8 and first._key_buffer.data_ptr() == before
    assert all(type(layer) is GrowingLayer for layer in growing_cache(lm.model.config).layers)


def test_a_small_cache_is_concatenated_until_it_is_worth_a_buffer() -> None:
    """Below the threshold an update copies (no buffer, as transformers' layer); the update that
    crosses it moves the cache into a buffer, and the next one writes in place."""
    growing_cache_module.CONCAT_BELOW = 2 * 2 * 4 * 4  # rows x heads x 4 positions x dim
    layer = GrowingLayer()
    keys = torch.randn(2, 2, 3, 4)
    layer.update(keys, keys)
    assert layer._key_buffer is None and torch.equal(layer.keys, keys)
    step = torch.randn(2, 2, 1, 4)
    layer.update(step, step)  # 4 positions: at the threshold, into a buffer
    assert layer._key_buffer is not None
    buffer = layer._key_buffer.data_ptr()
    layer.update(step, step)
    assert layer._key_buffer.data_ptr() == buffer and layer.keys.data_ptr() == buffer
    assert torch.equal(layer.keys, torch.cat([keys, step, step], 2))
