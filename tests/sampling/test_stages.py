"""The stage table against the code it describes: the chain runs its rows in order, each stage
reads exactly the history the table says, only the filters remove candidates, and every filter
has a letter for ``--inspect``."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import APPLY, sampler_chain
from llmsample.sampling.stages import BY_NAME, FILTER_STAGES, STAGES, chain_of, needs_sequences, needs_vocabulary
from llmsample.sampling.vocabulary import Vocabulary
from tests.sampling.test_samplers import EVERYTHING, TEXTS, TOKENIZER

EXAMPLES: dict[str, dict[str, Any]] = {  # settings that switch an optional stage on
    "logit_bias": {"logit_bias": (("0", -5.0), ("1", 2.0))},
    "ban": {"ban": ("As an AI", "delve")},
    "min_tokens": {"min_tokens": 10_000, "stop": ("\n\n",)},
    "reasoning_budget": {"reasoning_budget": 4},
    "dry": {"dry_multiplier": 0.8},
    "top_n_sigma": {"top_n_sigma": 1.0},
    "typical_p": {"typical_p": 0.9},
    "xtc": {"xtc_probability": 0.5},
    "no_repeat_ngram": {"no_repeat_ngram_size": 2},
    "smoothing": {"smoothing_factor": 0.3},
    "epsilon": {"epsilon_cutoff": 0.01},
    "eta": {"eta_cutoff": 0.01},
    "top_h": {"top_h": 0.5},
    "top_a": {"top_a": 0.2},
    "p_less": {"p_less": True},
}
OPTIONAL = [BY_NAME[name] for name in EXAMPLES]
PROMPT = torch.tensor([[1, 2, 7, 1, 2]])


def switched_on(name: str) -> SamplingConfig:
    return SamplingConfig.from_mapping(EXAMPLES[name])


def test_every_stage_after_raw_has_its_function() -> None:
    assert STAGES[0].name == "raw"
    assert set(APPLY) == {info.name for info in STAGES[1:]}
    assert len(BY_NAME) == len(STAGES)


@pytest.mark.parametrize(
    "cfg",
    [SamplingConfig(), SamplingConfig(temperature=0), EVERYTHING, EVERYTHING.with_overrides(temperature=0)]
    + [switched_on(info.name) for info in OPTIONAL],
)
def test_the_chain_runs_the_tables_stages_in_its_order(cfg: SamplingConfig) -> None:
    history = TokenHistory.for_config(PROMPT, len(TEXTS), cfg, TOKENIZER, eos_ids=[0])
    names = sampler_chain(torch.randn(1, len(TEXTS)), history, cfg).names
    assert names == tuple(info.name for info in chain_of(cfg))
    order = [info.name for info in STAGES]
    assert [order.index(n) for n in names] == sorted(order.index(n) for n in names)


@pytest.mark.parametrize("info", OPTIONAL, ids=lambda info: info.name)
def test_an_example_switches_its_stage_on_and_the_config_keeps_what_it_reads(info) -> None:
    default, cfg = SamplingConfig(), switched_on(info.name)
    assert not info.on(default) and info.on(cfg)
    assert needs_sequences(cfg) == info.needs_sequences
    assert needs_vocabulary(cfg) == info.needs_vocabulary


@pytest.mark.parametrize("info", STAGES[1:], ids=lambda info: info.name)
def test_each_stage_reads_exactly_the_history_the_table_says(info) -> None:
    cfg = switched_on(info.name) if info.name in EXAMPLES else EVERYTHING
    vocabulary = Vocabulary.of(TOKENIZER, len(TEXTS), [0])
    logits = torch.randn(1, len(TEXTS), generator=torch.Generator().manual_seed(0))
    for sequences in (False, True):
        for vocab in (None, vocabulary):
            history = TokenHistory.start(PROMPT, len(TEXTS), sequences=sequences, vocabulary=vocab)
            lacks = (info.needs_sequences and not sequences) or (info.needs_vocabulary and vocab is None)
            if lacks:
                with pytest.raises(ValueError, match="needs a history"):
                    APPLY[info.name](logits, history, cfg)
            else:
                APPLY[info.name](logits, history, cfg)


@pytest.mark.parametrize("info", [i for i in STAGES[1:] if not i.removes and i.name != "greedy"], ids=lambda i: i.name)
def test_only_the_filters_remove_candidates(info) -> None:
    # the step figures count removals at the filters alone: any other stage must keep what came in
    cfg = (switched_on(info.name) if info.name in EXAMPLES else EVERYTHING).with_overrides(
        repetition_penalty=1e-40, frequency_penalty=2.0, temperature=2e-4
    )
    history = TokenHistory.for_config(PROMPT.expand(3, -1), len(TEXTS), cfg, TOKENIZER, eos_ids=[0])
    logits = torch.randn(3, len(TEXTS), generator=torch.Generator().manual_seed(1)) * 1e35
    logits[:, 4] = -math.inf
    after = APPLY[info.name](logits, history, cfg)
    assert torch.equal(torch.isfinite(after), torch.isfinite(logits))


def test_every_filter_has_its_own_letter_and_every_stage_a_label() -> None:
    filters = [info for info in STAGES if info.removes]
    assert tuple(info.name for info in filters) == FILTER_STAGES
    assert all(info.letter and info.legend for info in filters)
    assert len({info.letter for info in filters}) == len(filters)
    assert not any(info.letter or info.legend for info in STAGES if not info.removes)
    assert len({info.label for info in STAGES}) == len(STAGES) and all(info.label for info in STAGES)
