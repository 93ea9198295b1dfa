"""The carried stages in the loop: a row with mirostat or adaptive-p decodes in a batch as it does
alone (its state its own), and speculation keeps the tokens it verifies distributed as the
plain chain's, each drawn with the state after those before it (χ² against the exact joint, with
both drafters; seeded, so CI does not depend on luck); the lab's stateless
stages too, with prompt lookup's drafts (a draft model's are in test_speculative.py)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from scipy.stats import chisquare

from llmsample.engine.continuous_batch import BatchItem, RowFailed, decode_batch
from llmsample.engine.loop import generate, run_to_end
from llmsample.engine.speculative import ModelDrafter, NgramDrafter
from llmsample.events import RunStats, Summary, TokenEvent
from llmsample.models.loading import load_model
from llmsample.sampling.config import SamplingConfig
from tests.conftest import make_tiny_model
from tests.engine.test_decode import PROMPTS, alone, drafter_for, expected_joint, later_pairs

CARRIED = [  # each twice or more in a run of ten rows, with its own seed: rows that share a chain call
    dict(temperature=0.9, mirostat=2, mirostat_tau=2.0, mirostat_eta=0.5),
    dict(temperature=1.1, mirostat=1, mirostat_tau=2.5, mirostat_eta=0.4, presence_penalty=0.5),
    dict(temperature=0.8, adaptive_target=0.3, adaptive_decay=0.5, min_p=0.02),
    dict(temperature=1.0, adaptive_target=0.1, adaptive_decay=0.0, no_repeat_ngram_size=3),
]


def carried_items(lm, make_drafter, k: int | None) -> list[BatchItem]:
    out = []
    for i in range(10):
        cfg = SamplingConfig(**CARRIED[i % len(CARRIED)], seed=100 + i, max_tokens=5 + i)
        ids = lm.tokenizer(PROMPTS[i % len(PROMPTS)], add_special_tokens=False).input_ids
        out.append(BatchItem(i, ids, cfg, RunStats("tiny", "test", cfg.seed), make_drafter, k))
    return out


@pytest.mark.parametrize(
    ("kind", "k", "batch_size"),
    [("plain", None, 3), ("plain", None, 10), ("ngram", None, 3), ("ngram", None, 10), ("model", 3, 10)],
)
def test_rows_with_carried_stages_decode_in_a_batch_as_they_do_alone(
    tiny_lm, draft_lm, batch_size: int, kind: str, k: int | None
) -> None:
    make = None if kind == "plain" else drafter_for(kind, tiny_lm, draft_lm)
    requests = carried_items(tiny_lm, make, k)
    events: dict[int, list[TokenEvent]] = {item.key: [] for item in requests}
    for key, record in decode_batch(tiny_lm, requests, batch_size, ignore_eos=True):
        assert not isinstance(record, RowFailed), record.message
        if isinstance(record, TokenEvent):
            events[key].append(record)
    for item in requests:
        if make is None:
            stats = RunStats("tiny", "test", item.cfg.seed)
            tokens, _ = run_to_end(generate(tiny_lm, torch.tensor([item.prompt_ids]), item.cfg, stats, ignore_eos=True))
        else:
            tokens, _ = alone(tiny_lm, item)
        assert [e.token_id for e in events[item.key]] == [e.token_id for e in tokens], (kind, item.key)
        for mine, theirs in zip(events[item.key], tokens, strict=True):
            assert mine.removed == theirs.removed
            assert mine.prob == pytest.approx(theirs.prob, rel=1e-4, abs=1e-6)


@pytest.fixture(scope="module")
def draft_lm(tmp_path_factory: pytest.TempPathFactory):
    return load_model(str(make_tiny_model(tmp_path_factory.mktemp("draft"), seed=1)), "cpu", "float32")


# --- the distribution under speculation ---------------------------------------------------------

VOCAB = 12
SAMPLES = 400
PROMPT = [4, 9, 3, 2, 11, 2]  # a first token of 4 (likely) has prompt lookup draft 9, often kept
SETTINGS = {  # each sharp enough that the state after the first token moves the second's distribution
    "mirostat-v1": SamplingConfig(temperature=0.6, mirostat=1, mirostat_tau=1.5, mirostat_eta=1.0, max_tokens=3),
    "mirostat-v2": SamplingConfig(temperature=0.6, mirostat=2, mirostat_tau=1.5, mirostat_eta=1.0, max_tokens=3),
    "adaptive-p": SamplingConfig(temperature=0.4, adaptive_target=0.4, adaptive_decay=0.0, max_tokens=3),
}
LAB = {  # the lab's stateless stages, which tests/engine/test_speculative.py checks with a draft model
    "dynatemp-smoothing": SamplingConfig(temperature=1.0, dynatemp_range=0.6, dynatemp_exponent=1.5,
                                         smoothing_factor=0.3, max_tokens=3),
    "epsilon-eta-top-a": SamplingConfig(temperature=1.3, epsilon_cutoff=0.02, eta_cutoff=0.01, top_a=0.1, max_tokens=3),
    "top-h": SamplingConfig(temperature=1.5, top_h=0.8, max_tokens=3),
    "p-less": SamplingConfig(temperature=1.5, p_less=True, max_tokens=3),
    "no-repeat-ngram": SamplingConfig(temperature=1.2, no_repeat_ngram_size=2, max_tokens=3),  # bans the draft 11
    "samplers-order": SamplingConfig(temperature=1.8, top_k=8, min_p=0.2, top_a=0.1,
                                     samplers="min_p,top_k,temperature,top_a", max_tokens=3),
}  # fmt: skip
SETTINGS.update(LAB)


@pytest.fixture(scope="module")
def vocab12(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("vocab12-carried")
    target = load_model(str(make_tiny_model(root / "t", vocab_size=VOCAB, seed=10, init=0.15)), "cpu", "float32")
    draft = load_model(str(make_tiny_model(root / "d", vocab_size=VOCAB, seed=11, init=0.15)), "cpu", "float32")
    return target, draft


def sampled_triples(target, draft, kind: str, names: list[str]) -> dict[str, torch.Tensor]:
    """Counts of the three tokens that speculative rows of each setting emit ``[VOCAB ** 3]``: the
    first drawn from the prefill's logits, the others through verification."""

    def drafter():
        if kind == "ngram":
            return NgramDrafter(VOCAB, target.sample_device, 1, 3)
        return ModelDrafter(draft, VOCAB, target.sample_device)

    requests = [
        BatchItem((names[i % len(names)], i), PROMPT, dataclasses.replace(SETTINGS[names[i % len(names)]], seed=500 + i),
                  RunStats("t", "t", None), drafter, 2)
        for i in range(len(names) * SAMPLES)
    ]  # fmt: skip
    counts = {name: torch.zeros(VOCAB**3, dtype=torch.float64) for name in names}
    tokens: dict[tuple[str, int], list[int]] = {}
    for key, record in decode_batch(target, requests, 64, ignore_eos=True):
        assert not isinstance(record, RowFailed)
        if isinstance(record, TokenEvent):
            tokens.setdefault(key, []).append(record.token_id)
        elif isinstance(record, Summary):
            x1, x2, x3 = tokens.pop(key)
            counts[key[0]][(x1 * VOCAB + x2) * VOCAB + x3] += 1
    return counts


