"""The constraint stage: its place in the chain, the worked example of the issue (grammar first,
then truncation), a chi-squared test of the first token on a tiny model, and the compile errors."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import chisquare

from llmsample.engine.loop import generate_rows
from llmsample.engine.prompt import encode_prompt
from llmsample.errors import UserError
from llmsample.events import RunStats, TokenEvent
from llmsample.sampling import constraint as constraints
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.history import NO_HISTORY
from llmsample.sampling.pipeline import sampler_chain
from llmsample.sampling.stages import STAGES, chain_of


def test_the_constraint_comes_before_greedy_and_every_truncation_filter() -> None:
    names = [info.name for info in STAGES]
    at = names.index("constraint")
    assert at < names.index("greedy") and at < names.index("temperature")
    assert all(
        names.index(info.name) > at
        for info in STAGES
        if info.removes and info.name not in ("ban", "min_tokens", "no_repeat_ngram", "reasoning_budget", "constraint")
    )
    cfg = SamplingConfig(constraint=constraints.any_json())
    assert "constraint" in [info.name for info in chain_of(cfg)]
    assert "constraint" not in [info.name for info in chain_of(SamplingConfig())]


def test_worked_example_grammar_first_then_top_k() -> None:
    """p = [.5, .3, .15, .05], allowed {1, 3}, top-k 2: {1: .857, 3: .143}; sample-then-check
    (top-k on the raw distribution, resample under the mask when the draw is not allowed) would give
    {1: .911, 3: .089}."""
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    history = NO_HISTORY.__class__(None, None, allowed=torch.tensor([[False, True, False, True]]))
    cfg = SamplingConfig(temperature=1.0, top_k=2, constraint=constraints.any_json())
    probs = sampler_chain(p.log(), history, cfg).probs[0]
    assert probs.tolist() == pytest.approx([0, 0.3 / 0.35, 0, 0.05 / 0.35], abs=1e-6)
    sample_then_check = 0.375 + 0.625 * 0.3 / 0.35
    assert not math.isclose(float(probs[1]), sample_then_check, abs_tol=0.01)


def test_a_row_with_nothing_allowed_is_left_empty_not_renormalised() -> None:
    history = NO_HISTORY.__class__(None, None, allowed=torch.zeros(1, 4, dtype=torch.bool))
    chain = sampler_chain(torch.zeros(1, 4), history, SamplingConfig(constraint=constraints.any_json()))
    assert bool((chain.final == -math.inf).all())


def _expected_first(raw: torch.Tensor, allowed: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Renormalise over the allowed set, then top-k, then top-p: written out independently."""
    p = torch.where(allowed, raw.softmax(-1), 0.0)
    p = p / p.sum()
    order = p.argsort(descending=True, stable=True)[:top_k]
    p = p / p[order].sum()  # top-p reads the distribution top-k left
    kept, mass = [], 0.0
    for t in order.tolist():
        kept.append(t)
        mass += float(p[t])
        if mass >= top_p:
            break
    out = torch.zeros_like(p)
    out[kept] = p[kept]
    return out / out.sum()


@pytest.fixture(scope="module")
def flat_lm(tmp_path_factory: pytest.TempPathFactory):
    """Small weights: a spread-out distribution, so top-k and top-p both cut something."""
    from llmsample.models.loading import load_model
    from tests.constraints.conftest import make_byte_model

    return load_model(str(make_byte_model(tmp_path_factory.mktemp("flat"), seed=2, init=0.3)), "cpu", "float32")


def test_first_token_chi_squared_under_a_constraint_with_top_k_and_top_p(flat_lm) -> None:
    """2000 rows of one prompt draw their first token under ``--regex`` with top-k 8 and top-p 0.7:
    the counts fit the raw distribution renormalised over the allowed set, then truncated."""
    constraint = constraints.regex("[a-p]+")
    cfg = SamplingConfig(temperature=1.0, top_k=8, top_p=0.7, max_tokens=1, constraint=constraint)
    prompt = encode_prompt(flat_lm, "Say:", raw=True)
    vocab = flat_lm.model.config.vocab_size
    matcher = constraints.Matcher(
        constraint, constraints.tokenizer_table(flat_lm.tokenizer, vocab, sorted(flat_lm.eos_ids)), vocab
    )
    raw = flat_lm.model(prompt).logits[0, -1].float().detach()
    expected = _expected_first(raw, matcher.masks()[0], 8, 0.7)
    n = 2000
    stats = [RunStats("bytes", "test", i) for i in range(n)]
    counts = torch.zeros(vocab)
    for _, record in generate_rows(flat_lm, prompt, cfg, stats, list(range(n))):
        if isinstance(record, TokenEvent):
            counts[record.token_id] += 1
    support = expected > 0
    assert counts[~support].sum() == 0
    assert 3 <= int(support.sum()) < 8  # top-p cut what top-k left: a test with something to test
    assert chisquare(counts[support].numpy(), n * expected[support].numpy()).pvalue > 1e-3


def one_key(i: int) -> dict:
    return {"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]}


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: constraints.json_schema('{"type": "strang"}'), "--json-schema: Invalid type: strang"),
        (
            lambda: constraints.json_schema('{"if": {}}', strict=True),
            'Unimplemented keys: ["if"] (llguidance does not support',
        ),
        (lambda: constraints.json_schema("{nope"), "--json-schema: not valid JSON"),
        (lambda: constraints.json_schema("[1]"), "a JSON Schema is an object"),
        (lambda: constraints.regex("a("), "--regex: invalid regex: unclosed group"),
        (lambda: constraints.regex(""), "--regex: the pattern is empty"),
        (lambda: constraints.choice([]), "--choice: give one or more"),
        (
            lambda: constraints.grammar("start: foo", "--grammar g.lark"),
            '--grammar g.lark: at 1(8): unknown name: "foo"',
        ),
        (lambda: constraints.regex(r"[^\s\S]"), "--regex: matches no text at all; check the constraint"),
        (
            lambda: constraints.json_schema({"anyOf": [one_key(i) for i in range(3000)]}),
            "--json-schema: too complex for llguidance (Current row has 3000 items; max is 2000",
        ),
        (
            lambda: constraints.grammar("start: " + " | ".join(f'"t{i}"' for i in range(2001))),
            "--grammar: too complex for llguidance (Current row has 2002 items",
        ),
        (
            lambda: constraints.json_schema('{"items": ' * 3000 + "{}" + "}" * 3000),
            "--json-schema: nested too deeply for a JSON reader; flatten the schema",
        ),
    ],
)
def test_bad_constraints_are_one_line(make, fragment: str) -> None:
    with pytest.raises(UserError) as info:
        make()
    message = str(info.value)
    assert fragment in message and "\n" not in message


def test_a_choice_of_ten_thousand_texts_is_one_lexeme_the_parser_can_hold(byte_lm) -> None:
    """As alternatives of one rule, 2001 texts overflowed a row of llguidance's parser at the first token."""
    vocab = byte_lm.model.config.vocab_size
    table = constraints.tokenizer_table(byte_lm.tokenizer, vocab, sorted(byte_lm.eos_ids))
    matcher = constraints.Matcher(constraints.choice([f"t{i}" for i in range(10000)]), table, vocab)
    ids = byte_lm.tokenizer.encode("t9999", add_special_tokens=False)
    matcher.advance(ids[:2])
    assert matcher.accepts_after(ids[2:]) and matcher.accepts_after([]) and not matcher.stopped


def test_masks_after_drafts_leave_the_state_alone(byte_lm) -> None:
    vocab = byte_lm.model.config.vocab_size
    table = constraints.tokenizer_table(byte_lm.tokenizer, vocab, sorted(byte_lm.eos_ids))
    assert constraints.tokenizer_table(byte_lm.tokenizer, vocab, sorted(byte_lm.eos_ids)) is table  # built once
    matcher = constraints.Matcher(constraints.choice(["ab", "ac"]), table, vocab)
    ids = byte_lm.tokenizer.encode("ab", add_special_tokens=False)
    masks = matcher.masks(ids)
    text = [sorted(byte_lm.tokenizer.decode([t]) for t in row.nonzero().flatten().tolist()) for row in masks]
    assert text == [["a"], ["b", "c"], ["<eos>"]]
    assert matcher.masks()[0].equal(masks[0])
    assert matcher.accepts_after(ids) and not matcher.accepts_after(ids[:1])


def test_a_constraint_no_token_can_continue_is_named() -> None:
    from llmsample.engine.emitter import nothing_left

    cfg = SamplingConfig(constraint=constraints.regex("x"))
    assert nothing_left(cfg, {"constraint": 3}, 7) == (
        "no token is left at position 7: --regex allows no token here; check the constraint"
    )
    assert "--regex allows only tokens that --ban removed" in nothing_left(cfg, {"ban": 1, "constraint": 3}, 7)


def test_json_schema_names_a_file_when_one_exists(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A path that exists is a file, whatever its name starts with; else text that opens as a
    schema is the schema (a long one is no path, not an error)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "true_schema.json").write_text('{"type": "object"}', encoding="utf-8")
    read = constraints.from_flags(constraints.ConstraintFlags(json_schema="true_schema.json"))
    assert read is not None and read.origin == "--json-schema true_schema.json"
    for inline in ('{"type": "object"}', '{"description": "%s"}' % ("x" * 5000)):
        compiled = constraints.from_flags(constraints.ConstraintFlags(json_schema=inline))
        assert compiled is not None and compiled.origin == "--json-schema"
