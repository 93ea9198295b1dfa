"""Mirostat v1 and v2 and adaptive-p: hand-computed vectors, llama.cpp's own samplers stepped
over the same logits (``llama_sampler_init_mirostat``, ``_mirostat_v2``, ``_adaptive_p``), the
state carried along a speculative row's positions, and the settings' rules."""

from __future__ import annotations

import ctypes
import json
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import Tensor

from llmsample.cli import main
from llmsample.sampling import carried
from llmsample.sampling.config import ConfigError, SamplingConfig
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import sampler_chain
from llmsample.sampling.stages import chain_of

CPU = torch.device("cpu")


def kept(logits: Tensor) -> list[int]:
    return torch.nonzero(logits[0] > -math.inf).flatten().tolist()


def shaped(name: str, logits: Tensor, state: Tensor, cfg: SamplingConfig) -> Tensor:
    return carried.apply_carried(name, logits, None, logits.shape[-1], state, None, cfg)[0]


def after(name: str, logits: Tensor, state: Tensor, token: int, cfg: SamplingConfig) -> Tensor:
    out = shaped(name, logits, state, cfg)
    return carried.observe(name, state, logits, out, None, torch.tensor([token]), cfg)


# --- by hand ------------------------------------------------------------------------------------


def test_mirostat_v2_by_hand() -> None:
    # Surprises of [.5, .25, .125, .125]: 1, 2, 3, 3 bits. mu = 2 keeps the first two, [2/3, 1/3].
    cfg = SamplingConfig(mirostat=2, mirostat_tau=1.0, mirostat_eta=0.5)
    logits = torch.tensor([[0.5, 0.25, 0.125, 0.125]]).log()
    state = torch.tensor([[2.0, 0.0]])
    out = shaped("mirostat", logits, state, cfg)
    assert kept(out) == [0, 1]
    torch.testing.assert_close(out[:, :2].softmax(-1), torch.tensor([[2 / 3, 1 / 3]]))
    # Drawing token 1 (p = 1/3, surprise log2 3): mu = 2 - 0.5 (log2 3 - 1).
    mu = after("mirostat", logits, state, 1, cfg)[0, 0].item()
    assert mu == pytest.approx(2 - 0.5 * (math.log2(3) - 1), abs=1e-6)
    # A mu below every surprise keeps the most likely token alone.
    assert kept(shaped("mirostat", logits, torch.tensor([[0.5, 0.0]]), cfg)) == [0]


def test_mirostat_v1_by_hand() -> None:
    # p proportional to 1/(i+1)^2: each log ratio is 2 t_i, so s-hat = 2, e = 1, and with N = 4
    # k = (2^mu / (1 - 1/4))^(1/2): mu = 3 gives 3.27 (three tokens), mu = 2 gives 2.31 (two).
    cfg = SamplingConfig(mirostat=1, mirostat_tau=1.0, mirostat_eta=0.5)
    logits = torch.tensor([[1 / 16, 1, 1 / 9, 1 / 4]]).log()
    assert kept(shaped("mirostat", logits, torch.tensor([[3.0, 0.0]]), cfg)) == [1, 2, 3]
    assert kept(shaped("mirostat", logits, torch.tensor([[2.0, 0.0]]), cfg)) == [1, 3]
    # Drawing token 3 among the two (p = (1/4) / (5/4) = 0.2): mu = 2 - 0.5 (log2 5 - 1).
    mu = after("mirostat", logits, torch.tensor([[2.0, 0.0]]), 3, cfg)[0, 0].item()
    assert mu == pytest.approx(2 - 0.5 * (math.log2(5) - 1), abs=1e-5)


def test_adaptive_p_by_hand() -> None:
    cfg = SamplingConfig(adaptive_target=0.3, adaptive_decay=0.5)
    state = carried.initial_state(cfg, 1, CPU)
    torch.testing.assert_close(state, torch.tensor([[0.6, 2.0]]))  # primed: the average is the target
    # Average 0.3: the adapted target is 2 x 0.3 - 0.3 = 0.3; d = |p - 0.3| / 0.3 = 2/3, 0, 1/3.
    logits = torch.tensor([[0.5, 0.3, 0.2]]).log()
    out = shaped("adaptive_p", logits, state, cfg)
    torch.testing.assert_close(out, torch.tensor([[5 - 10 * (4 / 9) / (5 / 3), 5.0, 5 - 10 * (1 / 9) / (4 / 3)]]))
    # Drawing token 0 adds its probability before the transform: (0.5 + 0.5 x 0.6, 1 + 0.5 x 2).
    state = after("adaptive_p", logits, state, 0, cfg)
    torch.testing.assert_close(state, torch.tensor([[0.8, 2.0]]))
    # Average 0.4 now: the adapted target 0.2 makes token 2 the most likely.
    assert shaped("adaptive_p", logits, state, cfg).argmax().item() == 2
    # A removed token stays removed.
    masked = torch.tensor([[0.0, -math.inf, 0.0]])
    assert shaped("adaptive_p", masked, state, cfg)[0, 1] == -math.inf