@pytest.mark.parametrize(
    ("kind", "names"),
    [("ngram", ["mirostat-v1", "mirostat-v2", "adaptive-p"]), ("model", ["mirostat-v1", "mirostat-v2", "adaptive-p"]),
     ("ngram", list(LAB))],
    ids=["ngram", "model", "ngram-lab"],
)  # fmt: skip
def test_speculation_with_carried_stages_samples_the_plain_joint(vocab12, kind: str, names: list[str]) -> None:
    """The second and third tokens (verified) against the plain chain's; the model drafter (a
    draft cache per row: ~70 ms a row here) runs the three carried ones. That each position sees
    the state after the drafts before it is checked exactly in tests/sampling/test_carried.py."""
    target, draft = vocab12
    failures = []
    for name, observed in sampled_triples(target, draft, kind, names).items():
        expected = later_pairs(expected_joint(target, PROMPT, SETTINGS[name]))
        observed, n = later_pairs(observed), SAMPLES
        assert observed.sum() == n
        assert observed[expected == 0].sum() == 0  # never a pair the target's truncation forbids
        # χ² over the cells expected at least 5 times, the rest pooled into one.
        big = expected * n >= 5
        obs = torch.cat([observed[big], observed[~big].sum().view(1)])
        exp = torch.cat([expected[big], expected[~big].sum().view(1)]) * n
        keep = exp > 0
        stat = chisquare(obs[keep].numpy(), exp[keep].numpy() * obs[keep].sum().item() / exp[keep].sum().item())
        tv = 0.5 * (observed / n - expected).abs().sum().item()
        bound = 0.5 * math.sqrt(int((expected > 0).sum()) / n) + math.sqrt(math.log(1e6) / (2 * n))
        if stat.pvalue <= 1e-4 or tv >= bound:
            failures.append((name, stat.pvalue, tv, bound))

    assert not failures, (kind, failures)
