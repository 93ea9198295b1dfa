"""``samplers``: the order of the stages after the history ones, per run and per request, as
llama-server's ``samplers`` and text-generation-webui's ``sampler_priority``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from llmsample.cli import main
from llmsample.sampling.config import SAMPLER_ORDER, ConfigError, SamplingConfig
from llmsample.sampling.history import NO_HISTORY
from llmsample.sampling.pipeline import sampler_chain
from llmsample.sampling.stages import STAGES
from tests.sampling.test_samplers import EVERYTHING, TEXTS, history_of

LOGITS = torch.tensor([[0.5, 0.3, 0.2]]).log()


def kept(logits: torch.Tensor) -> set[int]:
    return set(torch.nonzero(logits[0] > -math.inf).flatten().tolist())


def test_the_default_order_is_the_tables() -> None:
    table = [info.name for info in STAGES if info.name in SAMPLER_ORDER]
    assert tuple(table) == SAMPLER_ORDER
    everything = EVERYTHING.with_overrides(samplers=list(SAMPLER_ORDER))
    history = history_of([1, 2, 7, 1], [2], EVERYTHING)
    logits = torch.randn(1, len(TEXTS), generator=torch.Generator().manual_seed(0))
    default, listed = sampler_chain(logits, history, EVERYTHING), sampler_chain(logits, history, everything)
    assert default.names == listed.names
    assert torch.equal(default.probs, listed.probs)


def test_min_p_before_the_temperature_keeps_fewer_by_hand() -> None:
    # min-p 0.5 first: threshold .25 of [.5, .3, .2] keeps two. A temperature of 2 first flattens
    # them to [.41, .32, .26] (square roots, renormalised): threshold .205 keeps all three.
    first = SamplingConfig(temperature=2.0, min_p=0.5, samplers="min_p,temperature")
    assert sampler_chain(LOGITS, NO_HISTORY, first).names == ("raw", "penalties", "min_p", "temperature")
    assert kept(sampler_chain(LOGITS, NO_HISTORY, first).final) == {0, 1}
    flattened = torch.tensor([0.5, 0.3]).sqrt()  # a temperature of 2 on the two kept
    torch.testing.assert_close(
        sampler_chain(LOGITS, NO_HISTORY, first).probs[0], torch.cat([flattened / flattened.sum(), torch.zeros(1)])
    )
    after = SamplingConfig(temperature=2.0, min_p=0.5, samplers="temperature,min_p")
    assert kept(sampler_chain(LOGITS, NO_HISTORY, after).final) == {0, 1, 2}


def test_history_stages_run_first_whatever_the_list_says() -> None:
    cfg = SamplingConfig(temperature=1.5, top_k=5, ban=("w7",), samplers=["top_k", "penalties", "dry", "temperature"])
    history = history_of([1, 2], [], cfg)
    names = sampler_chain(torch.randn(1, len(TEXTS)), history, cfg).names
    assert names == ("raw", "ban", "penalties", "top_k", "temperature")


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"top_p": 0.9, "samplers": "top_k"}, "samplers: top_p is set but not listed"),
        ({"temperature": 0.7, "samplers": "top_k"}, "samplers: temperature is set but not listed"),
        ({"samplers": "top_k,xtc,min_p"}, "xtc samples a mixture of two branches: it must come last"),
        ({"samplers": "top_k,tfs"}, "unknown stage 'tfs'"),
        ({"samplers": "top_k;top_k"}, "'top_k' is listed twice"),
        ({"samplers": 3}, "expected a list of stage names"),
    ],
)
def test_orders_that_would_not_mean_what_they_say_are_refused(values: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        SamplingConfig.from_mapping(values)


def test_peers_names_are_read() -> None:
    cfg = SamplingConfig(samplers=["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "temp"])
    assert cfg.samplers == ("top_n_sigma", "top_k", "typical_p", "top_p", "min_p", "temperature")
    tgwui = SamplingConfig(samplers=["dynamic_temperature", "quadratic_sampling", "epsilon_cutoff", "eta_cutoff"])
    assert tgwui.samplers == ("temperature", "smoothing", "epsilon", "eta")


def test_the_flag_reaches_the_chain_and_a_bad_one_is_one_line(tiny_model_dir: Path) -> None:
    args = ["generate", "-m", str(tiny_model_dir), "--raw", "-p", "w4 w5", "-n", "3", "--seed", "1", "-q",
            "--format", "jsonl", "--top-p", "1", "--top-k", "3", "--min-p", "0.3", "--temperature", "3"]  # fmt: skip
    runner = CliRunner()
    ordered = runner.invoke(main, [*args, "--samplers", "min_p,top_k,temperature"])
    assert ordered.exit_code == 0, ordered.output
    default = runner.invoke(main, args)
    first = json.loads(ordered.stdout.splitlines()[0])
    assert first["removed"]["min_p"] > json.loads(default.stdout.splitlines()[0])["removed"]["min_p"]
    bad = runner.invoke(main, [*args, "--samplers", "top_k,temperature"])
    assert bad.exit_code == 2 and bad.stdout == ""
    assert "--samplers: min_p is set but not listed" in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr
