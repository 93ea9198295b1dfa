"""A transformers KV cache whose full-attention layers append in place: transformers'
``DynamicLayer`` with the growth of :mod:`llmsample.engine.kv_growth` (the scheme and its
measurements are described there)."""

from __future__ import annotations

from typing import Any

from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from llmsample.engine.kv_growth import Growing


def growing_cache(config: Any) -> DynamicCache:
    """A ``DynamicCache`` for ``config`` whose attention layers grow in place, sliding-window ones
    too: they keep every position, and the model's mask applies the window (by cache column,
    which is the distance in positions as long as a row's tokens are contiguous). Other layer
    kinds are kept as transformers makes them."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if type(layer) in GROWABLE else layer for layer in cache.layers]
    return cache


GROWABLE = (DynamicLayer, DynamicSlidingWindowLayer)


class GrowingLayer(Growing, DynamicLayer):
    """transformers' full-attention layer, its ``keys``/``values`` views of growing buffers."""

    def reset(self) -> None:
        self.drop_buffers()
        super().reset()
