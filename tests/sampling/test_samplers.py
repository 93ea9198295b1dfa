"""The samplers people tune: typical-p, top-n-sigma, XTC, DRY, logit bias, bans and min-tokens.
Hand-computed vectors, transformers' TypicalLogitsWarper as an oracle, the chain's order, and
properties."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsample.errors import UserError
from llmsample.sampling.config import ConfigError, SamplingConfig
from llmsample.sampling.filters import keep_top_n_sigma, keep_typical_p, keep_xtc
from llmsample.sampling.history import NO_HISTORY, TokenHistory
from llmsample.sampling.pipeline import sampler_chain
from llmsample.sampling.stages import FILTER_STAGES
from llmsample.sampling.text_stages import apply_dry, apply_logit_bias, mask_banned, mask_early_end
from llmsample.sampling.vocabulary import Vocabulary, ban_table, dry_penalties

PROBS = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
LOGITS = PROBS.log()


def kept(logits: torch.Tensor, row: int = 0) -> set[int]:
    return set(torch.isfinite(logits[row]).nonzero().flatten().tolist())


class FakeTokenizer:
    """Token texts given by hand; encodes a text to the ids of the tokens it is made of, greedily."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def __len__(self) -> int:
        return len(self.texts)

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        ids, rest = [], text
        while rest:
            best = max(
                (t for t, s in enumerate(self.texts) if s and rest.startswith(s)), key=lambda t: len(self.texts[t])
            )
            ids.append(best)
            rest = rest[len(self.texts[best]) :]
        return {"input_ids": ids}

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        return "".join(self.texts[i] for i in ids)

    def batch_decode(self, rows: list[list[int]], **kwargs: Any) -> list[str]:
        return [self.decode(row) for row in rows]


TEXTS = ["<eos>", "Hel", "lo", "Hello", " world", "l", "o w", "x", "a", "STOP", "ST", "OP"]
TOKENIZER = FakeTokenizer(TEXTS)


def history_of(prompt: list[int], generated: list[int], cfg: SamplingConfig) -> TokenHistory:
    history = TokenHistory.for_config(torch.tensor([prompt]), len(TEXTS), cfg, TOKENIZER, eos_ids=[0])
    for token in generated:
        history = history.advanced(torch.tensor([token]), [token])
    return history


# --- typical-p ----------------------------------------------------------------------------------


def test_typical_p_by_hand() -> None:
    # H = 1.2799 nats; |surprisal - H| = [.364, .076, .330, 1.023]: order 1, 2, 0, 3 with
    # cumulative mass .3, .5, .9, 1.0; the token that reaches the mass stays.
    assert kept(keep_typical_p(LOGITS, 0.2)) == {1}
    assert kept(keep_typical_p(LOGITS, 0.45)) == {1, 2}
    assert kept(keep_typical_p(LOGITS, 0.6)) == {0, 1, 2}
    assert kept(keep_typical_p(LOGITS, 0.95)) == {0, 1, 2, 3}
    assert keep_typical_p(LOGITS, 1.0) is LOGITS


@pytest.mark.parametrize("seed", range(12))
def test_typical_p_matches_transformers(seed: int) -> None:
    from transformers.generation.logits_process import TypicalLogitsWarper

    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 300, generator=g) * [0.5, 2.0, 4.0][seed % 3]
    logits[1, :40] = -math.inf  # an earlier filter's removals
    mass = [0.2, 0.5, 0.9, 0.95, 0.99, 0.05][seed % 6]
    expected = TypicalLogitsWarper(mass)(torch.zeros(3, 1, dtype=torch.long), logits.clone())
    ours = keep_typical_p(logits, mass)
    assert torch.equal(torch.isfinite(ours), torch.isfinite(expected))


# --- top-n-sigma ----------------------------------------------------------------------------------


