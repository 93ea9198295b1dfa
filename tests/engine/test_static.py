"""``batch --compile``: requests with their own prompts, lengths, settings and seeds decode in
waves over the compiled step's static cache and give, in float32, the eager batch's tokens (and
each request's tokens alone); one graph is compiled for the whole run, not per step or wave.

The model is really compiled (inductor on the CPU), once for the module: one run is shared by
the tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from llmsample.engine.continuous_batch import BatchItem, RowFailed, decode_batch
from llmsample.engine.loop import generate, run_to_end
from llmsample.engine.prompt import encode_prompt
from llmsample.engine.static import StaticBatch
from llmsample.events import RunStats, Summary, TokenEvent
from llmsample.models.loading import load_model
from llmsample.sampling.config import SamplingConfig

# Seven prompts of different lengths, more than one wave of BATCH_SIZE: waves of 3, 3 and 1.
PROMPTS = ["w4 w8 w15 w16 w23 w4 w8 w15", "w9", "w5 w6 w5 w6 w5", "w12 w13", "w3 w4 w3 w4 w3 w4 w3", "", "w20 w21 w22"]
CONFIGS = [
    dict(temperature=0.0),
    dict(temperature=0.9, top_k=8, seed=3),
    dict(temperature=1.2, top_p=0.9, min_p=0.02, seed=5, presence_penalty=0.8),
    dict(temperature=0.0, dry_multiplier=0.8, ban=("w12 w13",), stop=("w7",)),
    dict(temperature=1.0, seed=13, min_p=0.02, xtc_probability=0.5, min_tokens=2, repetition_penalty=1.3),
]
BATCH_SIZE = 3


@dataclass
class Decoded:
    events: dict[int, list[TokenEvent]]
    summaries: dict[int, Summary]


def requests(lm) -> list[BatchItem]:
    out = []
    for i, prompt in enumerate(PROMPTS):
        cfg = SamplingConfig(**{"seed": 100 + i, **CONFIGS[i % len(CONFIGS)]}, max_tokens=4 + 3 * i)
        ids = encode_prompt(lm, prompt, raw=True)[0].tolist()
        out.append(BatchItem(i, ids, cfg, RunStats("tiny", "test", cfg.seed)))
    return out


def run(lm, batch_size: int = BATCH_SIZE) -> Decoded:
    out = Decoded({i: [] for i in range(len(PROMPTS))}, {})
    for key, record in decode_batch(lm, requests(lm), batch_size):
        assert not isinstance(record, RowFailed), record.message
        if isinstance(record, Summary):
            out.summaries[key] = record
        else:
            out.events[key].append(record)
    return out


@pytest.fixture(scope="module")
def compiled_lm(tiny_model_dir: Path):
    return load_model(str(tiny_model_dir), "cpu", "float32", compile=True)


@pytest.fixture(scope="module")
def compiled_run(compiled_lm) -> tuple[Decoded, dict[str, int]]:
    """The compiled batch, run once, with what dynamo compiled while it ran (the step is built
    when the run opens its backend: this model has none yet)."""
    from torch._dynamo.utils import counters

    counters.clear()
    decoded = run(compiled_lm)
    return decoded, dict(counters["frames"])


def test_batch_compile_gives_the_eager_tokens(compiled_run, tiny_lm) -> None:
    decoded, _ = compiled_run
    eager = run(tiny_lm)
    assert set(decoded.summaries) == set(range(len(PROMPTS)))  # every wave ran
    lengths = {len(events) for events in eager.events.values()}
    assert len(lengths) > 2  # rows finished at different steps of their waves
    for key, events in eager.events.items():
        got = decoded.events[key]
        assert [e.token_id for e in got] == [e.token_id for e in events], key
        for mine, theirs in zip(got, events, strict=True):
            assert mine.prob == pytest.approx(theirs.prob, rel=1e-4, abs=1e-6)
        assert decoded.summaries[key].text == eager.summaries[key].text
        assert decoded.summaries[key].stop_reason == eager.summaries[key].stop_reason


def test_batch_compile_gives_each_request_its_tokens_alone(compiled_run, tiny_lm) -> None:
    decoded, _ = compiled_run
    for item in requests(tiny_lm):
        tokens, _ = run_to_end(generate(tiny_lm, torch.tensor([item.prompt_ids]), item.cfg, RunStats("t", "t", None)))
        assert [e.token_id for e in decoded.events[item.key]] == [e.token_id for e in tokens], item.key


def test_one_graph_compiles_for_the_whole_run(compiled_run, compiled_lm) -> None:
    """Built once when the run starts; no step and no later wave compiles again (a new value of
    the mask, the positions or the cache's column is not a new graph)."""
    _, frames = compiled_run
    assert frames.get("total") == 1 and frames.get("ok") == 1
    assert all(s.facts.compile_s and s.facts.compile_s > 0 for s in compiled_run[0].summaries.values())
    from torch._dynamo.utils import counters

    counters.clear()  # the same shapes again: the leased step is reused, nothing compiles
    again = run(compiled_lm)
    assert dict(counters["frames"]).get("total", 0) == 0
    assert [len(e) for e in again.events.values()] == [len(e) for e in compiled_run[0].events.values()]


def test_a_wave_joins_only_an_empty_static_batch(compiled_lm) -> None:
    backend = StaticBatch(compiled_lm, BATCH_SIZE, 40)
    try:
        backend.admit([[0, 5], [0, 6, 7]])
        with pytest.raises(ValueError, match="once the last one has left"):
            backend.admit([[0, 3]])
        backend.keep([])
        assert backend.admit([[0, 3]]).shape[0] == 1
    finally:
        backend.close()


def test_the_static_batch_keeps_the_seams_contract(compiled_lm, tiny_lm) -> None:
    """The seam's contract (tests/engine/test_seam.py) for what the static batch supports: a wave
    admitted, steps, rows leaving give a full recomputation's logits; it says it neither joins
    nor verifies, and refuses both in one line."""
    backend = StaticBatch(compiled_lm, BATCH_SIZE, 32)
    assert not backend.can_join and not backend.ragged
    seqs = [[5, 6, 7, 8], [9, 10], [11]]

    def check(logits: torch.Tensor) -> None:
        for row, seq in zip(logits, seqs, strict=True):
            with torch.inference_mode():
                want = tiny_lm.model(torch.tensor([seq])).logits[0, -1].float()
            assert (row - want).abs().max().item() < 1e-3 * max(1.0, want.abs().max().item())
            assert row.argmax() == want.argmax()

    check(backend.admit([list(s) for s in seqs]))
    for step in ([12, 13, 14], [15, 16, 17]):
        for seq, t in zip(seqs, step, strict=True):
            seq.append(t)
        check(backend.step(torch.tensor(step)))
    backend.keep([2, 0])  # row 1 leaves; the others go on, in a new order
    seqs = [seqs[2], seqs[0]]
    for seq, t in zip(seqs, [18, 19], strict=True):
        seq.append(t)
    check(backend.step(torch.tensor([18, 19])))
    with pytest.raises(ValueError, match="one token per row"):
        backend.verify([[1], [2]])
    with pytest.raises(ValueError, match="admits a wave"):
        backend.admit([[1]])
    backend.close()
