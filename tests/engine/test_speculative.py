"""Speculative decoding: the rejection step by hand, greedy equality with the plain loop,
statistical exactness, and the KV cache after rejections."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from scipy.stats import chisquare

from llmsample.engine.loop import generate, run_to_end
from llmsample.engine.prompt import encode_prompt
from llmsample.engine.speculative import ModelDrafter, NgramDrafter, accept_by_draws, accept_drafts
from llmsample.events import RunStats
from llmsample.models.loading import load_model
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.history import NO_HISTORY, TokenHistory
from llmsample.sampling.pipeline import draw, make_generator, sampler_chain, sampling_probs
from tests.conftest import make_tiny_model


def dist(*values: float) -> torch.Tensor:
    return torch.tensor(values)


def run_accept(p: torch.Tensor, q: torch.Tensor, drafted: list[int], samples: int = 2000, seed: int = 0):
    """The rejection step on ``samples`` identical rows."""
    batch = samples
    p_b = p.expand(batch, *p.shape)
    q_b = q.expand(batch, *q.shape) if q.numel() else torch.zeros(batch, 0, p.shape[-1])
    d_b = torch.tensor(drafted, dtype=torch.long).expand(batch, len(drafted))
    return accept_drafts(p_b, q_b, d_b, make_generator(seed))


# --- the rejection step on hand-made distributions ---------------------------------------------


def test_all_accepted_then_the_extra_token_from_p() -> None:
    p = torch.stack([dist(0.1, 0.9, 0, 0), dist(0, 0, 1.0, 0), dist(0, 0, 0, 1.0)])
    q = torch.stack([dist(0.5, 0.5, 0, 0), dist(0, 0, 1.0, 0)])  # p(x) >= q(x): always accepted
    accepted, after = run_accept(p, q, [1, 2])
    assert (accepted == 2).all() and (after == 3).all()


def test_first_rejected_draws_from_the_residual() -> None:
    p = torch.stack([dist(0.5, 0.0, 0.5, 0), dist(0.25, 0.25, 0.25, 0.25)])
    q = torch.stack([dist(0.5, 0.5, 0, 0)])  # drafted 1 has p = 0: always rejected
    accepted, after = run_accept(p, q, [1])
    assert (accepted == 0).all()
    assert set(after.tolist()) == {2}  # residual max(0, p - q) = [0, 0, .5, 0]


def test_middle_rejected() -> None:
    p = torch.stack([dist(0, 1.0, 0, 0), dist(0.5, 0, 0, 0.5), dist(1.0, 0, 0, 0)])
    q = torch.stack([dist(0, 1.0, 0, 0), dist(0, 0, 1.0, 0)])
    accepted, after = run_accept(p, q, [1, 2])
    assert (accepted == 1).all()
    assert set(after.tolist()) == {0, 3}
    frac = (after == 0).float().mean().item()
    assert abs(frac - 0.5) < 5 * math.sqrt(0.25 / 2000)


def test_no_draft_samples_from_p() -> None:
    p = dist(0, 0, 1.0, 0)[None]
    accepted, after = run_accept(p, torch.zeros(0, 4), [])
    assert (accepted == 0).all() and (after == 2).all()


def test_q_equal_p_gives_no_nan_and_always_accepts() -> None:
    p = torch.softmax(torch.randn(3, 10, generator=torch.Generator().manual_seed(0)), -1)
    accepted, after = run_accept(p, p[:2].clone(), [3, 4])
    assert (accepted == 2).all() and not torch.isnan(after.float()).any()


def test_a_zero_residual_is_never_normalised() -> None:
    q = dist(0.25, 0.25, 0.25, 0.25)[None]
    p = torch.stack([q[0] * 0.5, dist(0, 1.0, 0, 0)])  # p <= q everywhere: residual all zeros
    accepted, after = run_accept(p, q, [0])
    rejected = accepted == 0
    assert rejected.any() and (~rejected).any()
    assert ((after >= 0) & (after < 4)).all()


def test_tokens_with_zero_target_probability_are_never_emitted() -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        p = torch.softmax(torch.randn(4, 16, generator=g), -1)
        p = p * (torch.rand(4, 16, generator=g) > 0.5)
        p[:, 0] += 1e-3  # at least one allowed token per row
        p = p / p.sum(-1, keepdim=True)
        q = torch.softmax(torch.randn(3, 16, generator=g), -1)
        drafted = draw(q, g)
        accepted, after = run_accept(p, q, drafted.tolist(), samples=500)
        for k in range(3):
            assert (p[k, drafted[k]] > 0) or (accepted <= k).all()
        rows = accepted.clamp(max=3)
        assert (p[rows, after] > 0).all()


def test_drafts_outside_the_targets_filters_are_never_emitted() -> None:
    g = torch.Generator().manual_seed(2)
    cfg = SamplingConfig(temperature=0.8, top_k=4, top_p=0.9, min_p=0.1)
    logits = torch.randn(3, 32, generator=g) * 2
    p = sampling_probs(logits, NO_HISTORY, cfg)
    q = torch.full((2, 32), 1 / 32)  # a draft that proposes anything
    drafted = draw(q, g)
    accepted, after = run_accept(p, q, drafted.tolist(), samples=3000)
    for k in range(2):
        if p[k, drafted[k]] == 0:
            assert (accepted <= k).all()
    assert (p[accepted.clamp(max=2), after] > 0).all()


# --- fixed drafts checked against the target's own draws ----------------------------------------


def fixed_draft_chain(seed: int, positions: int = 5):
    logits = torch.randn(positions, 40, generator=torch.Generator().manual_seed(seed)) * 2
    return sampler_chain(logits, NO_HISTORY, SamplingConfig(temperature=0.9, top_k=12, min_p=0.02))


@pytest.mark.parametrize("differs_at", [0, 2, 4])
def test_fixed_drafts_stand_while_they_equal_the_plain_draws(differs_at: int) -> None:
    chain = fixed_draft_chain(differs_at)
    plain_generator = make_generator(5)
    plain = [int(chain.rows(j).draw([plain_generator])) for j in range(5)]  # a plain run's tokens
    drafted = torch.tensor(plain[:4])
    if differs_at < 4:
        drafted[differs_at] = (plain[differs_at] + 1) % 40  # not what the plain run drew there
    generator = make_generator(5)
    count, after = accept_by_draws(chain, drafted, generator)
    assert int(count) == differs_at and int(after) == plain[differs_at]
    # the generator is where a plain run's is after as many tokens: the next draws agree
    plain_generator = make_generator(5)
    for j in range(differs_at + 1):
        chain.rows(j).draw([plain_generator])
    assert torch.equal(generator.get_state(), plain_generator.get_state())


def test_a_fixed_draft_stands_with_its_target_probability() -> None:
    chain = fixed_draft_chain(7, positions=2)
    p = chain.probs[0]
    token = int(p.argsort()[-2])  # the second most likely: neither certain nor rare
    n, generator = 4000, make_generator(11)
    stood = sum(int(accept_by_draws(chain, torch.tensor([token]), generator)[0]) for _ in range(n))
    assert abs(stood / n - float(p[token])) < math.sqrt(math.log(2 / 1e-6) / (2 * n))  # Hoeffding


# --- greedy equality with the plain loop -------------------------------------------------------


@pytest.fixture(scope="module")
def other_lm(tmp_path_factory: pytest.TempPathFactory):
    return load_model(str(make_tiny_model(tmp_path_factory.mktemp("other"), seed=1)), "cpu", "float32")


def plain_tokens(lm, cfg: SamplingConfig, prompt: str) -> list[int]:
    ids = encode_prompt(lm, prompt, raw=True)
    tokens, _ = run_to_end(generate(lm, ids, cfg, RunStats("t", "t", cfg.seed), ignore_eos=True))
    return [t.token_id for t in tokens]


def spec_run(lm, drafter, cfg: SamplingConfig, prompt: str, k: int | None):
    ids = encode_prompt(lm, prompt, raw=True)
    events = generate(lm, ids, cfg, RunStats("t", "t", cfg.seed), drafter=drafter, draft_tokens=k, ignore_eos=True)
    return run_to_end(events)


PROMPT = "w4 w8 w15 w16 w23 w4 w8 w15"


@pytest.mark.parametrize("k", [1, 2, 3, 5, None])
def test_greedy_equals_plain_with_the_target_as_draft(tiny_lm, k: int | None) -> None:
    cfg = SamplingConfig(temperature=0, max_tokens=30)
    tokens, summary = spec_run(tiny_lm, ModelDrafter(tiny_lm, 32), cfg, PROMPT, k)
    assert [t.token_id for t in tokens] == plain_tokens(tiny_lm, cfg, PROMPT)
    assert summary.facts.speculation.acceptance_rate > 0.95 and summary.facts.speculation.target_passes >= 2
    assert any(t.source == "draft" for t in tokens)


def test_an_interrupted_run_keeps_its_speculation_figures(tiny_lm) -> None:
    # The summary of a run cut short (Ctrl-C) comes from the caller's stats: they must already
    # count what was drafted and accepted, at every token.
    cfg = SamplingConfig(temperature=0, max_tokens=30)
    stats = RunStats("t", "t", None)
    ids = encode_prompt(tiny_lm, PROMPT, raw=True)
    events = generate(tiny_lm, ids, cfg, stats, drafter=ModelDrafter(tiny_lm, 32), draft_tokens=3)
    for _ in range(5):
        next(events)
    events.close()
    summary = stats.summary("interrupted")
    assert summary.facts.speculation.drafted >= 3 and summary.facts.speculation.accepted >= 3
    assert summary.facts.speculation.target_passes >= 1 and summary.facts.speculation.tokens_per_pass == pytest.approx(
        5 / summary.facts.speculation.target_passes
    )


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_equals_plain_with_an_unrelated_draft(tiny_lm, other_lm, k: int) -> None:
    cfg = SamplingConfig(temperature=0, max_tokens=30)
    tokens, summary = spec_run(tiny_lm, ModelDrafter(other_lm, 32), cfg, PROMPT, k)
    assert [t.token_id for t in tokens] == plain_tokens(tiny_lm, cfg, PROMPT)
    assert summary.facts.speculation.acceptance_rate < 0.3 and summary.facts.speculation.target_passes >= 2


@pytest.mark.parametrize("k", [2, 4, None])
def test_greedy_equals_plain_with_ngram(tiny_lm, k: int | None) -> None:
    cfg = SamplingConfig(temperature=0, max_tokens=60)
    tokens, summary = spec_run(tiny_lm, NgramDrafter(32, torch.device("cpu"), 1, 3), cfg, PROMPT, k)
    assert [t.token_id for t in tokens] == plain_tokens(tiny_lm, cfg, PROMPT)
    assert summary.facts.speculation.drafted > 0


@pytest.mark.parametrize("seed", range(6))
def test_sampled_with_ngram_gives_the_plain_runs_text(tiny_lm, seed: int) -> None:
    cfg = SamplingConfig(temperature=0.8, top_p=0.95, max_tokens=60, seed=seed)
    tokens, summary = spec_run(tiny_lm, NgramDrafter(32, torch.device("cpu"), 1, 3), cfg, PROMPT, None)
    assert [t.token_id for t in tokens] == plain_tokens(tiny_lm, cfg, PROMPT)
    assert summary.facts.speculation.drafted > 0


@pytest.mark.parametrize(
    "cfg",
    [
        SamplingConfig(temperature=0, max_tokens=40, dry_multiplier=2.0, dry_allowed_length=1),
        SamplingConfig(temperature=0, max_tokens=40, ban=("w8 w15",), logit_bias={"w23": 3.0}, min_tokens=5),
    ],
)
def test_greedy_with_text_aware_stages_equals_plain(tiny_lm, other_lm, cfg: SamplingConfig) -> None:
    expected = plain_tokens(tiny_lm, cfg, PROMPT)
    for drafter in (ModelDrafter(other_lm, 32), NgramDrafter(32, torch.device("cpu"), 1, 3)):
        tokens, _ = spec_run(tiny_lm, drafter, cfg, PROMPT, None)
        assert [t.token_id for t in tokens] == expected


def test_long_greedy_run_survives_rejections(tiny_lm, other_lm) -> None:
    cfg = SamplingConfig(temperature=0, max_tokens=320)
    expected = plain_tokens(tiny_lm, cfg, PROMPT)
    for drafter in (ModelDrafter(other_lm, 32), NgramDrafter(32, torch.device("cpu"), 1, 4)):
        tokens, summary = spec_run(tiny_lm, drafter, cfg, PROMPT, None)
        assert [t.token_id for t in tokens] == expected
        assert summary.facts.speculation.accepted < summary.facts.speculation.drafted  # there were rejections


def test_padded_draft_vocabulary(tmp_path: Path, tiny_lm) -> None:
    wider = load_model(str(make_tiny_model(tmp_path / "wide", vocab_size=40, seed=3)), "cpu", "float32")
    cfg = SamplingConfig(temperature=0, max_tokens=20)
    tokens, _ = spec_run(tiny_lm, ModelDrafter(wider, 32), cfg, PROMPT, 3)
    assert [t.token_id for t in tokens] == plain_tokens(tiny_lm, cfg, PROMPT)


# --- statistical exactness ---------------------------------------------------------------------

VOCAB = 12
SAMPLES = 120_000
CONFIGS = {
    "temperature": SamplingConfig(temperature=1.3),
    "filters": SamplingConfig(temperature=0.9, top_k=8, top_p=0.9, min_p=0.05),
    "penalties": SamplingConfig(temperature=1.0, frequency_penalty=0.8, presence_penalty=0.5, repetition_penalty=1.5),
    "typical_p": SamplingConfig(temperature=1.2, typical_p=0.7),
    "top_n_sigma": SamplingConfig(temperature=1.5, top_n_sigma=1.0),
    # XTC: p and q are the mixtures of its two branches; 0.08 puts several tokens above it here
    "xtc": SamplingConfig(temperature=1.2, min_p=0.02, xtc_threshold=0.08, xtc_probability=0.6),
    "dynatemp_smoothing": SamplingConfig(temperature=1.0, dynatemp_range=0.6, dynatemp_exponent=1.5, smoothing_factor=0.3),
    "epsilon_eta_top_a": SamplingConfig(temperature=1.3, epsilon_cutoff=0.02, eta_cutoff=0.01, top_a=0.1),
    "top_h": SamplingConfig(temperature=1.5, top_h=0.8),
    "p_less": SamplingConfig(temperature=1.5, p_less=True),
    "samplers_order": SamplingConfig(temperature=1.8, top_k=8, min_p=0.2, top_a=0.1, samplers="min_p,top_k,temperature,top_a"),
    # the text-aware stages: the drafted token changes the history they read at the second step
    "no_repeat_ngram": SamplingConfig(temperature=1.2, no_repeat_ngram_size=2),
    "dry_ban_bias_min_tokens": SamplingConfig(
        temperature=1.1,
        dry_multiplier=1.5,
        dry_base=2.0,
        dry_allowed_length=1,
        dry_sequence_breakers=("w11",),
        logit_bias={"w9": 1.5, "3": -1.0},
        ban=("w7 w5", "w4 w4"),
        min_tokens=3,
    ),
}


def tv_bound(categories: int, n: int, delta: float = 1e-6) -> float:
    """E[TV] <= 0.5 sqrt(V/n) (Cauchy-Schwarz over the per-category standard deviations), plus
    McDiarmid's deviation for a statistic that one sample moves by at most 1/n."""
    return 0.5 * math.sqrt(categories / n) + math.sqrt(math.log(1 / delta) / (2 * n))


