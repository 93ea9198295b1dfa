"""The token loop on tiny random Llamas: cache correctness, stopping, determinism."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from llmsample.engine.loop import generate, run_to_end
from llmsample.engine.prompt import encode_prompt
from llmsample.events import RunStats
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.stages import needs_sequences

PROMPT = "w5 w9 w3 w17 w4"


def run(lm, cfg: SamplingConfig, prompt: str = PROMPT, **kwargs):
    ids = encode_prompt(lm, prompt, raw=True)
    return run_to_end(generate(lm, ids, cfg, RunStats("tiny", "test", cfg.seed), **kwargs))


def test_cached_loop_equals_full_recompute(tiny_lm) -> None:
    tokens, summary = run(tiny_lm, SamplingConfig(temperature=0, max_tokens=40), ignore_eos=True)
    ids = encode_prompt(tiny_lm, PROMPT, raw=True)
    with torch.inference_mode():
        for event in tokens:
            logits = tiny_lm.model(ids).logits[:, -1]
            assert event.token_id == int(logits.argmax(-1))
            ids = torch.cat([ids, torch.tensor([[event.token_id]])], dim=1)
    assert summary.tokens == 40 and summary.stop_reason == "length"


def test_max_tokens(tiny_lm) -> None:
    tokens, summary = run(tiny_lm, SamplingConfig(max_tokens=7, seed=1), ignore_eos=True)
    assert len(tokens) == 7 and summary.tokens == 7 and summary.stop_reason == "length"
    assert "".join(t.text for t in tokens) == summary.text


def test_eos_stops_and_releases_no_text(tiny_lm) -> None:
    # Force EOS (id 1) as the argmax: a preset cannot do that, so bias the model's output layer.
    model = tiny_lm.model
    head = model.lm_head

    class EosFirst(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            logits = head(x).clone()
            logits[..., 1] += 100.0
            return logits

    model.lm_head = EosFirst()
    try:
        tokens, summary = run(tiny_lm, SamplingConfig(temperature=0, max_tokens=20))
    finally:
        model.lm_head = head
    assert summary.stop_reason == "eos"
    assert tokens[-1].eos and tokens[-1].token_id == 1 and tokens[-1].text == ""


def test_stop_string_across_token_boundary(tiny_lm) -> None:
    tokens, _ = run(tiny_lm, SamplingConfig(temperature=0, max_tokens=30), ignore_eos=True)
    text = "".join(t.text for t in tokens)
    # A stop string made of the end of one token and the start of the next.
    words = text.split()
    stop = f"{words[3][1:]} {words[4][:2]}"
    _, summary = run(tiny_lm, SamplingConfig(temperature=0, max_tokens=30, stop=(stop,)), ignore_eos=True)
    assert summary.stop_reason == "stop"
    assert summary.text == text[: text.index(stop)]
    assert stop not in summary.text and stop[:2] not in summary.text[len(text[: text.index(stop)]) :]


def test_same_seed_same_tokens(tiny_lm) -> None:
    cfg = SamplingConfig(temperature=1.0, top_k=20, top_p=0.95, seed=1234, max_tokens=25)
    runs = {tuple(t.token_id for t in run(tiny_lm, cfg, ignore_eos=True)[0]) for _ in range(20)}
    assert len(runs) == 1
    other = tuple(t.token_id for t in run(tiny_lm, dataclasses.replace(cfg, seed=99), ignore_eos=True)[0])
    assert other not in runs


def test_event_numbers_are_consistent(tiny_lm) -> None:
    cfg = SamplingConfig(
        temperature=0.8, top_k=10, top_p=0.9, min_p=0.02, seed=3, max_tokens=15, repetition_penalty=1.2
    )
    tokens, _ = run(tiny_lm, cfg, top_n=5, ignore_eos=True)
    for event in tokens:
        assert 0 < event.prob <= 1 and 0 < event.model_prob <= 1
        assert event.model_rank >= 1 and event.entropy >= 0
        assert len(event.top) == 5
        assert [c.prob for c in event.top] == sorted((c.prob for c in event.top), reverse=True)
        assert event.removed["top_k"] == tiny_lm.model.config.vocab_size - 10
        if event.token_id in [c.token_id for c in event.top]:
            match = next(c for c in event.top if c.token_id == event.token_id)
            assert match.prob == pytest.approx(event.prob)


def test_empty_chatless_prompt_starts_from_bos(tiny_lm) -> None:
    assert encode_prompt(tiny_lm, "", raw=True).tolist() == [[0]]


def test_compiled_static_cache_equals_the_eager_loop(tiny_model_dir) -> None:
    """--compile: the static cache, the compiled step and rollback give the same greedy tokens."""
    from llmsample.engine.speculative import NgramDrafter
    from llmsample.models.loading import load_model

    compiled = load_model(str(tiny_model_dir), "cpu", "float32", compile=True)
    eager = load_model(str(tiny_model_dir), "cpu", "float32")
    cfg = SamplingConfig(temperature=0, max_tokens=40)
    expected = [t.token_id for t in run(eager, cfg, ignore_eos=True)[0]]
    tokens, _ = run(compiled, cfg, ignore_eos=True)
    assert [t.token_id for t in tokens] == expected
    ids = encode_prompt(compiled, PROMPT, raw=True)
    drafter = NgramDrafter(compiled.model.config.vocab_size, compiled.device, 1, 3)
    spec, _ = run_to_end(generate(compiled, ids, cfg, RunStats("t", "t", None), drafter=drafter, ignore_eos=True))
    assert [t.token_id for t in spec] == expected

    # Not only the argmax: the compiled step's logits (its one-query attention over the static
    # cache's masked slots) match the eager loop's.
    from llmsample.engine.runner import ModelRunner
    from llmsample.models.attention import NAME

    assert compiled.model.config._attn_implementation == NAME
    with ModelRunner.for_run(compiled, 1, 64) as fast, ModelRunner.for_run(eager, 1, 64) as slow:
        torch.testing.assert_close(fast.prefill(ids), slow.prefill(ids))
        for token in expected[:12]:
            step = torch.tensor([token])
            torch.testing.assert_close(fast.step(step), slow.step(step), rtol=1e-4, atol=1e-4)


# --- host synchronisations ----------------------------------------------------------------------

SYNCS = {"__bool__", "item", "tolist", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero", "__repr__"}


class SyncCounter(torch.overrides.TorchFunctionMode):
    """Counts every tensor method that reads values back to the host (a sync on an accelerator)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in SYNCS:
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))


