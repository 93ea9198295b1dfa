"""The chain's stages against the peers' own code on the same logits: llama.cpp's samplers
through llama-cpp-python (``llama_sampler_init_temp_ext``, ``_top_n_sigma``, ``_min_p``,
``_typical``, ``_xtc``) and transformers' warpers (epsilon, eta, top-h, typical,
no-repeat-ngram), on random logits and on the default model's real ones. The stages no installed
peer has (top-a, p-less, quadratic smoothing) are pinned by hand-computed vectors."""

from __future__ import annotations

import ctypes
import math

import pytest
import torch
from torch import Tensor

from llmsample.sampling import cutoffs
from llmsample.sampling.filters import keep_min_p, keep_top_n_sigma, keep_typical_p, keep_xtc
from llmsample.sampling.text_stages import ngram_completions

RANDOM_SEEDS = range(6)
PROMPTS = ("Once upon a time", "The capital of France is", "def fibonacci(n):")


def random_logits(seed: int, vocab: int = 200) -> Tensor:
    """Rows of varied sharpness: a peaked one, a flat one, and one in between."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(3, vocab, generator=g) * torch.tensor([[4.0], [0.5], [2.0]])


@pytest.fixture(scope="module")
def real_logits(default_lm) -> Tensor:
    """The default model's next-token logits after a few prompts ``[3, 49152]``."""
    rows = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = default_lm.tokenizer(prompt, return_tensors="pt").input_ids
            rows.append(default_lm.model(ids).logits[0, -1].float())
    return torch.stack(rows)


def llama_cpp(sampler: object, row: Tensor) -> dict[int, float]:
    """What a llama.cpp sampler leaves of ``row``: each kept id's logit (the sampler is freed)."""
    import llama_cpp as lib

    values = row.tolist()
    data = (lib.llama_token_data * len(values))(*(lib.llama_token_data(i, v, 0.0) for i, v in enumerate(values)))
    candidates = lib.llama_token_data_array(data, len(values), -1, False)
    try:
        lib.llama_sampler_apply(sampler, ctypes.byref(candidates))
    finally:
        lib.llama_sampler_free(sampler)
    left = candidates.data  # a sampler may move the start (XTC drops a prefix)
    return {left[i].id: left[i].logit for i in range(candidates.size) if left[i].logit > -math.inf}


def ours(row: Tensor) -> dict[int, float]:
    return {i: float(row[i]) for i in torch.nonzero(row > -math.inf).flatten().tolist()}


def assert_same_kept(mine: Tensor, theirs: dict[int, float], rtol: float = 0.0) -> None:
    """The same kept ids, and their renormalised probabilities alike (and with ``rtol`` their
    logits too)."""
    kept = ours(mine)
    assert set(kept) == set(theirs)
    ids = sorted(kept)
    a, b = torch.tensor([kept[i] for i in ids]), torch.tensor([theirs[i] for i in ids])
    if rtol:
        torch.testing.assert_close(a, b, rtol=rtol, atol=1e-5)
    torch.testing.assert_close(a.softmax(-1), b.softmax(-1), rtol=max(rtol, 1e-4), atol=1e-6)


def rows_of(source: str, seed: int, request: pytest.FixtureRequest) -> Tensor:
    return request.getfixturevalue("real_logits") if source == "real" else random_logits(seed)


# The real rows come from a fixture asked for by name, for one case alone: that case carries the marker.
SOURCES = [("random", seed) for seed in RANDOM_SEEDS] + [pytest.param("real", 0, marks=pytest.mark.model)]


# --- llama.cpp's samplers -------------------------------------------------------------------------


@pytest.mark.parametrize(("source", "seed"), SOURCES)
@pytest.mark.parametrize(("temperature", "spread", "exponent"), [(0.8, 0.5, 1.0), (1.0, 1.5, 2.0), (1.2, 0.3, 0.5)])
def test_dynamic_temperature_matches_llama_cpp_temp_ext(request, source, seed, temperature, spread, exponent) -> None:
    import llama_cpp as lib

    logits = rows_of(source, seed, request)
    mine = cutoffs.apply_dynamic_temperature(logits, temperature, spread, exponent)
    # llama.cpp sums a 49k row's softmax and entropy in order in float32: on a real row its
    # temperature was 2e-4 (relative) off the float64 formula's, ours 1e-5, so the logits of the
    # real rows agree to 1e-3 and ours are held to the float64 formula.
    rtol = 1e-3 if source == "real" else 1e-5
    for row in range(logits.shape[0]):
        theirs = llama_cpp(lib.llama_sampler_init_temp_ext(temperature, spread, exponent), logits[row])
        assert_same_kept(mine[row], theirs, rtol)
    probs = logits.double().softmax(-1)
    normalised = torch.special.entr(probs).sum(-1, keepdim=True) / math.log(logits.shape[-1])
    low = max(0.0, temperature - spread)
    exact = logits.double() / (low + (temperature + spread - low) * normalised**exponent)
    torch.testing.assert_close(mine.double(), exact, rtol=5e-5, atol=1e-5)


@pytest.mark.parametrize(("source", "seed"), SOURCES)
@pytest.mark.parametrize("stage", ["top_n_sigma", "min_p", "typical_p", "xtc"])
def test_truncation_matches_llama_cpp(request, source: str, seed: int, stage: str) -> None:
    import llama_cpp as lib

    logits = rows_of(source, seed, request)
    settings = {  # ours, and llama.cpp's sampler for the same setting (min_keep 1, XTC always firing)
        "top_n_sigma": (lambda x: keep_top_n_sigma(x, 1.5), lambda: lib.llama_sampler_init_top_n_sigma(1.5)),
        "min_p": (lambda x: keep_min_p(x, 0.05), lambda: lib.llama_sampler_init_min_p(0.05, 1)),
        "typical_p": (lambda x: keep_typical_p(x, 0.7), lambda: lib.llama_sampler_init_typical(0.7, 1)),
        "xtc": (lambda x: keep_xtc(x, 0.02), lambda: lib.llama_sampler_init_xtc(1.0, 0.02, 1, 0)),
    }
    mine, theirs = settings[stage]
    kept = mine(logits)
    for row in range(logits.shape[0]):
        assert_same_kept(kept[row], llama_cpp(theirs(), logits[row]))


# --- transformers' warpers ------------------------------------------------------------------------


def warper(name: str, value: float) -> object:
    from transformers.generation import logits_process as lp

    return {
        "epsilon": lambda: lp.EpsilonLogitsWarper(value),
        "eta": lambda: lp.EtaLogitsWarper(value),
        "top_h": lambda: lp.TopHLogitsWarper(value),
        "typical_p": lambda: lp.TypicalLogitsWarper(value),
    }[name]()


MINE = {
    "epsilon": cutoffs.keep_epsilon,
    "eta": cutoffs.keep_eta,
    "top_h": cutoffs.keep_top_h,
    "typical_p": keep_typical_p,
}


@pytest.mark.parametrize(("source", "seed"), SOURCES)
@pytest.mark.parametrize(
    ("stage", "value"),
    [("epsilon", 3e-4), ("epsilon", 0.02), ("eta", 3e-4), ("eta", 0.01), ("top_h", 0.4), ("top_h", 0.9),
     ("typical_p", 0.5)],
)  # fmt: skip
def test_cutoffs_match_transformers_warpers(request, source: str, seed: int, stage: str, value: float) -> None:
    logits = rows_of(source, seed, request)
    expected = warper(stage, value)(torch.zeros(logits.shape[0], 1, dtype=torch.long), logits.clone())
    mine = MINE[stage](logits, value)
    assert torch.equal(mine > -math.inf, expected > -math.inf)
    assert torch.equal(torch.where(mine > -math.inf, mine, 0.0), torch.where(expected > -math.inf, expected, 0.0))


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("seed", range(20))
def test_no_repeat_ngram_matches_transformers(n: int, seed: int) -> None:
    from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor

    g = torch.Generator().manual_seed(seed)
    sequence = torch.randint(0, 5, (1, int(torch.randint(1, 25, (1,), generator=g))), generator=g)
    expected = NoRepeatNGramLogitsProcessor(n)(sequence, torch.zeros(1, 5))
    assert ngram_completions(tuple(sequence[0].tolist()), n) == set(
        torch.nonzero(expected[0].isneginf()).flatten().tolist()
    )


