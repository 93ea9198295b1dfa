"""``compare-models`` math: KL(A‖B), top-token agreement and Σ min(p_A, p_B) over ``[positions,
vocab]`` logits, checked against hand-computed values, scipy and a property test; then the
teacher-forced scoring of two tiny models against a plain forward pass."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import entropy

from llmsample.analysis import drift
from llmsample.analysis.drift import divergence, model_drift, teacher_forced_logits
from llmsample.analysis.drift_records import DriftToken, TopToken, summarize
from llmsample.engine.prompt import encode_prompt
from llmsample.errors import UserError
from llmsample.models.loading import load_model
from tests.conftest import make_tiny_model


def logits_of(*rows: list[float]) -> torch.Tensor:
    """Logits whose softmax is exactly the given distributions (ln p)."""
    return torch.tensor(rows, dtype=torch.float64).log()


def test_kl_and_acceptance_of_known_distributions() -> None:
    a = logits_of([0.5, 0.5], [0.2, 0.8])
    b = logits_of([0.9, 0.1], [0.2, 0.8])
    found = divergence(a, b, torch.tensor([1, 0]))
    # 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.1)
    assert found.kl[0].item() == pytest.approx(0.5 * math.log(5 / 9) + 0.5 * math.log(5), abs=1e-12)
    assert found.kl[0].item() == pytest.approx(0.5108256237659907, abs=1e-12)
    assert found.kl[1].item() == 0.0
    assert found.acceptance.tolist() == pytest.approx([0.6, 1.0], abs=1e-12)  # min(.5,.9) + min(.5,.1)
    assert found.top_a.tolist() == [0, 1]  # a tie goes to the first index
    assert found.top_b.tolist() == [0, 1]
    assert found.prob_a is not None and found.prob_b is not None
    assert found.prob_a.tolist() == pytest.approx([0.5, 0.2])
    assert found.prob_b.tolist() == pytest.approx([0.1, 0.2])


def test_kl_is_not_symmetric_and_tops_can_differ() -> None:
    a = logits_of([0.2, 0.3, 0.5])
    b = logits_of([0.5, 0.3, 0.2])
    found = divergence(a, b)
    # 0.2 ln 0.4 + 0.3 ln 1 + 0.5 ln 2.5 = 0.3 ln 2.5
    assert found.kl.item() == pytest.approx(0.3 * math.log(2.5), abs=1e-12)
    assert found.acceptance.item() == pytest.approx(0.7, abs=1e-12)
    assert (found.top_a.item(), found.top_b.item()) == (2, 0)
    assert found.top_prob_a.item() == pytest.approx(0.5) and found.top_prob_b.item() == pytest.approx(0.5)
    uneven = divergence(logits_of([0.1, 0.9]), logits_of([0.5, 0.5]))
    reverse = divergence(logits_of([0.5, 0.5]), logits_of([0.1, 0.9]))
    assert uneven.kl.item() == pytest.approx(0.1 * math.log(0.2) + 0.9 * math.log(1.8), abs=1e-12)
    assert uneven.kl.item() != pytest.approx(reverse.kl.item())
    assert uneven.acceptance.item() == pytest.approx(reverse.acceptance.item())  # Σ min is symmetric


def test_identical_logits_give_zero_kl_full_agreement_and_acceptance_one() -> None:
    logits = torch.randn(200, 1000, generator=torch.Generator().manual_seed(0)) * 4  # > one chunk of rows
    found = divergence(logits, logits.clone(), torch.arange(200))
    assert found.kl.tolist() == [0.0] * 200
    assert torch.equal(found.top_a, found.top_b)
    assert found.acceptance.tolist() == pytest.approx([1.0] * 200, abs=1e-12)
    assert torch.equal(found.prob_a, found.prob_b)


def test_padded_vocabularies_compare_on_the_shared_ids() -> None:
    a = torch.tensor([[1.0, 2.0, 0.5]])
    padded = torch.cat([a, torch.tensor([[3.0, 3.0]])], dim=-1)  # two padding rows in B's embedding
    found = divergence(a, padded, torch.tensor([2]))
    assert found.vocab == 3
    assert found.kl.item() == 0.0 and found.acceptance.item() == pytest.approx(1.0)
    assert found.prob_b.item() == pytest.approx(a.softmax(-1)[0, 2].item())
    # the other way round, and a token only the larger model has: probability 0 on the shared vocabulary
    back = divergence(padded, a, torch.tensor([4]))
    assert back.vocab == 3 and back.prob_a.item() == 0.0 and back.prob_b.item() == 0.0


def test_impossible_tokens() -> None:
    inf = -math.inf
    # A rules a token out: it adds nothing to KL(A‖B) (0 ln 0 = 0), not NaN
    assert divergence(torch.tensor([[0.0, inf]]), torch.tensor([[0.0, 0.0]])).kl.item() == pytest.approx(math.log(2))
    # B rules out a token A can pick: KL(A‖B) is infinite
    assert divergence(torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, inf]])).kl.item() == math.inf


def test_rows_are_independent_of_chunking(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(9, 50, generator=gen), torch.randn(9, 50, generator=gen)
    whole = divergence(a, b, torch.arange(9))
    monkeypatch.setattr(drift, "CHUNK_ROWS", 2)
    chunked = divergence(a, b, torch.arange(9))
    for field in ("kl", "acceptance", "top_a", "top_b", "prob_a", "prob_b"):
        assert torch.equal(getattr(whole, field), getattr(chunked, field))


def test_matches_scipy_on_float32_logits() -> None:
    gen = torch.Generator().manual_seed(2)
    a, b = torch.randn(5, 300, generator=gen) * 3, torch.randn(5, 300, generator=gen) * 3
    found = divergence(a, b)
    for row in range(5):
        p, q = a[row].double().softmax(-1).numpy(), b[row].double().softmax(-1).numpy()
        assert found.kl[row].item() == pytest.approx(entropy(p, q), rel=1e-9)


def test_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="positions"):
        divergence(torch.zeros(2, 4), torch.zeros(3, 4))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_properties(data: st.DataObject) -> None:
    width = data.draw(st.integers(2, 40))
    positions = data.draw(st.integers(1, 4))
    row = st.lists(st.floats(-30, 30, allow_nan=False, width=32), min_size=width, max_size=width)
    a = torch.tensor(data.draw(st.lists(row, min_size=positions, max_size=positions)))
    b = torch.tensor(data.draw(st.lists(row, min_size=positions, max_size=positions)))
    found = divergence(a, b)
    p, q = a.double().softmax(-1), b.double().softmax(-1)
    total_variation = 0.5 * (p - q).abs().sum(-1)
    assert (found.kl >= 0).all()
    assert ((found.acceptance >= 0) & (found.acceptance <= 1)).all()
    assert torch.allclose(found.acceptance, 1 - total_variation, atol=1e-9)
    # Pinsker: TV ≤ sqrt(KL / 2), so KL is not just clamped to anything non-negative
    assert (total_variation <= torch.sqrt(found.kl / 2) + 1e-9).all()
    # The top of each distribution (logits a hair apart can round to the same probability).
    assert torch.equal(found.top_a, p.argmax(-1)) and torch.equal(found.top_b, q.argmax(-1))
    same = divergence(a, a)
    assert (same.kl == 0).all() and torch.allclose(same.acceptance, torch.ones(positions, dtype=torch.float64))


def record(index: int, kl: float, same_top: bool = True) -> DriftToken:
    top = TopToken(3, "w3", 0.5)
    return DriftToken(index, 3, f" w{index}", 0.5, 0.4, kl, same_top, top, top)


def test_summarize() -> None:
    tokens = [record(0, 0.1), record(1, 2.0, False), record(2, 0.0), record(3, 2.0), record(4, 0.5), record(5, 0.3)]
    summary = summarize(
        tokens, [0.9, 0.2, 1.0, 0.3, 0.6, 0.7], model_a="A", model_b="B", source="given", prompt_tokens=3, vocab=32
    )
    assert summary.mean_kl == pytest.approx(4.9 / 6) and summary.max_kl == 2.0
    assert summary.same_top_rate == pytest.approx(5 / 6)
    assert summary.expected_acceptance == pytest.approx(3.7 / 6)
    assert [d.index for d in summary.most_divergent] == [1, 3, 4, 5, 0]  # ties by position
    data = summary.to_dict()
    assert data["type"] == "summary" and data["kl_unit"] == "nats" and data["most_divergent"][0]["text"] == " w1"
    with pytest.raises(ValueError):
        summarize([], [], model_a="A", model_b="B", source="given", prompt_tokens=1, vocab=1)


@pytest.fixture(scope="module")
def other_lm(tmp_path_factory: pytest.TempPathFactory):
    return load_model(str(make_tiny_model(tmp_path_factory.mktemp("other"), seed=1)), "cpu", "float32")


def test_teacher_forcing_equals_a_plain_forward_pass(tiny_lm, other_lm) -> None:
    ids = encode_prompt(tiny_lm, "w3 w9 w12", raw=True)
    continuation = [9, 14, 9, 20, 1]
    tokens, summary = model_drift(tiny_lm, other_lm, ids, continuation, source="given")
    full = torch.cat([ids, torch.tensor([continuation])], dim=1)
    with torch.inference_mode():
        rows_a = tiny_lm.model(full).logits[0, ids.shape[1] - 1 : -1].double()
        rows_b = other_lm.model(full).logits[0, ids.shape[1] - 1 : -1].double()
    assert torch.allclose(teacher_forced_logits(tiny_lm, ids, continuation).double(), rows_a, atol=1e-5)
    for i, token in enumerate(tokens):
        p, q = rows_a[i].softmax(-1), rows_b[i].softmax(-1)
        assert token.token_id == continuation[i] and token.index == i
        assert token.prob_a == pytest.approx(p[continuation[i]].item(), abs=1e-5)
        assert token.prob_b == pytest.approx(q[continuation[i]].item(), abs=1e-5)
        assert token.kl == pytest.approx((p * (p.log() - q.log())).sum().item(), abs=1e-5)
        assert token.same_top == (p.argmax() == q.argmax())
        assert token.top_a.token_id == p.argmax().item() and token.top_b.token_id == q.argmax().item()
    assert "".join(t.text for t in tokens) == " w9 w14 w9 w20 <eos>"
    assert summary.tokens == 5 and summary.prompt_tokens == ids.shape[1] and summary.vocab == 32
    assert summary.mean_kl > 0 and summary.source == "given"


def test_a_model_against_itself(tiny_lm) -> None:
    ids = encode_prompt(tiny_lm, "w3 w4", raw=True)
    tokens, summary = model_drift(tiny_lm, tiny_lm, ids, [5, 6, 7, 8], source="given")
    assert [t.kl for t in tokens] == [0.0] * 4 and all(t.same_top for t in tokens)
    assert all(t.prob_a == t.prob_b for t in tokens)
    assert summary.mean_kl == 0.0 and summary.same_top_rate == 1.0
    assert summary.expected_acceptance == pytest.approx(1.0, abs=1e-12)


def save_padded(source: Path, target: Path, rows: int = 48) -> Path:
    """``source`` with its embeddings padded to ``rows`` (same tokenizer). The padding rows of the
    LM head copy real tokens' rows (and a little noise: no ties, which go to the lower id), so the
    padded model samples a padding id now and then, the same ids on every run (seeded)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(source)
    size = model.config.vocab_size
    torch.manual_seed(0)
    model.resize_token_embeddings(rows, mean_resizing=False)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head[size:] = head[3 : 3 + rows - size] + 0.01 * torch.randn(rows - size, head.shape[1])
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    return target