def test_top_n_sigma_by_hand() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])  # mean 1.5, population std sqrt(1.25) = 1.118
    assert kept(keep_top_n_sigma(logits, 1.0)) == {2, 3}  # >= 3 - 1.118
    assert kept(keep_top_n_sigma(logits, 2.0)) == {1, 2, 3}  # >= 3 - 2.236
    assert kept(keep_top_n_sigma(logits, 3.0)) == {0, 1, 2, 3}
    assert kept(keep_top_n_sigma(logits, 0.5)) == {3}
    assert kept(keep_top_n_sigma(logits / 0.5, 1.0)) == {2, 3}  # a temperature does not move the set
    # removed tokens take no part in the mean and the deviation
    masked = torch.tensor([[-math.inf, 0.0, 1.0, 2.0, 3.0]])
    assert kept(keep_top_n_sigma(masked, 1.0)) == {3, 4}
    assert keep_top_n_sigma(logits, 0.0) is logits


# --- XTC ------------------------------------------------------------------------------------------


def test_xtc_removes_all_top_choices_but_the_least_likely() -> None:
    assert kept(keep_xtc(LOGITS, 0.25)) == {1, 2, 3}  # .4 and .3 pass: .4 goes
    assert kept(keep_xtc(LOGITS, 0.15)) == {2, 3}  # .4, .3, .2 pass: .2 stays
    assert kept(keep_xtc(LOGITS, 0.35)) == {0, 1, 2, 3}  # one passes: nothing happens
    ties = torch.tensor([[0.3, 0.3, 0.3, 0.1]]).log()
    assert kept(keep_xtc(ties, 0.2)) == {0, 1, 2, 3}  # all tied at the least likely: all stay


def test_xtc_samples_the_mixture_of_its_two_branches() -> None:
    cfg = SamplingConfig(xtc_threshold=0.25, xtc_probability=0.5)
    chain = sampler_chain(LOGITS, NO_HISTORY, cfg)
    assert chain.names[-1] == "xtc"
    fired = torch.tensor([0.0, 0.3, 0.2, 0.1]) / 0.6
    expected = 0.5 * PROBS[0] + 0.5 * fired
    torch.testing.assert_close(chain.probs[0], expected)
    always = sampler_chain(LOGITS, NO_HISTORY, SamplingConfig(xtc_threshold=0.25, xtc_probability=1.0))
    torch.testing.assert_close(always.probs[0], fired)


# --- DRY ------------------------------------------------------------------------------------------


def test_dry_penalises_the_token_that_would_extend_a_repeat() -> None:
    none: frozenset[int] = frozenset()
    # 1 2 3 4 1 2 3: the suffix "1 2 3" (n = 3) repeats; 4 followed it: 0.8 * 1.75 ** (3 - 2)
    sequence = [1, 2, 3, 4, 1, 2, 3]
    assert dry_penalties(sequence, 0.8, 1.75, 2, none) == {4: pytest.approx(1.4)}
    assert dry_penalties(sequence, 0.8, 1.75, 3, none) == {4: pytest.approx(0.8)}
    assert dry_penalties(sequence, 0.8, 1.75, 4, none) == {}
    assert dry_penalties(sequence, 0.8, 1.75, 2, frozenset({2})) == {}  # a breaker ends the match at n = 1
    assert dry_penalties(sequence, 0.8, 1.75, 2, frozenset({4})) == {}  # a breaker is never penalised
    assert dry_penalties(sequence, 0.8, 1.75, 1, frozenset({3})) == {}  # the last token breaks
    assert dry_penalties(sequence, 0.8, 1.75, 1, none, last_n=4) == {}  # only "4 1 2 3" is looked at
    # The longest match per candidate: 3 followed "5 3" (n = 1) by 9 and "1 3" (n = 2) by 7.
    assert dry_penalties([5, 3, 9, 1, 3, 7, 1, 3], 0.8, 1.75, 2, none) == {7: pytest.approx(0.8)}
    assert dry_penalties([5, 3, 9, 1, 3, 7, 1, 3], 1.0, 2.0, 1, none) == {9: 1.0, 7: 2.0}


def test_dry_in_the_chain_subtracts_from_the_logits_and_breakers_come_from_texts() -> None:
    cfg = SamplingConfig(dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=1, dry_sequence_breakers=("w",))
    history = history_of([1, 2, 7, 1], [2], cfg)  # "Hel lo x Hel lo": 7 followed "Hel lo" (n = 2)
    out = apply_dry(torch.zeros(1, len(TEXTS)), history, cfg)
    assert out[0, 7].item() == -2.0 and (out[0, :7] == 0).all() and (out[0, 8:] == 0).all()
    # " world" and "o w" hold the breaker "w": a match stops at them
    history = history_of([4, 7, 4], [], cfg)
    assert torch.equal(apply_dry(torch.zeros(1, len(TEXTS)), history, cfg), torch.zeros(1, len(TEXTS)))