class FixedLogitsModel(torch.nn.Module):
    """Logits from a table indexed by the last token: a model that never syncs by itself."""

    def __init__(self, lm) -> None:
        super().__init__()
        self.config = lm.model.config
        self.generation_config = lm.model.generation_config
        vocab = self.config.vocab_size
        self.table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0)) * 3

    def forward(self, input_ids, logits_to_keep=0, **kwargs):
        logits = self.table[input_ids]
        return type("Output", (), {"logits": logits[:, -logits_to_keep:] if logits_to_keep else logits})


@pytest.mark.parametrize(
    "cfg",
    [
        SamplingConfig(temperature=0),
        SamplingConfig(temperature=0.8, top_k=5, top_p=0.9, min_p=0.05),  # every filter, top-k with ties
        SamplingConfig(temperature=1.0, top_p=0.5, presence_penalty=0.5, repetition_penalty=1.3),
        # every new stage; DRY, bans and min-tokens read the ids the step's transfer brought back
        SamplingConfig(
            temperature=0.9,
            typical_p=0.9,
            top_n_sigma=2.0,
            xtc_probability=0.5,
            dry_multiplier=0.8,
            logit_bias={"w5": 2.0},
            ban=("w7 w8",),
            min_tokens=4,
            stop=("w9",),
        ),
        SamplingConfig(temperature=0, dry_multiplier=0.8, ban=("w7 w8",)),
    ],
)
@pytest.mark.parametrize("watched", [(), ("w5", "7", "w9")])  # --watch rides in the same transfer
def test_one_host_transfer_per_step(
    tiny_lm, monkeypatch: pytest.MonkeyPatch, cfg: SamplingConfig, watched: tuple[str, ...]
) -> None:
    from llmsample.sampling.vocabulary import Vocabulary

    # Count as on an accelerator: the CPU-only shortcuts (top-p's widening) are off.
    monkeypatch.setattr("llmsample.sampling.filters.host_syncs_are_free", lambda tensor: False)
    lm = dataclasses.replace(tiny_lm, model=FixedLogitsModel(tiny_lm))
    cfg = dataclasses.replace(cfg, max_tokens=12, seed=3)
    vocabulary = Vocabulary.of(lm.tokenizer, lm.model.config.vocab_size, lm.eos_ids)
    watch = [(text, vocabulary.token_id(text)) for text in watched]
    ids = encode_prompt(lm, PROMPT, raw=True)
    events = generate(lm, ids, cfg, RunStats("tiny", "test", cfg.seed), ignore_eos=True, watch=watch)
    with SyncCounter() as counter:
        tokens, _ = run_to_end(events)
    assert len(tokens) == 12
    assert all(list(t.watch) == list(watched) for t in tokens)
    # One at the start (the prompt's ids, for the text stream; a second for the history when a
    # stage reads the token sequence), then one per step.
    assert counter.calls == ["tolist"] * (1 + needs_sequences(cfg) + 12)


def test_top_p_sorted_and_widened_candidates_agree() -> None:
    from llmsample.sampling.filters import _nucleus_candidates, keep_top_p

    logits = torch.randn(4, 3000, generator=torch.Generator().manual_seed(2)) * 0.3  # a wide nucleus
    for p in (0.1, 0.5, 0.9, 0.999):
        widened = keep_top_p(logits, p)
        assert _nucleus_candidates(logits.softmax(-1), p)[0].shape[-1] > 256 or p < 0.9
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("llmsample.sampling.filters.host_syncs_are_free", lambda tensor: False)
            assert torch.equal(keep_top_p(logits, p), widened)


