"""Sequences of different lengths decoding together: one KV cache, left-padded, with an attention
mask and per-row positions, that rows join (a padded prefill merged in) and leave (dropped).

Rotary keys are stored already rotated at their own positions, so shifting a row's cache along
the time axis changes nothing it attends to; the mask hides the padding, and each row's
position ids count only its own tokens."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from llmsample.engine.kv_growth import Growing, NativeCache
from llmsample.errors import RuntimeFailure
from llmsample.models.compiled import cache_arg
from llmsample.models.placement import input_device


class PaddedBatch:
    """The decoding state of a changing set of rows: cache ``[rows, heads, T, dim]`` per layer,
    ``mask`` ``[rows, T]`` (1 for a real token) and ``positions`` ``[rows]`` (the next token's).
    Mask and positions live on the input device; each layer's cache on that layer's device
    (``--device-map``), so rows are selected there with an index of its own.

    A rolled-back row keeps its rejected entries as masked holes (the mask hides them, and the
    positions count only real tokens), so one row's rollback never copies the others' cache;
    columns that are holes in every row are cropped before the next pass."""

    can_join = True
    compile_s = 0.0
    splits_ragged = False
    joining = None  # a joining row is prefilled in a pass of its own
    reused = None  # no prompt cache of its own (a CachingBackend's)

    @property
    def prefixes(self) -> PaddedBatch:
        """Rows' prefixes kept and admitted again: :meth:`save`, :meth:`admit_saved`."""
        return self

    @property
    def layers(self) -> PaddedBatch:
        """A prompt's layers: :meth:`admit_layers`."""
        return self

    def __init__(
        self,
        model: Any,
        sample_device: torch.device | None = None,
        on_forward: Callable[[float], None] | None = None,
    ) -> None:
        """``on_forward``: told the seconds of every forward pass (the benchmark's model share)."""
        self.model = model
        self.cache_arg = cache_arg(model)
        self.cache = new_cache(model)
        self.device = device = input_device(model)
        self.sample_device = sample_device or device
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=device)
        self.positions = torch.zeros(0, dtype=torch.long, device=device)
        self._lengths: list[int] = []  # each row's real tokens, on the host
        self._tails: list[int] = []  # at least this many columns after each row's last real token are holes
        self.on_forward = on_forward
        self.full_attention = self.attends_fully(model)

    @staticmethod
    def supports(model: Any) -> bool:
        """Whether every layer's cache can be padded: full attention, or a sliding window (kept
        whole, the mask applying the window); not linear attention or other kinds. llmsample's own
        models (:mod:`llmsample.models.native_llama`) always can."""
        if native(model):
            return True
        from llmsample.engine.hf_growing_cache import GrowingLayer, growing_cache

        return all(type(layer) is GrowingLayer for layer in growing_cache(model.config).layers)

    @staticmethod
    def attends_fully(model: Any) -> bool:
        """Whether every layer is full attention (no sliding window)."""
        if native(model):
            return bool(model.attends_fully)
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        return all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers)

    @property
    def ragged(self) -> bool:
        """Rows verify ragged drafts and roll back alone. A sliding window is applied by cache
        column, so it needs each row's tokens contiguous: with a window, only a row alone (its
        rolled-back holes are all at the end, cropped before the next pass)."""
        return self.full_attention or self.rows <= 1

    @property
    def rows(self) -> int:
        return self.mask.shape[0]

    @torch.inference_mode()
    def admit(self, prompts: list[list[int]], hidden: list[Tensor] | None = None) -> Tensor:
        """Prefill ``prompts`` together (left-padded) and add them as the last rows; returns their
        next-token logits ``[len(prompts), vocab]``. ``hidden``: given, it is filled with the
        model's hidden states of the pass (:meth:`admit_layers`)."""
        self._crop_holes()  # before the rows change
        device = self.device
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        cache = new_cache(self.model)
        logits = self._forward(ids, mask, positions, cache, keep_last=True, hidden=hidden)[:, -1]
        self._merge(cache, mask, torch.tensor([len(p) for p in prompts], device=device))
        self._lengths += [len(p) for p in prompts]
        self._tails += [0] * len(prompts)  # left-padding a merge keeps every row's end
        return logits

    @torch.inference_mode()
    def admit_layers(self, prompt: list[int]) -> Tensor:
        """:meth:`admit` of one prompt that also reads the residual stream at its last position
        after the embeddings and after each layer through the final norm and the head (the
        logit lens, :mod:`llmsample.models.lens_readout`): ``[layers + 1, vocab]`` on the sample device,
        the last row the admitted row's next-token logits."""
        from llmsample.models.lens_readout import norm_inputs, read_out

        hidden: list[Tensor] = []
        try:
            with norm_inputs(self.model) as normed:
                logits = self.admit([prompt], hidden)
            streams = [*hidden[:-1], normed[-1]]
            lens = read_out(self.model, [stream[:, -1:] for stream in streams]).to(self.sample_device)
        except ValueError as exc:
            raise RuntimeFailure(f"cannot read the layers: {exc}") from exc
        # The same operations on the same numbers: equal in float32; a bf16 kernel may round apart,
        # a soft cap or a scale after the head would not come near.
        if (lens[-1] - logits[0]).abs().max() > 1e-2 * logits.abs().max().clamp_min(1):
            raise RuntimeFailure("cannot read the layers: the model's head does more than its final norm and a linear map")
        return lens

    @torch.inference_mode()
    def admit_copies(self, prompt: list[int], copies: int) -> Tensor:
        """``copies`` rows of one prompt: prefilled once, the new row's cache replicated."""
        logits = self.admit([prompt])
        if copies > 1:
            last = self.rows - 1
            self._select([*range(self.rows), *[last] * (copies - 1)])
        return logits.expand(copies, -1)

    @torch.inference_mode()
    def step(self, tokens: Tensor) -> Tensor:
        """One token per row in (``[rows]``), next-token logits ``[rows, vocab]`` out."""
        self._crop_holes()
        # No row has padding or holes (a single stream, one prompt's rows): the model is given no
        # mask, as transformers would drop an all-ones one only after checking every entry of it.
        dense = min(self._lengths, default=0) == self.mask.shape[1]
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.rows, 1)], dim=1)
        tokens = tokens.view(-1, 1).to(self.device)
        mask = None if dense else self.mask
        logits = self._forward(tokens, mask, self.positions.view(-1, 1), self.cache)[:, -1]
        self.positions = self.positions + 1
        self._lengths = [n + 1 for n in self._lengths]
        self._tails = [0] * self.rows
        return logits

    @torch.inference_mode()
    def verify(self, tokens: list[list[int]]) -> Tensor:
        """Each row's tokens (ragged, right-padded in one pass); logits ``[rows, longest, vocab]``."""
        self._crop_holes()
        width = max(len(t) for t in tokens)
        ids = torch.tensor([t + [0] * (width - len(t)) for t in tokens], device=self.device)
        new = torch.tensor([[1] * len(t) + [0] * (width - len(t)) for t in tokens], device=self.device)
        positions = self.positions.view(-1, 1) + torch.arange(width, device=self.device)
        self.mask = torch.cat([self.mask, new], dim=1)
        logits = self._forward(ids, self.mask, positions, self.cache)
        self.positions = self.positions + new.sum(-1)
        self._lengths = [n + len(t) for n, t in zip(self._lengths, tokens, strict=True)]
        self._tails = [width - len(t) for t in tokens]  # a shorter row's padding
        return logits

    @torch.inference_mode()
    def save(self, row: int, length: int) -> SavedRow:
        """A copy of row ``row``'s first ``length`` real positions' keys and values (the prompt cache's)."""
        columns = self.mask[row].nonzero().view(-1)[:length]
        layers = []
        for layer in self._layers(self.cache):
            keys = getattr(layer, "keys", None)
            if keys is None:
                layers.append(None)
                continue
            here = columns.to(keys.device)
            layers.append((keys[row : row + 1].index_select(2, here), layer.values[row : row + 1].index_select(2, here)))
        return SavedRow(layers)

    @torch.inference_mode()
    def admit_saved(self, saved: SavedRow, length: int, rest: list[int]) -> Tensor:
        """A new last row: ``saved``'s first ``length`` positions, then ``rest`` prefilled after them."""
        self._crop_holes()
        cache = new_cache(self.model)
        for layer, kept in zip(self._layers(cache), saved.layers, strict=True):
            if kept is not None:  # the next update copies these into a buffer of the layer's own
                layer.dtype, layer.device, layer.is_initialized = kept[0].dtype, kept[0].device, True
                layer.keys, layer.values = kept[0][:, :, :length], kept[1][:, :, :length]
        total = length + len(rest)
        ids = torch.tensor([rest], device=self.device)
        mask = torch.ones(1, total, dtype=torch.long, device=self.device)
        positions = torch.arange(length, total, device=self.device).view(1, -1)
        logits = self._forward(ids, mask, positions, cache, keep_last=True)[:, -1]
        self._merge(cache, mask, torch.tensor([total], device=self.device))
        self._lengths.append(total)
        self._tails.append(0)
        return logits

    def rollback(self, row: int, length: int) -> None:
        """Row ``row`` keeps its first ``length`` real tokens; later ones become holes."""
        kept = self.mask[row].cumsum(0) <= length
        self.mask = self.mask.clone()
        self.mask[row] = self.mask[row] * kept
        self.positions = self.positions.clone()
        self.positions[row] = length
        # Its removed tokens were its last real ones: that many more trailing holes at least
        # (more where earlier holes sat between them), so cropping by this never cuts a real token.
        self._tails[row] += self._lengths[row] - length
        self._lengths[row] = length

    def agree(self, tokens: Tensor) -> Tensor:
        return tokens

    def close(self) -> None:
        """Nothing leased: the cache goes with the object."""

    def _crop_holes(self) -> None:
        """Drop trailing columns that no row uses (rolled-back drafts) before they cost attention;
        the host knows how many there are at least, so this never waits on the device."""
        trim = min(self._tails, default=0)
        if trim <= 0:
            return
        end = self.mask.shape[1] - trim
        self._tails = [t - trim for t in self._tails]
        self.mask = self.mask[:, :end]
        for layer in self._filled(self.cache):
            layer.keys, layer.values = layer.keys[:, :, :end], layer.values[:, :, :end]

    def keep(self, rows: list[int]) -> None:
        """Only these rows go on (finished rows leave); padding no row needs any more is trimmed."""
        if not rows:
            self.cache = new_cache(self.model)
            self.mask, self.positions = self.mask[:0, :0], self.positions[:0]
            self._lengths, self._tails = [], []
            return
        self._crop_holes()
        self._select(rows)
        # Leading columns that are padding in every remaining row cost attention for nothing.
        used = self.mask.any(0)
        first = int(used.int().argmax()) if bool(used.any()) else self.mask.shape[1]
        self.mask = self.mask[:, first:]
        for layer in self._filled(self.cache):
            layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]

    def _select(self, rows: list[int]) -> None:
        """These rows of mask, positions and every layer's cache, in this order (repeats replicate)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        self.mask, self.positions = self.mask[index], self.positions[index]
        self._lengths = [self._lengths[i] for i in rows]
        self._tails = [self._tails[i] for i in rows]
        for layer in self._filled(self.cache):
            here = index.to(layer.keys.device)
            layer.keys, layer.values = layer.keys[here], layer.values[here]

    def _forward(
        self,
        ids: Tensor,
        mask: Tensor | None,
        positions: Tensor,
        cache: Any,
        keep_last: bool = False,
        hidden: list[Tensor] | None = None,
    ) -> Tensor:
        start = time.perf_counter()
        width = (self.mask if mask is None else mask).shape[1]  # a dense step passes no mask
        try:
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1 if keep_last else 0,
                **{self.cache_arg: cache},
                **({} if hidden is None else {"output_hidden_states": True}),
            )
        except torch.OutOfMemoryError as exc:
            raise RuntimeFailure(
                f"out of memory on {ids.device} with {ids.shape[0]} rows of {width} positions; "
                "try a smaller --batch-size"
            ) from exc
        logits = out.logits.float().to(self.sample_device)
        if hidden is not None:
            hidden.extend(out.hidden_states)
        if self.on_forward is not None:
            self.on_forward(time.perf_counter() - start)
        return logits

    def _merge(self, new: Any, new_mask: Tensor, new_positions: Tensor) -> None:
        """Append the rows of ``new``, left-padding whichever side is shorter in time."""
        old_t, new_t = self.mask.shape[1], new_mask.shape[1]
        width = max(old_t, new_t)
        if self.rows == 0:
            self.cache, self.mask, self.positions = new, new_mask, new_positions
            return
        for old_layer, new_layer in zip(self._layers(self.cache), self._layers(new), strict=True):
            old_layer.keys = torch.cat([_left_pad(old_layer.keys, width), _left_pad(new_layer.keys, width)])
            old_layer.values = torch.cat([_left_pad(old_layer.values, width), _left_pad(new_layer.values, width)])
        self.mask = torch.cat([_left_pad(self.mask, width, dim=1), _left_pad(new_mask, width, dim=1)])
        self.positions = torch.cat([self.positions, new_positions])

    @classmethod
    def _filled(cls, cache: Any) -> list[Any]:
        """The layers that hold tensors (a model without a cache of its own leaves them empty)."""
        return [layer for layer in cls._layers(cache) if getattr(layer, "keys", None) is not None]

    @staticmethod
    def _layers(cache: Any) -> list[Any]:
        layers = list(cache.layers)
        if not all(isinstance(layer, Growing) for layer in layers):  # open_backend asks supports() first
            raise ValueError(f"the padded batch cannot hold {sorted({type(layer).__name__ for layer in layers})}")
        return layers


class SavedRow:
    """One row's keys and values per layer (None for a layer without a cache), ``[1, heads, T, dim]``."""

    def __init__(self, layers: list[tuple[Tensor, Tensor] | None]) -> None:
        self.layers = layers
        self.nbytes = sum(k.nbytes + v.nbytes for k, v in (pair for pair in layers if pair is not None))

    def release(self) -> None:
        self.layers = []


def native(model: Any) -> bool:
    """Whether ``model`` is llmsample's own (:mod:`llmsample.models.native_llama`), whose cache is a
    :class:`~llmsample.engine.kv_growth.NativeCache`."""
    return getattr(model, "is_native", False) is True


def new_cache(model: Any) -> Any:
    """An empty cache whose layers grow in place: the model's own, else transformers' for its config
    (:mod:`llmsample.engine.hf_growing_cache`, imported only then)."""
    if native(model):
        return NativeCache(model.config.num_hidden_layers)
    from llmsample.engine.hf_growing_cache import growing_cache

    return growing_cache(model.config)


def _left_pad(tensor: Tensor, width: int, dim: int = 2) -> Tensor:
    """Zeros in front along ``dim`` (the time axis) up to ``width``."""
    missing = width - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)
