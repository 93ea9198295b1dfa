"""``explain``: stage numbers equal the pipeline functions applied by hand; continuation
scores equal a full forward pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from llmsample.analysis.explain import explain_next, score_continuation
from llmsample.cli import main
from llmsample.engine.prompt import encode_prompt
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import (
    apply_penalties,
    keep_min_p,
    keep_top_k,
    keep_top_p,
    sampling_probs,
)

CFG = SamplingConfig(temperature=0.7, top_k=12, top_p=0.8, min_p=0.1, repetition_penalty=1.3)


def test_chain_matches_the_pipeline_by_hand(tiny_lm) -> None:
    ids = encode_prompt(tiny_lm, "w3 w9 w12 w9", raw=True)
    report = explain_next(tiny_lm, ids, CFG, top_n=8)
    with torch.inference_mode():
        raw = tiny_lm.model(ids).logits[:, -1].float()
    penalised = apply_penalties(raw, TokenHistory.start(ids, raw.shape[-1]), CFG)
    tempered = penalised / CFG.temperature
    after_k = keep_top_k(tempered, CFG.top_k)
    after_p = keep_top_p(after_k, CFG.top_p)
    after_m = keep_min_p(after_p, CFG.min_p)
    by_hand = {
        "raw": raw,
        "penalties": penalised,
        "temperature": tempered,
        "top_k": after_k,
        "top_p": after_p,
        "min_p": after_m,
    }
    assert report.stages == list(by_hand)
    for candidate in report.candidates:
        for name, logits in by_hand.items():
            expected = logits.softmax(-1)[0, candidate.token_id].item()
            assert candidate.probs[name] == pytest.approx(expected, abs=1e-6)
        first_removed = next((n for n, t in by_hand.items() if not torch.isfinite(t[0, candidate.token_id])), None)
        assert candidate.removed_by == first_removed
    assert report.kept["min_p"] == int(torch.isfinite(after_m).sum())
    assert any(c.removed_by for c in report.candidates)


def test_continuation_matches_a_full_forward_pass(tiny_lm) -> None:
    ids = encode_prompt(tiny_lm, "w3 w9 w12", raw=True)
    continuation = [9, 14, 9, 20]
    scored = score_continuation(tiny_lm, ids, continuation, CFG)
    full = torch.cat([ids, torch.tensor([continuation])], dim=1)
    with torch.inference_mode():
        logits = tiny_lm.model(full).logits[0].float()
    history = TokenHistory.start(ids, logits.shape[-1])
    for i, token in enumerate(continuation):
        row = logits[ids.shape[1] - 1 + i][None]
        assert scored[i].model_prob == pytest.approx(row.softmax(-1)[0, token].item(), abs=1e-5)
        assert scored[i].prob == pytest.approx(sampling_probs(row, history, CFG)[0, token].item(), abs=1e-5)
        assert scored[i].allowed == (scored[i].prob > 0)
        history = history.advanced(torch.tensor([token]))


def test_explain_cli_fits_80_columns_and_jsonl(tiny_model_dir: Path) -> None:
    runner = CliRunner()
    base = ["explain", "-m", str(tiny_model_dir), "--raw", "-p", "w3 w4", "--preset", "creative", "-q"]
    text = runner.invoke(main, base, env={"COLUMNS": "80"})
    assert text.exit_code == 0, text.output
    assert max(len(line) for line in text.stdout.splitlines()) <= 80
    assert "entropy" in text.stdout
    jsonl = runner.invoke(main, [*base, "--format", "jsonl"])
    report = json.loads(jsonl.stdout)
    assert report["type"] == "chain" and report["stages"][0] == "raw"
    scored = runner.invoke(main, [*base, "--continuation", "w5 w6", "--format", "jsonl"])
    lines = [json.loads(line) for line in scored.stdout.splitlines()]
    assert [line["token_id"] for line in lines] == [5, 6]
