"""Constrained speculation and constrained batch rows decode what the constrained plain run does:
greedy float32 token for token (n-gram and model drafts; rows with different constraints joining
and leaving a batch), and sampled speculation draws the same distribution over outputs."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest
import torch
from scipy.stats import chi2_contingency

from llmsample.engine.continuous_batch import BatchItem, RowFailed, decode_batch
from llmsample.engine.loop import generate, generate_rows, run_to_end
from llmsample.engine.prompt import encode_prompt
from llmsample.engine.speculative import ModelDrafter, NgramDrafter
from llmsample.events import RunStats, Summary
from llmsample.models.loading import load_model
from llmsample.sampling import constraint as constraints
from llmsample.sampling.config import SamplingConfig
from tests.constraints.conftest import make_byte_model
from tests.constraints.test_outputs import SCHEMAS

PROMPT = 'Copy: {"person": {"name": "ab", "age": 3}, "active": true} and {"person": {"name": "'


@pytest.fixture(scope="module")
def draft_lm(tmp_path_factory: pytest.TempPathFactory):
    return load_model(str(make_byte_model(tmp_path_factory.mktemp("draft"), seed=1)), "cpu", "float32")


def _drafter(kind: str, lm, draft_lm):
    vocab = lm.model.config.vocab_size
    return (
        NgramDrafter(vocab, lm.sample_device, 1, 4)
        if kind == "ngram"
        else ModelDrafter(draft_lm, vocab, lm.sample_device)
    )


@pytest.mark.parametrize("kind", ["ngram", "model"])
def test_greedy_constrained_speculation_equals_the_plain_run(byte_lm, draft_lm, kind: str) -> None:
    cfg = SamplingConfig(temperature=0.0, max_tokens=60, constraint=constraints.json_schema(SCHEMAS["nested"]))
    prompt = encode_prompt(byte_lm, PROMPT, raw=True)
    plain, plain_summary = run_to_end(generate(byte_lm, prompt, cfg, RunStats("b", "t", 0)))
    stats = RunStats("b", "t", 0)
    tokens, summary = run_to_end(
        generate(byte_lm, prompt, cfg, stats, drafter=_drafter(kind, byte_lm, draft_lm), draft_tokens=4)
    )
    assert [e.token_id for e in tokens] == [e.token_id for e in plain]
    assert summary.text == plain_summary.text and summary.facts.constraint == plain_summary.facts.constraint
    assert summary.facts.speculation is not None and summary.facts.speculation.accepted > 0  # drafts were used


CHOICES = ["ab", "abc", "ac", "b", "bca", "bcb"]


@pytest.fixture(scope="module")
def spread_models(tmp_path_factory: pytest.TempPathFactory):
    """Target and draft with spread-out, different distributions: drafts are often rejected."""
    target = make_byte_model(tmp_path_factory.mktemp("target"), seed=2, init=0.3)
    draft = make_byte_model(tmp_path_factory.mktemp("draft2"), seed=3, init=0.3)
    return load_model(str(target), "cpu", "float32"), load_model(str(draft), "cpu", "float32")


def test_sampled_constrained_speculation_draws_the_plain_distribution(spread_models) -> None:
    """200 seeds each way over six choices sharing prefixes: a chi-squared test of homogeneity."""
    lm, draft = spread_models
    n = 200
    cfg = SamplingConfig(temperature=1.0, max_tokens=8, constraint=constraints.choice(CHOICES))
    prompt = encode_prompt(lm, "Pick:", raw=True)
    stats = [RunStats("b", "t", s) for s in range(n)]
    plain = Counter(r.text for _, r in generate_rows(lm, prompt, cfg, stats, list(range(n))) if isinstance(r, Summary))
    vocab = lm.model.config.vocab_size
    items = [
        BatchItem(s, prompt[0].tolist(), dataclasses.replace(cfg, seed=10_000 + s), RunStats("b", "t", s),
                  lambda: ModelDrafter(draft, vocab, lm.sample_device), 3)
        for s in range(n)
    ]  # fmt: skip
    speculative: Counter[str] = Counter()
    for _, record in decode_batch(lm, items, 64):
        assert not isinstance(record, RowFailed), record.message
        if isinstance(record, Summary):
            speculative[record.text] += 1
            assert record.facts.speculation is not None
    assert set(plain) | set(speculative) <= set(CHOICES)
    table = [
        [plain[c] for c in CHOICES if plain[c] + speculative[c]],
        [speculative[c] for c in CHOICES if plain[c] + speculative[c]],
    ]
    assert len(table[0]) >= 3
    assert chi2_contingency(table).pvalue > 1e-3


def test_batch_rows_with_different_constraints_decode_as_alone(byte_lm, draft_lm) -> None:
    """Five requests, each its own constraint (one none), through a batch of two: rows join and
    leave, and each gets the tokens it gets alone; a drafting row too."""
    kinds = [
        constraints.json_schema(SCHEMAS["ref"]),
        constraints.regex(r"[a-c]{2,6}"),
        None,
        constraints.choice(["yes", "no", "never"]),
        constraints.json_schema(json.dumps(SCHEMAS["enum_and_pattern"])),
    ]
    prompt = encode_prompt(byte_lm, PROMPT, raw=True)[0].tolist()
    items = []
    for i, constraint in enumerate(kinds):
        cfg = SamplingConfig(temperature=0.0, max_tokens=20 + 7 * i, constraint=constraint)
        drafter = (
            (lambda: NgramDrafter(byte_lm.model.config.vocab_size, byte_lm.sample_device, 1, 4)) if i == 4 else None
        )
        items.append(BatchItem(i, prompt[: 30 + 5 * i], cfg, RunStats("b", "t", 0), drafter, 3 if drafter else None))
    texts = {}
    for key, record in decode_batch(byte_lm, items, 2):
        assert not isinstance(record, RowFailed), record.message
        if isinstance(record, Summary):
            texts[key] = record.text
    for item in items:
        alone = run_to_end(generate(byte_lm, torch.tensor([item.prompt_ids]), item.cfg, RunStats("b", "t", 0)))[1]
        assert texts[item.key] == alone.text, item.key