# --- logit bias, bans, min-tokens -------------------------------------------------------------------


def test_logit_bias_by_id_and_by_text() -> None:
    cfg = SamplingConfig(logit_bias={"3": -100, " world": 2.5, "x": 1})
    out = apply_logit_bias(torch.zeros(1, len(TEXTS)), history_of([1], [], cfg), cfg)
    assert out[0, 3].item() == -100 and out[0, 4].item() == 2.5 and out[0, 7].item() == 1
    assert out.abs().sum().item() == 103.5
    with pytest.raises(UserError, match=r"'Hello world' encodes to 2 tokens"):
        history_of([1], [], SamplingConfig(logit_bias={"Hello world": 1}))
    with pytest.raises(UserError, match="outside the vocabulary"):
        history_of([1], [], SamplingConfig(logit_bias={"99": 1}))
    # a text the tokenizer knows as a token past the model's logits (an added token)
    with pytest.raises(ValueError, match=r"'OP' is token 11, outside the model's vocabulary \(0\.\.9\)"):
        Vocabulary(TOKENIZER, 10).token_id("OP")


def test_ban_tables_and_masks_across_token_boundaries() -> None:
    vocabulary = Vocabulary.of(TOKENIZER, len(TEXTS), [0])
    table = ban_table(vocabulary, ("Hello",))
    assert table.anywhere == {3}
    assert table.banned("") == {3}
    assert table.banned("say Hel") == {3, 2}  # "lo" completes it
    assert table.banned("Hell") == {3, 6}  # "o w" completes it
    cfg = SamplingConfig(ban=("Hello",))
    assert kept(mask_banned(torch.zeros(1, len(TEXTS)), history_of([8], [1], cfg), cfg)) == set(range(12)) - {2, 3}
    assert kept(mask_banned(torch.zeros(1, len(TEXTS)), history_of([8], [1, 5], cfg), cfg)) == set(range(12)) - {3, 6}
    # the prompt's text does not count: only what is generated must avoid the string
    assert kept(mask_banned(torch.zeros(1, len(TEXTS)), history_of([1], [], cfg), cfg)) == set(range(12)) - {3}


def test_min_tokens_masks_eos_and_stop_strings_until_n() -> None:
    cfg = SamplingConfig(min_tokens=2, stop=("STOP",))
    logits = torch.zeros(1, len(TEXTS))
    assert kept(mask_early_end(logits, history_of([8], [], cfg), cfg)) == set(range(12)) - {0, 9}
    assert kept(mask_early_end(logits, history_of([8], [10], cfg), cfg)) == set(range(12)) - {0, 9, 11}
    assert mask_early_end(logits, history_of([8], [10, 7], cfg), cfg) is logits


@pytest.mark.parametrize(
    ("cfg", "stages"),
    [
        (SamplingConfig(ban=tuple(t for t in TEXTS if t)), "the bans"),
        (SamplingConfig(ban=tuple(t for t in TEXTS if t), temperature=0.0), "the bans"),
        # the bans leave only EOS, which min-tokens removes: neither is lifted for the other
        (SamplingConfig(ban=tuple(t for t in TEXTS if t and t != "<eos>"), min_tokens=2), "the bans and min_tokens"),
    ],
)
def test_a_mask_that_leaves_nothing_is_never_lifted(cfg: SamplingConfig, stages: str) -> None:
    """Issue 25, 14: the bans used to be dropped when they removed every candidate (text came out,
    ``removed.ban`` 0). The row stays empty, its figures count no candidate, the emitter fails."""
    from types import SimpleNamespace

    from llmsample.engine.emitter import Emitter
    from llmsample.errors import RuntimeFailure
    from llmsample.events import RunStats
    from llmsample.sampling.figures import step_figures

    chain = sampler_chain(torch.zeros(2, len(TEXTS)), TokenHistory.stack([history_of([8], [], cfg)] * 2), cfg)
    assert not torch.isfinite(chain.final).any()
    figures = step_figures(chain, chain.draw(torch.Generator().manual_seed(0)), top_n=3)
    assert [f.candidates for f in figures] == [0, 0]
    assert sum(figures[0].removed.values()) == len(TEXTS)
    lm = SimpleNamespace(
        tokenizer=TOKENIZER,
        eos_ids={0},
        device="cpu",
        dtype=torch.float32,
        weights="float32",
        token_text=str,
        backend="transformers",
        model_file=None,
        context_length=None,
        deterministic=False,
    )
    emitter = Emitter(lm, cfg, RunStats("m", "p", None), torch.tensor([[8]]), ignore_eos=False)
    with pytest.raises(RuntimeFailure, match=f"^{stages} leave no token to generate at token 0 .position 1.:"):
        emitter.emit(figures[0])


