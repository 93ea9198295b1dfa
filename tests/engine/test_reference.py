"""--reference's figures: KL(P_ref ‖ P_model) over raw distributions, same top, P_ref(token)."""

from __future__ import annotations

import math

import pytest
import torch

from llmsample.engine.reference import ReferenceTotals, reference_figures
from llmsample.events import ReferenceFigures, ReferenceSummary, RunFacts, Summary
from llmsample.render.stream import summary_lines


def test_kl_matches_its_definition() -> None:
    gen = torch.Generator().manual_seed(0)
    model, reference = torch.randn(3, 50, generator=gen), torch.randn(3, 50, generator=gen)
    tokens = torch.tensor([4, 9, 49])
    figures = reference_figures(model, reference, tokens)
    for row, fig in enumerate(figures):
        p, q = reference[row].double().softmax(-1), model[row].double().softmax(-1)
        expected = float((p * (p.log() - q.log())).sum())
        assert fig.kl == pytest.approx(expected, rel=1e-4)
        assert fig.same_top == (int(p.argmax()) == int(q.argmax()))
        assert fig.prob == pytest.approx(float(p[tokens[row]]), rel=1e-5)


def test_kl_is_zero_for_the_same_logits_and_finite_where_the_reference_rules_tokens_out() -> None:
    logits = torch.tensor([[2.0, 1.0, -1.0, 0.5]])
    (same,) = reference_figures(logits, logits.clone(), torch.tensor([0]))
    assert same == ReferenceFigures(kl=0.0, same_top=True, prob=pytest.approx(float(logits.softmax(-1)[0, 0])))
    reference = torch.tensor([[2.0, -math.inf, -1.0, 0.5]])  # 0 log 0 = 0
    (fig,) = reference_figures(logits, reference, torch.tensor([1]))
    assert math.isfinite(fig.kl) and fig.kl > 0 and fig.prob == 0.0


def test_totals_and_the_summary_line() -> None:
    totals = ReferenceTotals("float32")
    for fig in (ReferenceFigures(0.02, True, 0.5), ReferenceFigures(0.04, False, 0.2)):
        totals.add(fig)
    data = totals.summary()
    assert data == ReferenceSummary("float32", 2, pytest.approx(0.03), 0.04, 0.5)
    summary = Summary("x", 2, 3, "length", 0.1, 10.0, "m", "p", 1, 0.3, facts=RunFacts(reference=data))
    assert "vs float32: mean KL 0.0300 nats, same top 50.0%" in summary_lines(summary, None)
