"""The one loop: speculative rows in a batch decode as they do alone and sample the target's
distribution, rows that share sampler settings share one chain call whatever their seeds, and a
row whose numbers break ends alone in every mode."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from scipy.stats import chisquare

from llmsample.engine.continuous_batch import BatchItem, RowFailed, decode_batch
from llmsample.engine.loop import generate, generate_rows, run_to_end
from llmsample.engine.prompt import encode_prompt
from llmsample.engine.speculative import ModelDrafter, NgramDrafter
from llmsample.events import RunStats, Summary, TokenEvent
from llmsample.models.loading import load_model
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import sampler_chain
from tests.conftest import make_tiny_model

PROMPTS = ["w4 w8 w15 w16 w23 w4 w8 w15", "w5 w6 w5 w6 w5", "w9", "w12 w13 w14 w12 w13", "w3 w4 w3 w4 w3 w4"]
CONFIGS = [
    dict(temperature=0.0),
    dict(temperature=0.9, top_k=8, seed=3),
    dict(temperature=1.2, top_p=0.9, min_p=0.02, seed=5, presence_penalty=0.8, dynatemp_range=0.5, no_repeat_ngram_size=3),
    dict(temperature=0.0, dry_multiplier=0.8, ban=("w12 w13",)),
    dict(temperature=1.0, seed=13, min_p=0.02, xtc_probability=0.5, min_tokens=2),
]


@pytest.fixture(scope="module")
def draft_lm(tmp_path_factory: pytest.TempPathFactory):
    return load_model(str(make_tiny_model(tmp_path_factory.mktemp("draft"), seed=1)), "cpu", "float32")


def drafter_for(kind: str, lm, draft_lm):
    vocab = lm.model.config.vocab_size
    if kind == "ngram":
        ngram = NgramDrafter(vocab, lm.sample_device, 1, 3)
        return lambda: ngram
    return lambda: ModelDrafter(draft_lm, vocab, lm.sample_device)


def items(lm, make_drafter, k: int | None) -> list[BatchItem]:
    out = []
    for i, prompt in enumerate(PROMPTS):
        cfg = SamplingConfig(**CONFIGS[i % len(CONFIGS)], max_tokens=5 + 3 * i)
        ids = encode_prompt(lm, prompt, raw=True)[0].tolist()
        out.append(BatchItem(i, ids, cfg, RunStats("tiny", "test", cfg.seed), make_drafter, k))
    return out


def alone(lm, item: BatchItem) -> tuple[list[TokenEvent], Summary]:
    stats = RunStats("tiny", "test", item.cfg.seed)
    drafter = item.drafter() if item.drafter is not None else None
    events = generate(
        lm, torch.tensor([item.prompt_ids]), item.cfg, stats, drafter=drafter, draft_tokens=item.draft_tokens, ignore_eos=True
    )
    return run_to_end(events)


@pytest.mark.parametrize("batch_size", [1, 2, 3, 8])
@pytest.mark.parametrize(("kind", "k"), [("ngram", None), ("model", 3), ("model", None)])
def test_every_speculative_request_in_a_batch_decodes_as_it_does_alone(
    tiny_lm, draft_lm, batch_size: int, kind: str, k: int | None
) -> None:
    requests = items(tiny_lm, drafter_for(kind, tiny_lm, draft_lm), k)
    events: dict[int, list[TokenEvent]] = {item.key: [] for item in requests}
    summaries: dict[int, Summary] = {}
    for key, record in decode_batch(tiny_lm, requests, batch_size, ignore_eos=True):
        assert not isinstance(record, RowFailed), record.message
        if isinstance(record, Summary):
            summaries[key] = record
        else:
            events[key].append(record)
    drafted = 0
    for item in requests:
        tokens, summary = alone(tiny_lm, item)
        got = events[item.key]
        assert [(e.token_id, e.text, e.source) for e in got] == [(e.token_id, e.text, e.source) for e in tokens]
        for mine, theirs in zip(got, tokens, strict=True):  # float32 sums differ in the last bits by batch shape
            assert mine.removed == theirs.removed and mine.model_rank == theirs.model_rank
            assert mine.prob == pytest.approx(theirs.prob, rel=1e-4, abs=1e-6)
        assert summaries[item.key].text == summary.text
        mine, theirs = summaries[item.key].facts.speculation, summary.facts.speculation
        drafted += summary.facts.speculation.drafted
        if k is None and (item.cfg.is_greedy or kind == "ngram") and batch_size > 1:
            # its drafts share the pass's width (test_greedy_rows_share_the_draft_length): a greedy
            # row's tokens and a fixed draft's draws do not depend on it
            continue
        assert (mine.drafted, mine.accepted, mine.target_passes) == (
            theirs.drafted,
            theirs.accepted,
            theirs.target_passes,
        )
    assert drafted > 0  # the rows really speculated


def test_greedy_rows_share_the_draft_length(tiny_lm) -> None:
    """A pass is as wide as its longest row: adaptive greedy rows of a batch of 4 draft at most
    16 / 4 each; a sampled row (whose draws follow its drafts) and a row with a fixed K draft as
    they do alone."""
    vocab = tiny_lm.model.config.vocab_size

    def run(batch_size: int) -> dict[int, list[int]]:
        asked: dict[int, list[int]] = {}

        class Spy(ModelDrafter):  # the target drafting for itself: every draft is accepted
            def propose(self, seq, k, history, cfg, generator, matcher=None):
                asked.setdefault(cfg.seed, []).append(k)
                return super().propose(seq, k, history, cfg, generator, matcher)

        requests = []
        for i, temperature in enumerate([0.0, 0.0, 0.9, 0.0]):
            cfg = SamplingConfig(temperature=temperature, seed=i, max_tokens=60)
            ids = encode_prompt(tiny_lm, "w3 w4 w3 w4 w3 w4 w3 w4", raw=True)[0].tolist()
            k = 6 if i == 3 else None
            requests.append(BatchItem(i, ids, cfg, RunStats("tiny", "test", i), lambda: Spy(tiny_lm, vocab), k))
        for _, record in decode_batch(tiny_lm, requests, batch_size, ignore_eos=True):
            assert not isinstance(record, RowFailed)
        return asked

    alone, shared = run(1), run(4)
    # While all four rows are in (the sampled row, drafting up to 16, leaves first), 16 / 4 each.
    assert max(alone[0]) > 4 and max(shared[0][:5] + shared[1][:5]) <= 4
    assert shared[2] == alone[2] and shared[3] == alone[3] and max(shared[3]) == 6


def test_greedy_speculative_rows_equal_plain_rows(tiny_lm, draft_lm) -> None:
    plain = items(tiny_lm, None, None)
    speculative = items(tiny_lm, drafter_for("model", tiny_lm, draft_lm), None)

    def texts(requests):
        return {k: r.text for k, r in decode_batch(tiny_lm, requests, 3, ignore_eos=True) if isinstance(r, Summary)}

    greedy = [i for i, cfg in enumerate(CONFIGS * 2) if cfg.get("temperature") == 0.0 and i < len(PROMPTS)]
    plain_texts, speculative_texts = texts(plain), texts(speculative)
    assert all(plain_texts[i] == speculative_texts[i] for i in greedy)


# --- the distribution of speculative rows sampled together -----------------------------------

VOCAB = 12
SAMPLES = 1500
SETTINGS = {
    "plain": SamplingConfig(temperature=1.0, max_tokens=3),
    "filtered": SamplingConfig(temperature=0.8, top_k=6, top_p=0.9, presence_penalty=0.5, max_tokens=3),
    # Differs from "filtered" only in what RowValues carries: the two share a chain call.
    "hotter": SamplingConfig(temperature=1.4, top_k=6, top_p=0.8, presence_penalty=0.5, max_tokens=3),
}


@pytest.fixture(scope="module")
def vocab12(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("vocab12-batch")
    target = load_model(str(make_tiny_model(root / "t", vocab_size=VOCAB, seed=10, init=0.15)), "cpu", "float32")
    draft = load_model(str(make_tiny_model(root / "d", vocab_size=VOCAB, seed=11, init=0.15)), "cpu", "float32")
    return target, draft


def expected_joint(lm, prompt: list[int], cfg: SamplingConfig, length: int = 3) -> torch.Tensor:
    """P(x1, ..., x_length) under the plain chain, flattened ``[VOCAB ** length]``: each token
    drawn with the history (and a carried stage's state) after those before it."""
    history = TokenHistory.for_config(torch.tensor([prompt]), VOCAB, cfg, lm.tokenizer, lm.eos_ids)
    seqs: list[list[int]] = [[]]
    joint = torch.ones(1, dtype=torch.float64)
    for _ in range(length):
        with torch.inference_mode():
            logits = lm.model(torch.tensor([[*prompt, *s] for s in seqs])).logits[:, -1]
        n = len(seqs)
        # every sequence once per next token, so the chain's states after each token come from one call
        wide = TokenHistory.stack([history.rows(slice(i, i + 1)) for i in range(n) for _ in range(VOCAB)])
        chain = sampler_chain(logits.repeat_interleave(VOCAB, 0), wide, cfg)
        tokens = torch.arange(VOCAB).repeat(n)
        joint = joint.repeat_interleave(VOCAB) * chain.probs.double()[torch.arange(n * VOCAB), tokens]
        history = wide.advanced(tokens, tokens.tolist(), chain.state_after(tokens, cfg))
        seqs = [[*s, t] for s in seqs for t in range(VOCAB)]
    return joint


def later_pairs(joint: torch.Tensor) -> torch.Tensor:
    """P(x2, x3) of a three-token joint, flattened: where speculation acts (a row draws its first
    token from the prefill's logits and drafts after it)."""
    return joint.view(VOCAB, VOCAB, VOCAB).sum(0).flatten()


def tv_bound(categories: int, n: int, delta: float = 1e-6) -> float:
    """E[TV] <= 0.5 sqrt(V/n), plus McDiarmid's deviation for a statistic one sample moves by 1/n."""
    return 0.5 * math.sqrt(categories / n) + math.sqrt(math.log(1 / delta) / (2 * n))


def test_speculative_rows_of_a_batch_follow_the_target_distribution(vocab12) -> None:
    target, draft = vocab12
    prompt = [0, 5, 7, 5]
    names = list(SETTINGS)
    requests = [
        BatchItem(
            (names[i % len(names)], i),
            prompt,
            dataclasses.replace(SETTINGS[names[i % len(names)]], seed=1000 + i),
            RunStats("t", "t", None),
            lambda: ModelDrafter(draft, VOCAB, target.sample_device),
            2,
        )
        for i in range(len(names) * SAMPLES)
    ]
    pairs: dict[str, list[tuple[int, ...]]] = {name: [] for name in names}
    tokens: dict[tuple[str, int], list[int]] = {}
    for key, record in decode_batch(target, requests, 64, ignore_eos=True):
        assert not isinstance(record, RowFailed)
        if isinstance(record, TokenEvent):
            tokens.setdefault(key, []).append(record.token_id)
        else:
            pairs[key[0]].append(tuple(tokens.pop(key))[1:])
            assert record.facts.speculation.drafted >= 1  # the second token came through verification
    for name in names:
        expected = later_pairs(expected_joint(target, prompt, SETTINGS[name]))
        observed = torch.zeros(VOCAB * VOCAB, dtype=torch.float64)
        for x2, x3 in pairs[name]:
            observed[x2 * VOCAB + x3] += 1
        assert len(pairs[name]) == SAMPLES
        check_pairs(observed, expected, SAMPLES, name)


def check_pairs(observed: torch.Tensor, expected: torch.Tensor, n: int, name: str) -> None:
    """``n`` sampled pairs' counts ``[VOCAB * VOCAB]`` against their distribution: no forbidden
    pair, then each token's marginal and the pairs (TV within its bound, χ² p above 1e-4)."""
    assert observed[expected == 0].sum() == 0  # never a pair the target's filters forbid
    cells = [
        (observed.view(VOCAB, VOCAB).sum(1), expected.view(VOCAB, VOCAB).sum(1)),
        (observed.view(VOCAB, VOCAB).sum(0), expected.view(VOCAB, VOCAB).sum(0)),
        (observed, expected),
    ]
    for marginal_obs, marginal_exp in cells:
        tv = 0.5 * (marginal_obs / n - marginal_exp).abs().sum().item()
        assert tv < tv_bound(marginal_obs.numel(), n), (name, tv)
        support = marginal_exp > 1e-9
        stat = chisquare(
            marginal_obs[support].numpy(), (marginal_exp[support] / marginal_exp[support].sum() * n).numpy()
        )
        assert stat.pvalue > 1e-4, (name, stat)


# --- grouping and failures ----------------------------------------------------------------------


def test_rows_with_their_own_seeds_share_one_chain_call(tiny_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmsample.engine import step

    calls: list[int] = []
    real = step.sampler_chain

    def counted(logits, history, cfg, values=None):
        calls.append(logits.shape[0])
        return real(logits, history, cfg, values)

    monkeypatch.setattr(step, "sampler_chain", counted)
    ids = encode_prompt(tiny_lm, "w5 w9 w3", raw=True)[0].tolist()
    # Their temperatures, top-p and min-p are per-row values of one call; a top-k is not, and
    # neither is whether a top-p or min-p is on (a row that keeps everything widens the call).
    settings = [
        dict(temperature=0.7, top_p=0.9, min_p=0.2),
        dict(temperature=1.1, top_p=0.8, min_p=0.1),
        dict(temperature=0.9, top_k=5),
        dict(temperature=1.3, top_k=5),
        dict(temperature=1.3, top_p=0.5),
    ]
    requests = [
        BatchItem(i, ids, SamplingConfig(**settings[i % 5], seed=i, max_tokens=6), RunStats("t", "t", i))
        for i in range(10)
    ]
    records = list(decode_batch(tiny_lm, requests, 10, ignore_eos=True))
    assert sum(isinstance(r, Summary) for _, r in records) == 10
    assert calls == [4, 4, 2] * 6  # three calls a step


def test_a_broken_sample_of_compare_presets_ends_alone(tiny_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmsample.engine import padded

    real_forward = padded.PaddedBatch._forward

    def nan_in_row_one(self, ids, mask, positions, cache, keep_last=False, **kwargs):
        logits = real_forward(self, ids, mask, positions, cache, keep_last, **kwargs)
        if ids.shape == (3, 1) and int(positions[0, 0]) == 6:  # the third step of three samples
            logits[1] = float("nan")
        return logits

    monkeypatch.setattr(padded.PaddedBatch, "_forward", nan_in_row_one)
    ids = encode_prompt(tiny_lm, "w5 w9 w3 w4", raw=True)
    cfg = SamplingConfig(temperature=0.8, max_tokens=6)
    stats = [RunStats("t", "p", s) for s in (1, 2, 3)]
    ends = {
        row: r
        for row, r in generate_rows(tiny_lm, ids, cfg, stats, [1, 2, 3], ignore_eos=True)
        if not isinstance(r, TokenEvent)
    }
    assert isinstance(ends[1], RowFailed) and "NaN/inf" in ends[1].message and "position 7" in ends[1].message
    assert isinstance(ends[0], Summary) and ends[0].tokens == 6
    assert isinstance(ends[2], Summary) and ends[2].tokens == 6


def test_compare_presets_prefills_the_prompt_once(tiny_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmsample.engine import padded

    prefills: list[tuple[int, ...]] = []
    real_forward = padded.PaddedBatch._forward

    def watched(self, ids, mask, positions, cache, keep_last=False, **kwargs):
        if keep_last:
            prefills.append(tuple(ids.shape))
        return real_forward(self, ids, mask, positions, cache, keep_last, **kwargs)

    monkeypatch.setattr(padded.PaddedBatch, "_forward", watched)
    ids = encode_prompt(tiny_lm, "w5 w9 w3 w4", raw=True)
    cfg = SamplingConfig(temperature=0.8, max_tokens=4)
    seeds = [1, 2, 3, 4]
    rows = {row: [] for row in range(4)}
    for row, record in generate_rows(tiny_lm, ids, cfg, [RunStats("t", "p", s) for s in seeds], seeds):
        if isinstance(record, TokenEvent):
            rows[row].append(record.token_id)
    assert prefills == [(1, ids.shape[1])]
    for row, seed in enumerate(seeds):  # each replica decodes as its seed does alone
        one = dataclasses.replace(cfg, seed=seed)
        alone_tokens = [
            e.token_id
            for _, e in generate_rows(tiny_lm, ids, one, [RunStats("t", "p", seed)], [seed])
            if isinstance(e, TokenEvent)
        ]
        assert rows[row] == alone_tokens


def test_the_draft_command_line_runs_in_batch(tiny_model_dir: Path, tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from tests.conftest import cli_env

    requests = tmp_path / "in.txt"
    requests.write_text("w4 w8 w15 w16 w4 w8 w15\nw5 w6 w5 w6 w5\n")
    base = [sys.executable, "-m", "llmsample", "batch", str(requests), "-m", str(tiny_model_dir), "--temperature", "0"]
    base += ["--max-tokens", "8", "--ignore-eos", "--tokens", "ids", "-q"]
    plain = subprocess.run(base, capture_output=True, text=True, env=cli_env(), timeout=120)
    spec = subprocess.run([*base, "--draft", "ngram"], capture_output=True, text=True, env=cli_env(), timeout=120)
    assert plain.returncode == spec.returncode == 0, spec.stderr
    plain_records = [json.loads(line) for line in plain.stdout.splitlines()]
    spec_records = [json.loads(line) for line in spec.stdout.splitlines()]
    assert [r["text"] for r in plain_records] == [r["text"] for r in spec_records]


def test_a_step_lists_the_alternatives_its_rows_need(tiny_lm) -> None:
    """Rows may ask for fewer alternatives than the run's top_n: a step lists what its rows need
    at most, and the tokens are the same whatever the list's length."""

    def run(tops: list[int | None]) -> dict[int, list[TokenEvent]]:
        cfg = SamplingConfig(temperature=0.9, seed=4, max_tokens=6)
        ids = encode_prompt(tiny_lm, "w5 w6", raw=True)[0].tolist()
        batch = [BatchItem(i, ids, cfg, RunStats("tiny", "test", 4), top_n=top) for i, top in enumerate(tops)]
        events: dict[int, list[TokenEvent]] = {i: [] for i in range(len(tops))}
        for key, record in decode_batch(tiny_lm, batch, len(batch), top_n=5):
            if isinstance(record, TokenEvent):
                events[key].append(record)
        return events

    none = run([0, 0])
    assert all(event.top == () for row in none.values() for event in row)
    mixed = run([0, None])  # one row wants the run's 5: the step lists 5 for both
    assert all(len(event.top) == 5 for row in mixed.values() for event in row)
    assert [e.token_id for e in none[0]] == [e.token_id for e in mixed[0]]