# --- by hand: the stages no installed peer has ----------------------------------------------------


def probs_logits(*probs: float) -> Tensor:
    return torch.tensor([probs]).log()


def kept(logits: Tensor) -> set[int]:
    return set(torch.nonzero(logits[0] > -math.inf).flatten().tolist())


def test_top_a_by_hand() -> None:
    logits = probs_logits(0.5, 0.3, 0.15, 0.05)
    assert kept(cutoffs.keep_top_a(logits, 0.1)) == {0, 1, 2, 3}  # below 0.1 x 0.25 = 0.025: none
    assert kept(cutoffs.keep_top_a(logits, 0.25)) == {0, 1, 2}  # 0.0625: 0.05 goes
    assert kept(cutoffs.keep_top_a(logits, 1.0)) == {0, 1}  # 0.25: 0.15 goes
    assert kept(cutoffs.keep_top_a(logits, 4.0)) == {0}  # above p_max: the top stays
    assert cutoffs.keep_top_a(logits, 0.0) is logits


def test_p_less_by_hand() -> None:
    # sum p^2 = .25 + .09 + .0225 + .0025 = .365: only .5 reaches it
    assert kept(cutoffs.keep_p_less(probs_logits(0.5, 0.3, 0.15, 0.05))) == {0}
    # uniform: sum p^2 = 1/4 = every p, all stay
    assert kept(cutoffs.keep_p_less(probs_logits(0.25, 0.25, 0.25, 0.25))) == {0, 1, 2, 3}
    # .4, .4, .2: sum p^2 = .36
    assert kept(cutoffs.keep_p_less(probs_logits(0.4, 0.4, 0.2))) == {0, 1}
    # .45, .4, .15: sum p^2 = .385, .4 just above it stays
    assert kept(cutoffs.keep_p_less(probs_logits(0.45, 0.4, 0.15))) == {0, 1}


def test_smoothing_by_hand() -> None:
    logits = torch.tensor([[3.0, 2.0, 0.0, -math.inf]])
    # curve 1: max - f d^2 with d = -1, -3
    expected = torch.tensor([[3.0, 3.0 - 0.5, 3.0 - 0.5 * 9, -math.inf]])
    torch.testing.assert_close(cutoffs.apply_smoothing(logits, 0.5, 1.0), expected)
    # curve 3: k = 0, s = 1: max + f d^3
    expected = torch.tensor([[3.0, 3.0 - 0.5, 3.0 - 0.5 * 27, -math.inf]])
    torch.testing.assert_close(cutoffs.apply_smoothing(logits, 0.5, 3.0), expected)
    assert cutoffs.apply_smoothing(logits, 0.0, 1.0) is logits


def test_epsilon_and_eta_by_hand() -> None:
    logits = probs_logits(0.6, 0.3, 0.07, 0.03)
    assert kept(cutoffs.keep_epsilon(logits, 0.05)) == {0, 1, 2}
    assert kept(cutoffs.keep_epsilon(logits, 0.9)) == {0}  # the top always stays
    entropy = -sum(p * math.log(p) for p in (0.6, 0.3, 0.07, 0.03))  # 1.006 nats
    threshold = min(0.2, math.sqrt(0.2) * math.exp(-entropy))  # 0.163
    assert 0.07 < threshold < 0.3
    assert kept(cutoffs.keep_eta(logits, 0.2)) == {0, 1}


def test_dynamic_temperature_by_hand() -> None:
    # uniform: normalised entropy 1, the hottest temperature t + spread
    flat = torch.zeros(1, 4)
    torch.testing.assert_close(cutoffs.apply_dynamic_temperature(flat + 1.0, 1.0, 0.5, 1.0), (flat + 1.0) / 1.5)
    # one finite token among -inf: any temperature, the same single token
    single = torch.tensor([[2.0, -math.inf, -math.inf]])
    assert kept(cutoffs.apply_dynamic_temperature(single, 1.0, 0.5, 1.0)) == {0}
