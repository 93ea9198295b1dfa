"""The compiled step's one-query attention against transformers' reference arithmetic."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsample.models.attention import decode_attention


class Module(torch.nn.Module):
    """What transformers' attention functions read off the calling layer."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def reference(query, key, value, mask, scale):
    """Repeat K/V per query head, additive mask, softmax: transformers' eager attention."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = query @ key.transpose(2, 3) * scale
    if mask is not None:
        scores = scores + torch.where(mask, 0.0, float("-inf"))
    return (scores.softmax(-1) @ value).transpose(1, 2)


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 3),
    kv_heads=st.integers(1, 3),
    groups=st.integers(1, 4),
    length=st.integers(1, 40),
    valid=st.integers(1, 40),
    seed=st.integers(0, 2**16),
)
def test_one_query_matches_repeated_kv_attention(batch, kv_heads, groups, length, valid, seed) -> None:
    """GQA without repeating K/V, any cache length, and masked (unused static-cache) slots."""
    gen = torch.Generator().manual_seed(seed)
    dim = 8
    query = torch.randn(batch, kv_heads * groups, 1, dim, generator=gen)
    key = torch.randn(batch, kv_heads, length, dim, generator=gen)
    value = torch.randn(batch, kv_heads, length, dim, generator=gen)
    mask = (torch.arange(length) < min(valid, length)).view(1, 1, 1, length).expand(batch, 1, 1, length)
    for m in (None, mask):
        out, weights = decode_attention(Module(groups), query, key, value, m, scaling=0.3)
        assert weights is None and out.shape == (batch, 1, kv_heads * groups, dim)
        torch.testing.assert_close(out, reference(query, key, value, m, 0.3), rtol=1e-5, atol=1e-5)


def test_masked_slots_are_ignored_whatever_they_hold() -> None:
    """A static cache's unused slots hold zeros, or stale keys after a rollback: never attended."""
    gen = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(1, 4, n, 8, generator=gen) for n in (1, 10, 10))
    key, value = key[:, :2], value[:, :2]
    mask = (torch.arange(10) < 6).view(1, 1, 1, 10)
    garbage_k, garbage_v = key.clone(), value.clone()
    garbage_k[..., 6:, :], garbage_v[..., 6:, :] = 1e4, -1e4
    out, _ = decode_attention(Module(2), query, key, value, mask, scaling=0.35)
    dirty, _ = decode_attention(Module(2), query, garbage_k, garbage_v, mask, scaling=0.35)
    short, _ = decode_attention(Module(2), query, key[..., :6, :], value[..., :6, :], None, scaling=0.35)
    torch.testing.assert_close(out, dirty)
    torch.testing.assert_close(out, short)


def test_an_additive_mask_works_like_a_boolean_one() -> None:
    gen = torch.Generator().manual_seed(1)
    query, key, value = torch.randn(2, 6, 1, 8, generator=gen), *torch.randn(2, 2, 2, 12, 8, generator=gen)
    allowed = torch.rand(2, 1, 1, 12, generator=gen) > 0.3
    allowed[..., 0] = True
    additive = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)
    a, _ = decode_attention(Module(3), query, key, value, allowed, scaling=0.35)
    b, _ = decode_attention(Module(3), query, key, value, additive, scaling=0.35)
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize(("queries", "bias"), [(5, False), (1, True)])
def test_several_queries_and_position_biases_go_to_sdpa(queries, bias) -> None:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    gen = torch.Generator().manual_seed(2)
    query, key, value = torch.randn(1, 4, queries, 8, generator=gen), *torch.randn(2, 1, 2, 5, 8, generator=gen)
    kwargs = {"position_bias": torch.randn(1, 4, queries, 5, generator=gen)} if bias else {}
    module = Module(2)
    ours, _ = decode_attention(module, query, key, value, None, scaling=0.35, **kwargs)
    theirs, _ = sdpa_attention_forward(module, query, key, value, None, scaling=0.35, **kwargs)
    torch.testing.assert_close(ours, theirs)