# --- llama.cpp's samplers, stepped over the same logits -----------------------------------------


def llama_cpp_step(sampler: object, row: Tensor, accept: bool) -> tuple[dict[int, float], int]:
    """One apply of a llama.cpp sampler that samples: the kept ids' logits and the token it drew
    (accepted back into it, as llama.cpp's chain does, when ``accept``)."""
    import llama_cpp as lib

    values = row.tolist()
    data = (lib.llama_token_data * len(values))(*(lib.llama_token_data(i, v, 0.0) for i, v in enumerate(values)))
    candidates = lib.llama_token_data_array(data, len(values), -1, False)
    lib.llama_sampler_apply(sampler, ctypes.byref(candidates))
    left = candidates.data
    chosen = left[candidates.selected].id
    if accept:
        lib.llama_sampler_accept(sampler, chosen)
    return {left[i].id: left[i].logit for i in range(candidates.size) if left[i].logit > -math.inf}, chosen


def peer(cfg: SamplingConfig, vocab: int) -> object:
    import llama_cpp as lib

    if cfg.mirostat == 1:
        return lib.llama_sampler_init_mirostat(vocab, 7, cfg.mirostat_tau, cfg.mirostat_eta, carried.MIROSTAT_M)
    if cfg.mirostat == 2:
        return lib.llama_sampler_init_mirostat_v2(7, cfg.mirostat_tau, cfg.mirostat_eta)
    return lib.llama_sampler_init_adaptive_p(cfg.adaptive_target, cfg.adaptive_decay, 7)


PEER_CONFIGS = {
    "mirostat-v1": SamplingConfig(mirostat=1, mirostat_tau=3.0, mirostat_eta=0.3),
    "mirostat-v2": SamplingConfig(mirostat=2, mirostat_tau=3.0, mirostat_eta=0.3),
    "mirostat-v2-default": SamplingConfig(mirostat=2),
    "adaptive-p": SamplingConfig(adaptive_target=0.3, adaptive_decay=0.5),
    "adaptive-p-low": SamplingConfig(adaptive_target=0.05, adaptive_decay=0.9),
}


def stepped_rows(source: str, request: pytest.FixtureRequest) -> Tensor:
    """Twelve steps' logits, random rows from peaked to flat; or the default model's real ones
    after three prompts."""
    if source == "real":
        return request.getfixturevalue("real_logits")
    g = torch.Generator().manual_seed(0)
    return torch.randn(12, 300, generator=g) * torch.linspace(0.5, 4, 12).unsqueeze(-1)


@pytest.mark.parametrize("source", ["random", pytest.param("real", marks=pytest.mark.model)])
@pytest.mark.parametrize("name", list(PEER_CONFIGS))
def test_state_and_kept_sets_follow_llama_cpp_step_by_step(request, source: str, name: str) -> None:
    """The peer draws with its own generator; its token is fed to ours, so every later step
    compares the two states through what they keep (and adaptive-p's logits themselves)."""
    import llama_cpp as lib

    cfg = PEER_CONFIGS[name]
    stage = "mirostat" if cfg.mirostat else "adaptive_p"
    rows = stepped_rows(source, request)
    sampler, state = peer(cfg, rows.shape[-1]), carried.initial_state(cfg, 1, CPU)
    truncated = 0
    try:
        for row in rows:
            theirs, chosen = llama_cpp_step(sampler, row, accept=stage == "adaptive_p")
            out, states = carried.apply_carried(stage, row[None], None, rows.shape[-1], state, None, cfg)
            ids = kept(out)
            assert set(ids) == set(theirs)
            truncated += len(ids) < rows.shape[-1]
            mine, peers = torch.tensor([out[0, i].item() for i in ids]), torch.tensor([theirs[i] for i in ids])
            # float32 softmax sums in another order: over 49k real logits p differs by ~1e-5, which
            # adaptive-p's slope (up to ~100 per unit of p) turns into up to ~1e-2 in a logit.
            close = 1e-2 if source == "real" else 2e-5
            torch.testing.assert_close(mine, peers, rtol=1e-5, atol=close)
            torch.testing.assert_close(mine.softmax(-1), peers.softmax(-1), rtol=1e-3, atol=1e-5)
            state = carried.observe(stage, states, row[None], out, None, torch.tensor([chosen]), cfg)
    finally:
        lib.llama_sampler_free(sampler)
    assert stage == "adaptive_p" or truncated > len(rows) // 2  # mirostat really truncated


