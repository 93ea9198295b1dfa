"""The draw on the host (a CPU chain's few candidates) picks what the tensor draw picks, bit for
bit: the same uniforms, the same float64 running sum, the same edge and broken rows."""

from __future__ import annotations

import math
from unittest import mock

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsample.sampling import pipeline
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.drawing import draw_with, host_indices
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import make_generator, sampler_chain

UNIFORMS = st.one_of(st.floats(0.0, 1.0, exclude_max=True), st.sampled_from([0.0, 0.5, 1.0 - 2.0**-53]))


@st.composite
def probabilities(draw: st.DrawFn) -> torch.Tensor:
    """float32 rows as a chain hands them over: a softmax of spread or tied logits, with removed
    tokens (zeros), a row of zeros, a broken row."""
    batch, width = draw(st.integers(1, 3)), draw(st.integers(1, 256))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    kind = draw(st.sampled_from(["spread", "ties", "zeros", "broken"]))
    if kind == "ties":
        logits = torch.randint(0, 3, (batch, width), generator=generator).float()
    else:
        logits = torch.randn(batch, width, generator=generator) * draw(st.sampled_from([0.5, 4.0, 40.0]))
    logits[torch.rand(batch, width, generator=generator) < draw(st.sampled_from([0.0, 0.5]))] = -math.inf
    probs = logits.softmax(-1).nan_to_num(0.0)  # a row of -inf: zeros
    if kind == "zeros":
        probs[0] = 0.0
    if kind == "broken":
        probs[0, draw(st.integers(0, width - 1))] = draw(st.sampled_from([math.nan, math.inf]))
    return probs


@settings(max_examples=400, deadline=None)
@given(probabilities(), st.data())
def test_the_host_draw_picks_the_tensor_draws_index(probs: torch.Tensor, data: st.DataObject) -> None:
    cdf = probs.double().cumsum(-1)
    u = [data.draw(UNIFORMS) for _ in range(probs.shape[0])]
    if data.draw(st.booleans()):  # on a step of the running sum, where its last bit decides
        at = [data.draw(st.integers(0, probs.shape[1] - 1)) for _ in u]
        u = [min(float(row[i] / row[-1]), 1.0 - 2.0**-53) for row, i in zip(cdf, at, strict=True)]
    picked = host_indices(probs.tolist(), u)
    if not all(math.isfinite(s) for s in probs.double().sum(-1).tolist()):
        assert picked is None  # a broken row: the tensor draw decides
        return
    assert picked == draw_with(probs, torch.tensor(u, dtype=torch.float64).unsqueeze(-1)).tolist()


@st.composite
def logit_rows(draw: st.DrawFn) -> torch.Tensor:
    """Model-like rows of a 4096 vocabulary, sometimes with ties or a broken token."""
    batch = draw(st.integers(1, 3))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    if draw(st.booleans()):
        x = torch.randn(batch, 4096, generator=generator) * 4
    else:
        x = torch.randint(0, draw(st.integers(1, 6)), (batch, 4096), generator=generator).float()
    if draw(st.booleans()):
        x[0, draw(st.integers(0, 4095))] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    return x


CONFIGS = [
    SamplingConfig(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    SamplingConfig(temperature=0.7, top_k=50, top_p=0.9),
    SamplingConfig(temperature=1.3, top_k=0, top_p=0.5),
    SamplingConfig(temperature=1.0, top_k=200, top_p=1.0, xtc_threshold=0.1, xtc_probability=0.5),
]


@settings(max_examples=150, deadline=None)
@given(logit_rows(), st.sampled_from(CONFIGS), st.integers(0, 2**31))
def test_a_chain_draws_the_same_tokens_on_the_host(x: torch.Tensor, cfg: SamplingConfig, seed: int) -> None:
    """Each row from its own generator, as the engine draws; the generators end in the same state."""
    chain = sampler_chain(x, TokenHistory(None, None), cfg)
    ours = [make_generator(seed + r) for r in range(x.shape[0])]
    theirs = [make_generator(seed + r) for r in range(x.shape[0])]
    drawn = chain.draw(ours)
    with mock.patch.object(pipeline, "HOST_WIDTH", 0):  # the tensor draw over the candidates
        assert torch.equal(drawn, sampler_chain(x, TokenHistory(None, None), cfg).draw(theirs))
    assert all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(ours, theirs, strict=True))
