"""Continuous batching: every request gets exactly the tokens and records it gets alone, whatever
the batch size, the prompt lengths, the settings of its neighbours, or when it joined."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from llmsample.engine.continuous_batch import BatchItem, RowFailed, decode_batch
from llmsample.engine.loop import generate, run_to_end
from llmsample.engine.prompt import encode_prompt
from llmsample.events import RunStats, Summary

PROMPTS = ["w5 w9 w3 w17 w4", "w8", "w12 w12 w13 w14 w15 w16 w17 w18 w19", "w3 w4", "w20 w21 w22", "w6 w7 w6 w7"]
CONFIGS = [
    dict(temperature=0.0),
    dict(temperature=0.9, top_k=8, seed=3),
    dict(temperature=1.2, top_p=0.9, min_p=0.02, seed=5, presence_penalty=0.8, repetition_penalty=1.3),
    dict(temperature=0.7, seed=11, stop=("w9",)),
    dict(temperature=1.0, seed=13, min_p=0.02, dry_multiplier=0.8, xtc_probability=0.5, ban=("w12 w13",), min_tokens=2),
    dict(temperature=1.1, seed=17, dynatemp_range=0.5, no_repeat_ngram_size=2, smoothing_factor=0.2, epsilon_cutoff=0.01,
         eta_cutoff=0.01, top_h=0.9, top_a=0.05),
]


def requests(lm, configs: list[dict] = CONFIGS) -> list[BatchItem]:
    from llmsample.sampling.config import SamplingConfig

    items = []
    for i, prompt in enumerate(PROMPTS):
        cfg = SamplingConfig(**configs[i % len(configs)], max_tokens=4 + 3 * i)
        ids = encode_prompt(lm, prompt, raw=True)[0].tolist()
        items.append(BatchItem(i, ids, cfg, RunStats("tiny", "test", cfg.seed)))
    return items


def alone(lm, item: BatchItem):
    ids = torch.tensor([item.prompt_ids])
    return run_to_end(generate(lm, ids, item.cfg, RunStats("tiny", "test", item.cfg.seed)))


def collect(lm, items, batch_size: int):
    events: dict[int, list] = {item.key: [] for item in items}
    summaries: dict[int, Summary] = {}
    order = []
    for key, record in decode_batch(lm, items, batch_size):
        if isinstance(record, Summary):
            summaries[key] = record
            order.append(key)
        else:
            assert not isinstance(record, RowFailed), record.message
            assert key not in summaries
            events[key].append(record)
    return events, summaries, order


MIXED = [  # rows that share a chain call, each with its own temperature, top-p and min-p
    dict(temperature=0.7, top_p=0.9, min_p=0.02, seed=1),
    dict(temperature=1.3, top_p=0.95, min_p=0.1, seed=2),
    dict(temperature=1.0, top_p=0.5, min_p=0.05, seed=3),
    dict(temperature=0.9, top_p=0.8, min_p=0.3, seed=4),
    # a dynamic temperature is the row's own: these two share a call by their top-p alone
    dict(temperature=1.0, top_p=0.9, dynatemp_range=0.6, seed=5),
    dict(temperature=1.0, top_p=0.7, dynatemp_range=0.6, seed=6),
]


@pytest.mark.parametrize("configs", [CONFIGS, MIXED], ids=["own-settings", "per-row-values"])
@pytest.mark.parametrize("batch_size", [1, 2, 3, 8])
def test_every_request_decodes_as_it_does_alone(tiny_lm, batch_size: int, configs: list[dict]) -> None:
    items = requests(tiny_lm, configs)
    events, summaries, _ = collect(tiny_lm, items, batch_size)
    for item in items:
        expected_events, expected = alone(tiny_lm, dataclasses.replace(item, stats=RunStats("t", "t", None)))
        got = events[item.key]
        assert [e.token_id for e in got] == [e.token_id for e in expected_events], item.key
        assert [e.text for e in got] == [e.text for e in expected_events]
        for mine, theirs in zip(got, expected_events, strict=True):
            assert mine.removed == theirs.removed and mine.model_rank == theirs.model_rank
            assert mine.prob == pytest.approx(theirs.prob, rel=1e-4, abs=1e-6)
            assert [c.token_id for c in mine.top] == [c.token_id for c in theirs.top]
        assert summaries[item.key].stop_reason == expected.stop_reason
        assert summaries[item.key].text == expected.text


def test_finished_rows_leave_and_the_queue_refills(tiny_lm) -> None:
    items = [dataclasses.replace(item, cfg=dataclasses.replace(item.cfg, stop=())) for item in requests(tiny_lm)]
    log = [(key, isinstance(record, Summary)) for key, record in decode_batch(tiny_lm, items, 2, ignore_eos=True)]
    assert {key for key, done in log if done} == {item.key for item in items}
    # Requests 0 and 1 start (4 and 7 tokens); 2 takes 0's place as soon as it ends, while 1 runs on.
    assert log.index((0, True)) < log.index((2, False)) < log.index((1, True))
    assert sum(1 for key, done in log if not done) == sum(item.cfg.max_tokens for item in items)


@pytest.mark.parametrize("top_k", [None, 3])
def test_a_broken_row_fails_alone(tiny_lm, monkeypatch: pytest.MonkeyPatch, top_k: int | None) -> None:
    """``top_k`` 3 of the tiny vocabulary's 32: the chain goes on on top-k's candidates, where a
    NaN row keeps fewer than k."""
    from llmsample.engine import padded

    items = requests(tiny_lm)[:3]
    if top_k is not None:
        items = [dataclasses.replace(i, cfg=dataclasses.replace(i.cfg, top_k=top_k, temperature=0.8)) for i in items]
    real_forward = padded.PaddedBatch._forward

    def nan_in_row_one(self, ids, mask, positions, cache, keep_last=False, **kwargs):
        logits = real_forward(self, ids, mask, positions, cache, keep_last, **kwargs)
        if ids.shape[0] == 3 and ids.shape[1] == 1:
            logits[1] = float("nan")
        return logits

    monkeypatch.setattr(padded.PaddedBatch, "_forward", nan_in_row_one)
    outcomes = {key: record for key, record in decode_batch(tiny_lm, items, 3) if not hasattr(record, "token_id")}
    assert isinstance(outcomes[1], RowFailed) and "NaN/inf" in outcomes[1].message
    assert isinstance(outcomes[0], Summary) and isinstance(outcomes[2], Summary)


def test_a_row_whose_bans_leave_nothing_fails_alone(tiny_lm) -> None:
    """Issue 25, 14: bans that remove every candidate end that request with an error (the path a
    NaN row takes), never lifted; its neighbours, with or without the same settings, decode on."""
    items = requests(tiny_lm)[:3]
    everything = dataclasses.replace(items[1].cfg, ban=("w", "<"))  # every token text holds one
    items[1] = dataclasses.replace(items[1], cfg=everything)
    items.append(dataclasses.replace(items[1], key=3))  # the same settings: one chain for both rows
    outcomes = {key: record for key, record in decode_batch(tiny_lm, items, 4) if not hasattr(record, "token_id")}
    for key in (1, 3):
        assert isinstance(outcomes[key], RowFailed)
        assert outcomes[key].message.startswith("the bans leave no token to generate at token 0")
    for key in (0, 2):
        expected = alone(tiny_lm, dataclasses.replace(items[key], stats=RunStats("t", "t", None)))[1]
        assert isinstance(outcomes[key], Summary) and outcomes[key].text == expected.text
