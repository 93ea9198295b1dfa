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
from llmsample.sampling.filters import apply_penalties, keep_min_p, keep_top_k, keep_top_p
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import sampling_probs

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


NEW = SamplingConfig(
    temperature=0.9, typical_p=0.9, top_n_sigma=1.5, min_p=0.02, xtc_threshold=0.05, xtc_probability=0.5,
    dry_multiplier=3.0, dry_allowed_length=1, logit_bias={"w9": 2.0}, ban=("w12",), min_tokens=2,
)  # fmt: skip


def test_the_new_stages_by_hand(tiny_lm) -> None:
    from llmsample.sampling.filters import keep_top_n_sigma, keep_typical_p, keep_xtc, xtc_mixture
    from llmsample.sampling.text_stages import apply_dry, apply_logit_bias, mask_banned, mask_early_end

    ids = encode_prompt(tiny_lm, "w3 w9 w12 w9 w3 w9", raw=True)
    report = explain_next(tiny_lm, ids, NEW, top_n=12)
    with torch.inference_mode():
        raw = tiny_lm.model(ids).logits[:, -1].float()
    history = TokenHistory.for_config(ids, raw.shape[-1], NEW, tiny_lm.tokenizer, tiny_lm.eos_ids)
    by_hand = {"raw": raw, "logit_bias": apply_logit_bias(raw, history, NEW)}
    by_hand["ban"] = mask_banned(by_hand["logit_bias"], history, NEW)
    by_hand["min_tokens"] = mask_early_end(by_hand["ban"], history, NEW)
    by_hand["penalties"] = by_hand["min_tokens"]
    by_hand["dry"] = apply_dry(by_hand["penalties"], history, NEW)
    by_hand["temperature"] = by_hand["dry"] / NEW.temperature
    by_hand["top_n_sigma"] = keep_top_n_sigma(by_hand["temperature"], NEW.top_n_sigma)
    by_hand["top_k"] = by_hand["top_p"] = by_hand["top_n_sigma"]
    by_hand["typical_p"] = keep_typical_p(by_hand["top_p"], NEW.typical_p)
    by_hand["min_p"] = keep_min_p(by_hand["typical_p"], NEW.min_p)
    by_hand["xtc"] = keep_xtc(by_hand["min_p"], NEW.xtc_threshold)
    assert report.stages == list(by_hand)
    sampled = xtc_mixture(by_hand["min_p"], by_hand["xtc"], NEW.xtc_probability)
    for candidate in report.candidates:
        for name, logits in by_hand.items():
            expected = (sampled if name == "xtc" else logits.softmax(-1))[0, candidate.token_id].item()
            assert candidate.probs[name] == pytest.approx(expected, abs=1e-6)
        first_removed = next((n for n, t in by_hand.items() if not torch.isfinite(t[0, candidate.token_id])), None)
        assert candidate.removed_by == first_removed
    for name, logits in by_hand.items():
        assert report.kept[name] == int(torch.isfinite(logits).sum()), name
    assert report.kept["ban"] < report.kept["logit_bias"] and report.kept["min_tokens"] < report.kept["ban"]
    assert by_hand["dry"][0, 3] < by_hand["penalties"][0, 3]  # w3 followed "w9" before: DRY


def test_continuation_under_xtc_stays_possible(tiny_lm) -> None:
    ids = encode_prompt(tiny_lm, "w3 w9 w12", raw=True)
    cfg = SamplingConfig(xtc_threshold=0.01, xtc_probability=0.5, ban=("w20",))
    scored = score_continuation(tiny_lm, ids, [9, 14, 20], cfg)
    assert all(s.allowed == (s.prob > 0) for s in scored)
    assert not scored[2].allowed and scored[2].removed_by == "ban"
    assert all(s.removed_by is None for s in scored if s.allowed)
