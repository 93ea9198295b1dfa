"""llmsample's own forward pass of the Llama family (Llama and SmolLM2, Mistral, Qwen2) in plain
torch (``--backend torch``): no transformers import, so a cold start is ``import torch``, the
weights and the tokenizer.

Every operation is transformers' own (5.x, ``modeling_llama.py`` and the SDPA integration), in
its order and dtypes, so that the logits are transformers' on the same weights: RMSNorm in
float32 and cast back before the weight, rotary angles in float32 cast to the model's dtype,
attention through ``scaled_dot_product_attention`` with the mask transformers builds (none where
it would pass none, its GQA choices), SwiGLU. The modules carry transformers' names
(``model.embed_tokens``, ``model.layers[i].self_attn.q_proj``, ``lm_head``...), so a checkpoint
loads by its own keys and the logit lens (:mod:`llmsample.models.lens_readout`) finds the final norm and
the head. Its cache is any object with ``layers`` that ``update`` and ``get_seq_length()``: the
padded batch (:mod:`llmsample.engine.padded`) gives it :class:`~llmsample.engine.kv_growth.NativeCache`,
which it edits as it edits transformers' caches."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class Shape:
    """What the forward pass needs of a config, read by :func:`shape_of`."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    tied: bool
    window: int | None  # sliding window (Mistral), applied by the mask
    theta: float
    rope: dict[str, Any]  # the rope parameters (``rope_type`` "default" or "llama3")


ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def shape_of(config: Any) -> Shape:
    """The shape of a Llama, Mistral or Qwen2 config (attributes as in config.json); ValueError
    saying why for anything this forward would not compute as transformers does."""
    kind = getattr(config, "model_type", None)
    if kind not in ARCHITECTURES:
        raise ValueError(f"its architecture ({kind!r}) is not one of {', '.join(sorted(ARCHITECTURES))}")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise ValueError(f"its activation is {config.hidden_act!r}, not silu")
    heads, hidden = config.num_attention_heads, config.hidden_size
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    if heads % kv_heads:
        raise ValueError(f"{heads} attention heads do not share {kv_heads} key-value heads evenly")
    window = sliding_window(config, kind)
    bias = kind == "qwen2" or (kind == "llama" and bool(getattr(config, "attention_bias", False)))
    rope = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise ValueError(f"its rope type is {rope_type!r} (default and llama3 only)")
    theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise ValueError("its config.json gives no rope_theta")
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("it rotates part of each head only (partial_rotary_factor)")
    rope = {**rope, "rope_type": rope_type}
    if rope_type == "llama3":
        rope.setdefault("original_max_position_embeddings", config.max_position_embeddings)
    return Shape(
        vocab=config.vocab_size, hidden=hidden, layers=config.num_hidden_layers, heads=heads, kv_heads=kv_heads,
        head_dim=head_dim, intermediate=config.intermediate_size, eps=getattr(config, "rms_norm_eps", 1e-6),
        qkv_bias=bias, o_bias=kind != "qwen2" and bias, mlp_bias=kind == "llama" and bool(getattr(config, "mlp_bias", False)),
        tied=bool(getattr(config, "tie_word_embeddings", False)), window=window, theta=float(theta), rope=rope,
    )  # fmt: skip


def sliding_window(config: Any, kind: str) -> int | None:
    """Mistral's window over every layer (transformers' default 4096 where config.json names
    none); Qwen2's only when it is off (its windows cover some layers, not all)."""
    if kind == "mistral":
        return getattr(config, "sliding_window", 4096)
    if kind == "qwen2":
        types = set(getattr(config, "layer_types", None) or ["full_attention"])
        if getattr(config, "use_sliding_window", False) or types != {"full_attention"}:
            raise ValueError("its sliding windows cover some layers only (use_sliding_window)")
    return None