class TableDrafter:
    """Proposes the fixed-logits model's greedy continuation (one-hot q): drafts that pass."""

    drawn = False  # fixed drafts: checked against the target's own draws

    def __init__(self, table: torch.Tensor) -> None:
        self.next, self.vocab, self.calls = table.argmax(-1).tolist(), table.shape[0], 0  # read before counting

    def propose(self, seq, k, history, cfg, generator):
        self.calls += 1
        drafted, last = [], seq[-1]
        for _ in range(k):
            last = self.next[last]
            drafted.append(last)
        drafted = torch.tensor(drafted)
        return drafted, torch.nn.functional.one_hot(drafted, self.vocab).float()


@pytest.mark.parametrize(
    "cfg",
    [
        SamplingConfig(temperature=0),
        SamplingConfig(temperature=0.8, top_k=5, top_p=0.9, presence_penalty=0.5),
        SamplingConfig(temperature=0.9, dry_multiplier=0.8, ban=("w7 w8",), min_tokens=4, stop=("w9",)),
    ],
)
def test_a_speculative_step_makes_one_transfer_besides_the_drafters(
    tiny_lm, monkeypatch: pytest.MonkeyPatch, cfg: SamplingConfig
) -> None:

    monkeypatch.setattr("llmsample.sampling.filters.host_syncs_are_free", lambda tensor: False)
    lm = dataclasses.replace(tiny_lm, model=FixedLogitsModel(tiny_lm))
    cfg = dataclasses.replace(cfg, max_tokens=12, seed=3)
    drafter = TableDrafter(lm.model.table)
    ids = encode_prompt(lm, PROMPT, raw=True)
    events = generate(lm, ids, cfg, RunStats("t", "t", 3), drafter=drafter, draft_tokens=2, ignore_eos=True)
    with SyncCounter() as counter:
        tokens, summary = run_to_end(events)
    passes = summary.facts.speculation.target_passes
    # (the prefill's logits give the first token, so its pass drafts nothing; nor may the last)
    assert (len(tokens) == 12 or summary.stop_reason == "stop") and passes < len(tokens)
    assert drafter.calls >= passes - 2
    # The prompt's ids (and the sequences' when a stage reads them), then per pass the step's one
    # transfer (figures and accepted counts together) and the drafted ids.
    assert counter.calls == ["tolist"] * (1 + needs_sequences(cfg) + passes + drafter.calls)


def test_a_small_step_computes_on_one_thread_and_gives_the_count_back(tiny_lm, monkeypatch) -> None:
    # A second OpenMP thread waits at every small op's barrier for a busy core (ONE_THREAD_ELEMENTS):
    # the chain and the figures of a one-row step run on one thread, the caller's consumer on its own.
    from llmsample.engine import step

    seen: list[int] = []
    chain = step.sampler_chain
    monkeypatch.setattr(step, "sampler_chain", lambda *a, **k: seen.append(torch.get_num_threads()) or chain(*a, **k))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        cfg = SamplingConfig(max_tokens=3, seed=1)
        events = generate(tiny_lm, encode_prompt(tiny_lm, PROMPT, raw=True), cfg, RunStats("tiny", "test", 1))
        consumer = [torch.get_num_threads() for _ in events]
        assert seen == [1, 1, 1] and consumer == [2, 2, 2, 2]
        monkeypatch.setattr(step, "ONE_THREAD_ELEMENTS", 0)  # a large step keeps the caller's threads
        seen.clear()
        run(tiny_lm, cfg, ignore_eos=True)
        assert seen == [2, 2, 2]
    finally:
        torch.set_num_threads(before)


def test_the_step_computes_in_inference_mode_and_hands_back_ordinary_tokens(tiny_lm, monkeypatch) -> None:
    """Inference mode spares the step's small calls autograd's bookkeeping, and ends before its
    consumer runs; the tokens it hands back are fed to the model, where a compiled step warmed up
    on ordinary tensors would compile a second graph for inference tensors."""
    from llmsample.engine import decode, step

    modes: list[bool] = []
    newest: list[torch.Tensor] = []
    chain = step.sampler_chain
    monkeypatch.setattr(
        step, "sampler_chain", lambda *a, **k: modes.append(torch.is_inference_mode_enabled()) or chain(*a, **k)
    )

    def watched(*args, **kwargs):
        result = yield from step.sample_step(*args, **kwargs)
        newest.append(result.newest)
        return result

    monkeypatch.setattr(decode, "sample_step", watched)
    cfg = SamplingConfig(max_tokens=3, seed=1)
    events = generate(tiny_lm, encode_prompt(tiny_lm, PROMPT, raw=True), cfg, RunStats("tiny", "test", 1))
    consumer = [torch.is_inference_mode_enabled() for _ in events]
    assert modes == [True] * 3 and consumer == [False] * 4
    assert len(newest) == 3 and not any(tokens.is_inference() for tokens in newest)