def test_an_embedding_padded_to_another_size(tiny_model_dir: Path, tiny_lm, tmp_path: Path) -> None:
    padded = load_model(str(save_padded(tiny_model_dir, tmp_path)), "cpu", "float32")
    assert padded.model.config.vocab_size == 48
    ids = encode_prompt(tiny_lm, "w3 w4", raw=True)
    tokens, summary = model_drift(tiny_lm, padded, ids, [5, 6, 7], source="given")
    assert summary.vocab == 32
    # the real rows are unchanged: on the shared vocabulary the two models agree
    assert max(t.kl for t in tokens) < 1e-9 and summary.same_top_rate == 1.0


def test_a_token_the_smaller_vocabulary_lacks_ends_the_scoring(tiny_model_dir: Path, tiny_lm, tmp_path: Path) -> None:
    """A (48 ids) wrote id 40, which B (32 ids) cannot be fed: that position is still scored (it
    conditions on the tokens before it), the rest is counted as unscored, either way round."""
    padded = load_model(str(save_padded(tiny_model_dir, tmp_path)), "cpu", "float32")
    ids = encode_prompt(tiny_lm, "w3 w4", raw=True)
    for lm_a, lm_b in ((padded, tiny_lm), (tiny_lm, padded)):
        tokens, summary = model_drift(lm_a, lm_b, ids, [5, 6, 40, 7, 8], source="given")
        assert [t.token_id for t in tokens] == [5, 6, 40] and summary.tokens == 3
        assert summary.extra["unscored_tokens"] == 2 and summary.to_dict()["unscored_tokens"] == 2
        assert tokens[2].prob_b == 0.0 and tokens[2].kl >= 0
    # the padding id last: every position is scored (the last token is never fed)
    tokens, summary = model_drift(padded, tiny_lm, ids, [5, 6, 40], source="given")
    assert summary.tokens == 3 and "unscored_tokens" not in summary.extra
    with pytest.raises(UserError, match="the prompt holds token id 40"):
        model_drift(padded, tiny_lm, torch.tensor([[3, 40, 4]]), [5, 6], source="given")