def rope_frequencies(shape: Shape) -> Tensor:
    """transformers' inverse frequencies (default, or Llama 3.1's scaled ones), float32 on the CPU."""
    dim = shape.head_dim
    inv_freq = 1.0 / (shape.theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    if shape.rope["rope_type"] != "llama3":
        return inv_freq
    factor, low, high = (shape.rope[k] for k in ("factor", "low_freq_factor", "high_freq_factor"))
    old_context = shape.rope["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RMSNorm(nn.Module):
    """transformers' ``LlamaRMSNorm``: normalised in float32, cast back, then scaled."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, hidden: Tensor) -> Tensor:
        dtype = hidden.dtype
        hidden = hidden.to(torch.float32)
        variance = hidden.pow(2).mean(-1, keepdim=True)
        hidden = hidden * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden.to(dtype)


def rotate_half(x: Tensor) -> Tensor:
    """The rotary pairing of transformers' half-split layout (not llama.cpp's interleaved one)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    """Grouped-query attention with rotary keys; the new keys and values go into ``layer``."""

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.head_dim, self.groups = shape.head_dim, shape.heads // shape.kv_heads
        self.scaling = shape.head_dim**-0.5
        self.q_proj = nn.Linear(shape.hidden, shape.heads * shape.head_dim, bias=shape.qkv_bias)
        self.k_proj = nn.Linear(shape.hidden, shape.kv_heads * shape.head_dim, bias=shape.qkv_bias)
        self.v_proj = nn.Linear(shape.hidden, shape.kv_heads * shape.head_dim, bias=shape.qkv_bias)
        self.o_proj = nn.Linear(shape.heads * shape.head_dim, shape.hidden, bias=shape.o_bias)

    def forward(self, hidden: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, layer: Any) -> Tensor:
        batch, length = hidden.shape[:2]
        split = (batch, length, -1, self.head_dim)
        query = self.q_proj(hidden).view(split).transpose(1, 2)
        key = self.k_proj(hidden).view(split).transpose(1, 2)
        value = self.v_proj(hidden).view(split).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        query, key = (query * cos) + (rotate_half(query) * sin), (key * cos) + (rotate_half(key) * sin)
        if layer is not None:
            key, value = layer.update(key, value)
        out = self.attend(query, key, value, mask)
        return self.o_proj(out.reshape(batch, length, -1).contiguous())

    def attend(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None) -> Tensor:
        """transformers' ``sdpa_attention_forward`` on a CPU or CUDA device: GQA in the kernel
        without a mask, one query's heads packed onto their key-value heads, else keys repeated."""
        length, extra = query.shape[2], {}
        if self.groups > 1:
            if mask is None and key.shape[-1] == value.shape[-1] <= 256:
                extra["enable_gqa"] = True
            elif length == 1:
                query = query.reshape(query.shape[0], query.shape[1] // self.groups, self.groups, query.shape[-1])
            else:
                key, value = repeat_kv(key, self.groups), repeat_kv(value, self.groups)
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=0.0, scale=self.scaling, is_causal=length > 1 and mask is None,
            **extra,
        )  # fmt: skip
        return out.reshape(out.shape[0], -1, length, value.shape[-1]).transpose(1, 2).contiguous()


def repeat_kv(states: Tensor, groups: int) -> Tensor:
    """Each key-value head repeated for the ``groups`` query heads that share it."""
    batch, heads, length, dim = states.shape
    return states[:, :, None].expand(batch, heads, groups, length, dim).reshape(batch, heads * groups, length, dim)


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(shape.hidden, shape.intermediate, bias=shape.mlp_bias)
        self.up_proj = nn.Linear(shape.hidden, shape.intermediate, bias=shape.mlp_bias)
        self.down_proj = nn.Linear(shape.intermediate, shape.hidden, bias=shape.mlp_bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP, each added to the residual stream."""

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.self_attn = Attention(shape)
        self.mlp = MLP(shape)
        self.input_layernorm = RMSNorm(shape.hidden, shape.eps)
        self.post_attention_layernorm = RMSNorm(shape.hidden, shape.eps)

    def forward(self, hidden: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, layer: Any) -> Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin, mask, layer)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Body(nn.Module):
    """transformers' ``LlamaModel``: embeddings, layers, final norm (``model.`` in the weights)."""

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(shape.vocab, shape.hidden)
        self.layers = nn.ModuleList(DecoderLayer(shape) for _ in range(shape.layers))
        self.norm = RMSNorm(shape.hidden, shape.eps)
        self.register_buffer("inv_freq", rope_frequencies(shape), persistent=False)

    def rotary(self, hidden: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        freqs = positions[..., None].float() * self.inv_freq.to(device=hidden.device, dtype=torch.float)
        angles = torch.cat((freqs, freqs), dim=-1)
        return (angles.cos() * 1.0).to(hidden.dtype), (angles.sin() * 1.0).to(hidden.dtype)


@dataclass
class Output:
    """What the padded batch reads of a pass, by transformers' names."""

    logits: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    cache: Any = None


class NativeCausalLM(nn.Module):
    """A Llama-family causal LM: ``model`` (:class:`Body`) and ``lm_head`` (the embeddings' own
    weight when tied). ``config`` and ``generation_config`` are config.json and
    generation_config.json as attributes."""

    is_native = True  # the padded batch makes its cache (engine.growth.NativeCache)

    def __init__(self, shape: Shape, config: Any, generation_config: Any) -> None:
        super().__init__()
        self.shape, self.config, self.generation_config = shape, config, generation_config
        self.model = Body(shape)
        self.lm_head = nn.Linear(shape.hidden, shape.vocab, bias=False)
        self.attends_fully = shape.window is None

    @property
    def base_model(self) -> Body:
        return self.model

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def tie_weights(self) -> None:
        """The head's weight is the embeddings' (one tensor) when config.json ties them."""
        if self.shape.tied:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: Any = None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        output_hidden_states: bool = False,
        past_key_values: Any = None,
    ) -> Output:
        """Logits ``[batch, kept positions, vocab]`` of ``input_ids`` after what ``cache`` holds
        (``use_cache`` without one: transformers would make a cache and return it, unused here)."""
        cache = cache if cache is not None else past_key_values
        hidden = self.model.embed_tokens(input_ids)
        past = cache.get_seq_length() if cache is not None else 0
        length = input_ids.shape[1]
        if position_ids is None:
            position_ids = (torch.arange(length, device=hidden.device) + past).unsqueeze(0)
        mask = causal_mask(attention_mask, hidden.shape[0], length, past, self.shape.window, hidden.device)
        cos, sin = self.model.rotary(hidden, position_ids)
        states = [hidden] if output_hidden_states else None
        for index, block in enumerate(self.model.layers):
            hidden = block(hidden, cos, sin, mask, None if cache is None else cache.layers[index])
            if states is not None:
                states.append(hidden)
        hidden = self.model.norm(hidden)
        if states is not None:
            states[-1] = hidden  # transformers' last hidden state is the normed one
        logits = self.lm_head(hidden[:, -logits_to_keep:, :])
        return Output(logits, None if states is None else tuple(states), cache)


def causal_mask(
    padding: Tensor | None, batch: int, length: int, past: int, window: int | None, device: torch.device
) -> Tensor | None:
    """transformers' SDPA mask (``masking_utils.sdpa_mask``): ``[batch, 1, length, past + length]``
    booleans, by cache column (causal, within ``window``, not padding), or None where
    transformers passes none (one query or a fresh prompt, nothing padded, no window reached)."""
    width = past + length
    if padding is not None:
        padding = padding.to(device=device, dtype=torch.bool)[:, :width]
        if padding.shape[-1] < width:
            padding = F.pad(padding, (0, width - padding.shape[-1]))
    windowed = window is not None and width >= window
    if not windowed and (length == 1 or width == length) and (padding is None or padding.sum() == padding.numel()):
        return None
    rows = (torch.arange(length, device=device) + past)[None, None, :, None]
    columns = torch.arange(width, device=device)[None, None, None, :]
    mask = columns <= rows
    if window is not None:
        mask = mask & (columns > rows - window)
    if padding is None:
        return mask.expand(batch, -1, length, width)
    return (mask & padding[:, None, None, :]).expand(batch, -1, length, width)