def next_token_dists(model, prompt: list[int], history: TokenHistory, cfg: SamplingConfig):
    """Sampling distribution after the prompt, and after the prompt plus each possible token."""
    with torch.inference_mode():
        first_logits = model(torch.tensor([prompt])).logits[:, -1]
        seqs = torch.tensor([[*prompt, x] for x in range(VOCAB)])
        second_logits = model(seqs).logits[:, -1]
    rows = TokenHistory.stack([history] * VOCAB).advanced(torch.arange(VOCAB), list(range(VOCAB)))
    return sampling_probs(first_logits, history, cfg)[0], sampling_probs(second_logits, rows, cfg)


@pytest.fixture(scope="module")
def small_vocab_pair(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("vocab12")
    target = load_model(str(make_tiny_model(root / "t", vocab_size=VOCAB, seed=10, init=0.15)), "cpu", "float32")
    draft = load_model(str(make_tiny_model(root / "d", vocab_size=VOCAB, seed=11, init=0.15)), "cpu", "float32")
    return target.model, draft.model, target.tokenizer


@pytest.mark.parametrize("name", list(CONFIGS))
def test_speculative_samples_follow_the_target_distribution(small_vocab_pair, name: str) -> None:
    target, draft, tokenizer = small_vocab_pair
    cfg = CONFIGS[name]
    prompt = [0, 5, 7, 5]
    history = TokenHistory.for_config(torch.tensor([prompt]), VOCAB, cfg, tokenizer, [1])
    history = history.advanced(torch.tensor([7]), [7])
    p1, p2 = next_token_dists(target, prompt, history, cfg)
    q1, q2 = next_token_dists(draft, prompt, history, cfg)
    g = make_generator(1234)
    n = SAMPLES

    # Round 1: draft two tokens, verify both.
    d1 = draw(q1.expand(n, -1), g)
    d2 = draw(q2[d1], g)
    p = torch.stack([p1.expand(n, -1), p2[d1], p2[d1]], dim=1)  # the third row (extra token) is unused
    q = torch.stack([q1.expand(n, -1), q2[d1]], dim=1)
    accepted, after = accept_drafts(p, q, torch.stack([d1, d2], 1), g)
    first = torch.where(accepted >= 1, d1, after)
    second = torch.where(accepted == 2, d2, after)
    # Rows that rejected the first draft: the second token comes from a fresh one-token round.
    redo = accepted == 0
    x1 = first[redo]
    e1 = draw(q2[x1], g)
    a2, after2 = accept_drafts(torch.stack([p2[x1], p2[x1]], 1), q2[x1][:, None], e1[:, None], g)
    second[redo] = torch.where(a2 == 1, e1, after2)

    expected_second = (p1[:, None] * p2).sum(0)
    for samples, expected in ((first, p1), (second, expected_second)):
        observed = torch.bincount(samples, minlength=VOCAB).double()
        assert observed[expected == 0].sum() == 0  # never a token the target forbids
        tv = 0.5 * (observed / n - expected.double()).abs().sum().item()
        assert tv < tv_bound(VOCAB, n), (name, tv)
        support = expected > 0
        if support.sum() > 1:
            expected_counts = expected.double()[support] * n
            stat = chisquare(
                observed[support].numpy(),
                expected_counts.numpy() * observed[support].sum().item() / expected_counts.sum().item(),
            )
            assert stat.pvalue > 1e-4, (name, stat)

    # The acceptance rate of the first draft is sum(min(p, q)).
    rate = (accepted >= 1).double().mean().item()
    assert abs(rate - torch.minimum(p1, q1).sum().item()) < math.sqrt(math.log(2 / 1e-6) / (2 * n))


# --- the real default model ---------------------------------------------------------------------

CODE_PROMPT = """Rewrite this Python code, adding a docstring to every function.

def mean(values):
    total = 0
    for value in values:
        total += value
    return total / len(values)

def scale(values, factor):
    return [value * factor for value in values]
"""


@pytest.mark.model
def test_ngram_on_the_default_model_equals_plain_greedy(default_lm) -> None:
    cfg = SamplingConfig(temperature=0, max_tokens=80)
    ids = encode_prompt(default_lm, CODE_PROMPT)
    plain, _ = run_to_end(generate(default_lm, ids, cfg, RunStats("m", "p", None)))
    spec, summary = run_to_end(
        generate(
            default_lm,
            ids,
            cfg,
            RunStats("m", "p", None),
            drafter=NgramDrafter(default_lm.model.config.vocab_size, default_lm.device),
        )
    )
    assert [t.token_id for t in spec] == [t.token_id for t in plain]
    assert "".join(t.text for t in spec) == "".join(t.text for t in plain)
    assert summary.facts.speculation.accepted > 0


def test_speculate_command_reports_sources_and_speedup(tiny_model_dir: Path) -> None:
    import json

    from click.testing import CliRunner

    from llmsample.cli import main

    args = ["speculate", "-m", str(tiny_model_dir), "--raw", "-p", PROMPT, "--preset", "deterministic", "-n", "40",
            "--ignore-eos", "--compare", "--format", "jsonl", "--ngram-min", "1"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    summary = lines[-1]
    assert {t["source"] for t in lines[:-1]} == {"draft", "target"}
    assert summary["plain_tokens_per_s"] > 0 and summary["speedup"] > 0
    assert summary["accepted"] == sum(t["source"] == "draft" for t in lines[:-1])
    assert "accepted" in result.stderr and "plain loop" in result.stderr  # a speedup or a slowdown, in words
