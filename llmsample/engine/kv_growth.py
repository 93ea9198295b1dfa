"""KV cache layers that append in place, without transformers: the growth scheme that
:mod:`llmsample.engine.hf_growing_cache` gives transformers' ``DynamicLayer`` and that llmsample's
own models (:mod:`llmsample.models.native_llama`) use directly.

transformers' ``DynamicLayer`` concatenates every step: the whole cache is copied to add one
position (at batch 16 and 100 positions on the default model, about 70 MB a step). Measured
against it on ``PaddedBatch`` steps here: 9 % off a step at 1500 positions, 2–5 % at 50–100.
:class:`Growing` keeps each layer's keys and values as views of buffers with room to spare,
so a step writes its new column and copies nothing; a buffer that runs out is replaced by one a
quarter larger (an amortised copy per step of a few positions). A cache too small for that to
pay (one row of a few hundred positions) is concatenated, as transformers does. The padded batch
(:mod:`llmsample.engine.padded`) goes on editing ``keys``/``values`` as tensors: cropping the
end keeps the buffer (a prefix view), anything else (rows selected, leading columns dropped,
rows merged in) hands over a new tensor, which the next update copies into a new buffer."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

HEADROOM = 32  # positions added at least when a buffer grows (then a quarter of its length)
CONCAT_BELOW = 1 << 16  # elements of a layer's keys below which an update concatenates instead


class Growing:
    """A cache layer whose ``keys``/``values`` are views of buffers with room to spare.
    A buffer is kept only while its tensor is a view of it: one that is handed a new tensor (rows
    selected or merged) lets its buffer go at once, so the padded batch's edits never hold the
    old cache and the new one together for longer than transformers' own layer does.

    A step's update is on every layer's path (30 a step on the default model). A small cache is
    concatenated, as transformers does: below ``CONCAT_BELOW`` elements a copy costs less than
    the buffer's bookkeeping (one row of 60 positions, bf16: 12 µs an update against 25–28 µs in
    place; at 400 positions the two were even, at 16 rows of 100 the buffer took 41–47 µs against
    67–570 µs). A tensor this layer handed out and nobody has replaced since (``_fresh``) grows
    in place without the checks."""

    _key_buffer: Tensor | None = None
    _value_buffer: Tensor | None = None
    _keys_fresh = False  # ``keys`` is the view of ``_key_buffer`` that the last update made
    _values_fresh = False

    def __setattr__(self, name: str, value: Any) -> None:
        names = BUFFERS.get(name)
        if names is not None:
            buffer_name, fresh_name = names
            object.__setattr__(self, fresh_name, False)
            buffer = self.__dict__.get(buffer_name)
            if buffer is not None and not (value is not None and _views(value, buffer)):
                object.__setattr__(self, buffer_name, None)
        object.__setattr__(self, name, value)

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        if not getattr(self, "is_initialized", False):  # as lazy_initialization, whose signature varies
            self.dtype, self.device, self.is_initialized = key_states.dtype, key_states.device, True
            self.keys = self.values = None
        self._grow("keys", key_states)
        self._grow("values", value_states)
        return self.keys, self.values

    def _grow(self, name: str, new: Tensor) -> None:
        """``name`` followed by ``new`` along time, set without going through ``__setattr__``."""
        buffer_name, fresh_name = BUFFERS[name]
        current, buffer = self.__dict__.get(name), self.__dict__.get(buffer_name)
        view = None
        if self.__dict__.get(fresh_name) and current is not None and buffer is not None:
            view = _grown_in_place(current, buffer, new)
        if view is None:
            if buffer is None and _small(current, new):
                view = new if current is None or not current.numel() else torch.cat([current, new], dim=2)
            else:
                view, buffer = appended(current, buffer, new)
                object.__setattr__(self, buffer_name, buffer)
        object.__setattr__(self, name, view)
        object.__setattr__(self, fresh_name, True)

    def drop_buffers(self) -> None:
        self._key_buffer = self._value_buffer = None


BUFFERS = {"keys": ("_key_buffer", "_keys_fresh"), "values": ("_value_buffer", "_values_fresh")}


def _small(current: Tensor | None, new: Tensor) -> bool:
    """Whether ``current`` and ``new`` together are small enough to concatenate."""
    return (0 if current is None else current.numel()) + new.numel() < CONCAT_BELOW


def _grown_in_place(current: Tensor, buffer: Tensor, new: Tensor) -> Tensor | None:
    """``current``, a prefix view of ``buffer`` made by the last update, with ``new`` written
    after it: the longer view, or None when the buffer has no room or ``new`` does not fit it."""
    length, count = current.shape[2], new.shape[2]
    if length + count > buffer.shape[2] or new.shape[:2] != current.shape[:2] or new.dtype != buffer.dtype:
        return None
    buffer.narrow(2, length, count).copy_(new)
    return buffer.narrow(2, 0, length + count)


def appended(current: Tensor | None, buffer: Tensor | None, new: Tensor) -> tuple[Tensor, Tensor]:
    """``current`` (``[batch, heads, T, dim]``; None or empty before the first update) followed by
    ``new`` along the time axis: a view of ``buffer``, written in place when ``current`` is its
    prefix and there is room, else of a new buffer. Returns the view and the buffer."""
    length = current.shape[-2] if current is not None and current.numel() else 0
    needed = length + new.shape[-2]
    if buffer is None or current is None or not _is_prefix(current, buffer, new, needed):
        buffer = new.new_empty((*new.shape[:2], needed + max(HEADROOM, needed // 4), new.shape[-1]))
        if length:
            buffer[:, :, :length] = current
    buffer[:, :, length:needed] = new
    return buffer[:, :, :needed], buffer


def _is_prefix(current: Tensor, buffer: Tensor, new: Tensor, needed: int) -> bool:
    """Whether ``current`` is the first positions of ``buffer``, which has room for ``needed``."""
    if needed > buffer.shape[-2] or buffer.shape[:2] != new.shape[:2] or buffer.dtype != new.dtype:
        return False
    return not current.numel() or _views(current, buffer)


def _views(tensor: Tensor, buffer: Tensor) -> bool:
    """Whether ``tensor`` is the first positions of ``buffer`` (a prefix view along time)."""
    return tensor.data_ptr() == buffer.data_ptr() and tensor.stride() == buffer.stride()


class NativeLayer(Growing):
    """One layer of :class:`NativeCache`: the attributes the padded batch edits (``keys``,
    ``values``, ``is_initialized``, ``dtype``, ``device``), grown by :meth:`Growing.update`."""

    def __init__(self) -> None:
        self.is_initialized = False
        self.keys: Tensor | None = None
        self.values: Tensor | None = None

    def get_seq_length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]


class NativeCache:
    """A model's cache of :class:`NativeLayer` s, one per layer (``layers``, as transformers' caches)."""

    def __init__(self, layers: int) -> None:
        self.layers = [NativeLayer() for _ in range(layers)]

    def get_seq_length(self) -> int:
        return self.layers[0].get_seq_length() if self.layers else 0