# --- the chain ----------------------------------------------------------------------------------


EVERYTHING = SamplingConfig(
    temperature=0.9,
    top_k=10,
    top_p=0.95,
    min_p=0.01,
    typical_p=0.95,
    top_n_sigma=3.0,
    xtc_threshold=0.1,
    xtc_probability=0.5,
    dry_multiplier=0.8,
    logit_bias={"x": 1.0},
    ban=("Hello",),
    min_tokens=2,
    reasoning_budget=4,
    presence_penalty=0.5,
    no_repeat_ngram_size=3,
    dynatemp_range=0.3,
    smoothing_factor=0.1,
    epsilon_cutoff=1e-4,
    eta_cutoff=1e-4,
    top_h=0.99,
    top_a=0.01,
    p_less=True,
)


def test_the_chain_runs_in_the_documented_order() -> None:
    history = history_of([1, 2, 7, 1], [2], EVERYTHING)
    chain = sampler_chain(torch.randn(1, len(TEXTS)), history, EVERYTHING)
    assert chain.names == (
        "raw", "logit_bias", "ban", "min_tokens", "no_repeat_ngram", "reasoning_budget", "penalties", "dry", "temperature", "smoothing",
        "top_n_sigma", "top_k", "top_p", "typical_p", "epsilon", "eta", "top_h", "top_a", "p_less", "min_p", "xtc",
    )  # fmt: skip
    # the constraint: tests/constraints; mirostat replaces the truncation filters: tests/sampling/test_carried.py
    assert set(FILTER_STAGES) - {"constraint", "mirostat"} <= set(chain.names)
    greedy = sampler_chain(torch.randn(1, len(TEXTS)), history, EVERYTHING.with_overrides(temperature=0))
    assert greedy.names == ("raw", "logit_bias", "ban", "min_tokens", "no_repeat_ngram", "reasoning_budget", "penalties", "dry", "greedy")
    # off stages are not in the chain: the default chain is as it was
    assert sampler_chain(LOGITS, NO_HISTORY, SamplingConfig()).names == (
        "raw", "penalties", "temperature", "top_k", "top_p", "min_p",
    )  # fmt: skip


def test_histories_keep_sequences_through_prefixes_rows_and_stacks() -> None:
    history = history_of([8, 1], [2], EVERYTHING)
    assert history.sequences == ((8, 1, 2),) and history.generated(0) == (2,)
    prefixes = history.prefixes(torch.tensor([5, 7]))
    assert prefixes.sequences == ((8, 1, 2), (8, 1, 2, 5), (8, 1, 2, 5, 7))
    assert prefixes.rows(slice(1, 3)).generated(1) == (2, 5, 7)
    stacked = TokenHistory.stack([history, history.advanced(torch.tensor([4]), [4])])
    assert stacked.sequences == ((8, 1, 2), (8, 1, 2, 4)) and stacked.counts.shape[0] == 2
    assert TokenHistory.start(torch.tensor([[1]]), 4).sequences is None  # kept only on request


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"typical_p": 0}, "typical_p: must be in (0, 1]"),
        ({"top_n_sigma": -1}, "top_n_sigma: must be >= 0"),
        ({"xtc_threshold": 0}, "xtc_threshold: must be in (0, 0.5]"),
        ({"xtc_threshold": 0.6}, "xtc_threshold: must be in (0, 0.5]"),
        ({"xtc_probability": 1.5}, "xtc_probability: must be in [0, 1]"),
        ({"dry_multiplier": -0.1}, "dry_multiplier: must be >= 0"),
        ({"dry_base": 0.5}, "dry_base: must be >= 1"),
        ({"dry_allowed_length": 0}, "dry_allowed_length: must be an integer >= 1"),
        ({"dry_penalty_last_n": -1}, "dry_penalty_last_n: must be an integer >= 0"),
        ({"dry_sequence_breakers": [""]}, "dry_sequence_breakers: the strings must not be empty"),
        ({"logit_bias": {"5": 101}}, "logit_bias: the bias of '5' must be in [-100, 100]"),
        ({"logit_bias": {"5": "x"}}, "logit_bias: the bias of '5' must be a finite number"),
        ({"logit_bias": [1, 2]}, "logit_bias: expected TOKEN = BIAS"),
        ({"ban": [3]}, "ban: expected a string or a list of strings"),
        ({"min_tokens": -1}, "min_tokens: must be an integer >= 0"),
    ],
)
def test_new_keys_are_validated(values: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        SamplingConfig.from_mapping(values)
    assert fragment in str(info.value) and info.value.key == next(iter(values))


# --- properties ---------------------------------------------------------------------------------

rows = st.lists(
    st.floats(min_value=-20, max_value=20, allow_nan=False, allow_infinity=False, width=32), min_size=2, max_size=40
)


@settings(max_examples=150, deadline=None)
@given(rows, st.floats(0.01, 1.0), st.floats(0.01, 5.0), st.floats(0.01, 0.5), st.integers(0, 39))
def test_each_filter_keeps_a_nonempty_subset(row: list[float], mass: float, n: float, threshold: float, cut: int):
    logits = torch.tensor([row])
    logits[0, : cut % (len(row) - 1)] = -math.inf  # an earlier filter left at least two
    before = kept(logits)
    for out in (keep_typical_p(logits, mass), keep_top_n_sigma(logits, n), keep_xtc(logits, threshold)):
        assert kept(out) and kept(out) <= before
        assert torch.equal(out[torch.isfinite(out)], logits[torch.isfinite(out)])  # survivors untouched
    argmax = int(logits.argmax())
    assert argmax in kept(keep_top_n_sigma(logits, n))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, len(TEXTS) - 1), min_size=1, max_size=12), st.integers(0, 2**31))
def test_a_banned_string_is_never_generated(prompt: list[int], seed: int) -> None:
    cfg = SamplingConfig(ban=("Hello", "lol"), min_tokens=3, stop=("STOP",))
    history = history_of(prompt, [], cfg)
    g = torch.Generator().manual_seed(seed)
    for _ in range(12):
        probs = sampler_chain(torch.randn(1, len(TEXTS), generator=g), history, cfg).probs
        token = int(torch.multinomial(probs[0], 1, generator=g))
        history = history.advanced(torch.tensor([token]), [token])
    generated = history.generated(0)
    text = "".join(TEXTS[t] for t in generated)
    assert "Hello" not in text and "lol" not in text
    assert 0 not in generated[:3] and "STOP" not in "".join(TEXTS[t] for t in generated[:3])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=2, max_size=30), st.floats(0.1, 3), st.floats(1, 3), st.integers(1, 4))
def test_dry_only_lowers_logits_of_tokens_seen_before(sequence: list[int], mult: float, base: float, allowed: int):
    penalties = dry_penalties(sequence, mult, base, allowed, frozenset())
    assert all(v >= mult * 0.999 and math.isfinite(v) for v in penalties.values())
    assert set(penalties) <= set(sequence[1:])


def test_typical_p_candidates_and_full_sort_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    logits = torch.randn(3, 5000, generator=torch.Generator().manual_seed(4)) * 0.3  # a wide typical set
    for mass in (0.1, 0.5, 0.9, 0.999):
        widened = keep_typical_p(logits, mass)
        with monkeypatch.context() as patch:
            patch.setattr("llmsample.sampling.filters.host_syncs_are_free", lambda tensor: False)
            assert torch.equal(keep_typical_p(logits, mass), widened)
    assert len(kept(keep_typical_p(logits, 0.999))) > 256  # the widening was needed