@pytest.fixture(scope="module")
def real_logits(default_lm) -> Tensor:
    rows = []
    with torch.inference_mode():
        for prompt in ("Once upon a time", "The capital of France is", "def fibonacci(n):"):
            ids = default_lm.tokenizer(prompt, return_tensors="pt").input_ids
            rows.append(default_lm.model(ids).logits[0, -1].float())
    return torch.stack(rows)


# --- the state along a speculative row ----------------------------------------------------------


@pytest.mark.parametrize("name", ["mirostat-v1", "mirostat-v2", "adaptive-p"])
def test_a_rows_positions_see_the_state_after_the_drafts_before_them(name: str) -> None:
    """Verification's one chain call over a row's positions (``prefixes``) gives each position
    what the chain gives it one draw at a time, its state advanced by the drafts before it."""
    cfg = PEER_CONFIGS[name].with_overrides(temperature=0.8)
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 50, generator=g) * 3
    drafts = [7, 3, 11]
    start = TokenHistory.for_config(torch.tensor([[1, 2]]), 50, cfg)
    together = sampler_chain(logits, start.prefixes(torch.tensor(drafts), drafts), cfg)
    history = start
    for j in range(4):
        alone = sampler_chain(logits[j : j + 1], history, cfg)
        torch.testing.assert_close(together.probs[j : j + 1], alone.probs)
        torch.testing.assert_close(together.states[j : j + 1], history.state)
        if j < 3:
            token = torch.tensor([drafts[j]])
            history = history.advanced(token, [drafts[j]], alone.state_after(token, cfg))
    # Two rows stacked keep their own states: the second row's first position starts afresh.
    both = TokenHistory.stack([start.prefixes(torch.tensor(drafts), drafts), start.prefixes(torch.tensor(drafts), drafts)])
    stacked = sampler_chain(torch.cat([logits, logits]), both, cfg)
    torch.testing.assert_close(stacked.probs, torch.cat([together.probs, together.probs]))


# --- the settings -------------------------------------------------------------------------------


def test_mirostat_replaces_the_stages_after_the_temperature() -> None:
    cfg = SamplingConfig(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05, mirostat=2)
    assert [info.name for info in chain_of(cfg)] == ["raw", "penalties", "temperature", "mirostat"]
    assert [info.name for info in chain_of(cfg.with_overrides(temperature=0.0))] == ["raw", "penalties", "greedy"]
    adaptive = SamplingConfig(min_p=0.05, adaptive_target=0.5)
    assert [info.name for info in chain_of(adaptive)][-2:] == ["min_p", "adaptive_p"]
    assert not SamplingConfig(temperature=0.0, mirostat=1).carries_state


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"mirostat": 3}, "mirostat: must be 0 (off), 1 or 2"),
        ({"mirostat": True}, "mirostat: expected an integer"),
        ({"mirostat_tau": -1.0}, "mirostat_tau: must be >= 0"),
        ({"mirostat_eta": 1.5}, "mirostat_eta: must be in [0, 1]"),
        ({"adaptive_target": 1.2}, "adaptive_target: must be in [0, 1], or negative"),
        ({"adaptive_decay": 0.995}, "adaptive_decay: must be in [0, 0.99]"),
        ({"mirostat": 2, "adaptive_target": 0.5}, "adaptive-p and mirostat both choose the token"),
        ({"mirostat": 1, "samplers": "top_k"}, "mirostat replaces the stages after the temperature"),
        ({"adaptive_target": 0.5, "xtc_probability": 0.5}, "adaptive-p and XTC both choose"),
    ],
)
def test_bad_settings_are_refused(values: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        SamplingConfig.from_mapping(values)
    assert fragment in str(info.value)


def test_the_flags_reach_the_chain_and_a_bad_combination_is_one_line(tiny_model_dir: Path) -> None:
    args = ["generate", "-m", str(tiny_model_dir), "--raw", "-p", "w4 w5", "-n", "4", "--seed", "1", "-q",
            "--format", "jsonl", "--temperature", "1"]  # fmt: skip
    runner = CliRunner()
    done = runner.invoke(main, [*args, "--mirostat", "2", "--mirostat-tau", "1", "--mirostat-eta", "0.5"])
    assert done.exit_code == 0, done.output
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert any(record.get("removed", {}).get("mirostat") for record in records)
    adaptive = runner.invoke(main, [*args, "--adaptive-target", "0.2", "--adaptive-decay", "0.5"])
    assert adaptive.exit_code == 0, adaptive.output
    bad = runner.invoke(main, [*args, "--mirostat", "1", "--adaptive-target", "0.3"])
    assert bad.exit_code == 2 and bad.stdout == ""
    assert "both choose the token" in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr
