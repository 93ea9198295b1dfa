"""compare-presets' logic without the CLI, on a tiny model: seeds, the greedy reference, the
per-preset aggregates against the per-sample metrics, and what an interruption keeps."""

from __future__ import annotations

import signal
import statistics
from typing import Any

import pytest

from llmsample.analysis import preset_comparison as comparing
from llmsample.analysis.preset_comparison import Comparison, aggregate, compare
from llmsample.analysis.text_metrics import cross_sample_diversity, mean_pairwise_overlap
from llmsample.engine import loop
from llmsample.engine.prompt import encode_prompt
from llmsample.errors import Interrupted
from llmsample.events import RunStats
from llmsample.sampling.config import SamplingConfig

CONFIGS = {
    "hot": SamplingConfig(temperature=1.5),
    "cold": SamplingConfig(temperature=0.0),
    "warm": SamplingConfig(temperature=0.8, top_k=10),
}
MEANS = ("tokens", "tokens_per_s", "mean_logprob", "perplexity", "mean_entropy", "distinct_1", "distinct_2",
         "repetition_rate")  # fmt: skip


@pytest.fixture(scope="module")
def prompt_ids(tiny_lm) -> Any:
    return encode_prompt(tiny_lm, "w3 w4", raw=True)


@pytest.fixture(scope="module")
def comparison(tiny_lm, prompt_ids) -> Comparison:
    return compare(tiny_lm, prompt_ids, CONFIGS, samples=3, seed=40, max_tokens=12)


def test_runs_in_preset_then_sample_order_with_seeds_s_plus_i(comparison: Comparison) -> None:
    assert comparison.exit_code == 0
    assert [(r.preset, r.sample, r.seed) for r in comparison.runs] == [
        (name, i, 40 + i) for name in CONFIGS for i in range(3)
    ]
    for run in comparison.runs:
        assert run.metrics.seed == run.summary.seed == run.seed and run.metrics.preset == run.preset
        assert run.summary.text == "".join(e.text for e in run.events) and not run.interrupted
        assert run.metrics.tokens == len(run.events) <= 12


def test_each_sample_is_the_preset_run_alone_with_its_seed(tiny_lm, prompt_ids, comparison: Comparison) -> None:
    for run in comparison.runs:
        cfg = SamplingConfig(**{**CONFIGS[run.preset].as_dict(), "stop": (), "max_tokens": 12, "seed": run.seed})
        alone, _ = loop.run_to_end(loop.generate(tiny_lm, prompt_ids, cfg, RunStats("t", run.preset, run.seed)))
        assert run.token_ids == [e.token_id for e in alone]


def test_divergence_is_measured_against_the_greedy_text(tiny_lm, prompt_ids, comparison: Comparison) -> None:
    greedy_cfg = SamplingConfig(temperature=0.0, max_tokens=12)
    reference, _ = loop.run_to_end(loop.generate(tiny_lm, prompt_ids, greedy_cfg, RunStats("t", "g", None)))
    assert comparison.greedy == [e.token_id for e in reference]
    for run in comparison.runs:
        index, ids, ref = run.metrics.divergence_index, run.token_ids, comparison.greedy
        if index is None:
            assert ids == ref
        else:  # the same up to the index, different (or one text over) at it
            assert ids[:index] == ref[:index] and ids[index : index + 1] != ref[index : index + 1]
    greedy_runs = [r for r in comparison.runs if r.preset == "cold"]
    assert all(r.token_ids == comparison.greedy and r.metrics.divergence_index is None for r in greedy_runs)
    assert any(r.metrics.divergence_index is not None for r in comparison.runs if r.preset == "hot")


def test_aggregates_are_the_means_of_the_samples(comparison: Comparison) -> None:
    aggregates = aggregate(comparison.runs)
    assert list(aggregates) == list(CONFIGS)
    for name, agg in aggregates.items():
        runs = [r for r in comparison.runs if r.preset == name]
        assert agg.preset == name and agg.samples == 3
        for key in MEANS:
            assert getattr(agg, key) == pytest.approx(statistics.fmean(getattr(r.metrics, key) for r in runs))
        token_lists = [r.token_ids for r in runs]
        assert agg.diversity == cross_sample_diversity(token_lists)
        assert agg.overlap == mean_pairwise_overlap(token_lists)
        assert agg.divergence == tuple(r.metrics.divergence_index for r in runs)
    greedy = aggregates["cold"]  # three identical texts: each bigram thrice, the same bigram sets
    assert greedy.overlap == 1.0 and greedy.mean_entropy == 0.0 and greedy.divergence == (None, None, None)
    assert greedy.diversity == pytest.approx(1 / 3 * greedy.distinct_2)


def test_one_sample_has_no_spread(tiny_lm, prompt_ids) -> None:
    single = compare(tiny_lm, prompt_ids, {"hot": CONFIGS["hot"]}, samples=1, seed=7, max_tokens=5)
    (agg,) = aggregate(single.runs).values()
    assert agg.diversity is None and agg.overlap is None and agg.samples == 1
    assert agg.tokens == single.runs[0].metrics.tokens


def test_a_missing_figure_is_left_out_of_the_mean(comparison: Comparison) -> None:
    import dataclasses

    runs = [r for r in comparison.runs if r.preset == "hot"]
    first = dataclasses.replace(runs[0], metrics=dataclasses.replace(runs[0].metrics, tokens_per_s=None))
    (agg,) = aggregate([first, *runs[1:]]).values()
    assert agg.tokens_per_s == pytest.approx(statistics.fmean(r.metrics.tokens_per_s for r in runs[1:]))
    nothing = [dataclasses.replace(r, metrics=dataclasses.replace(r.metrics, tokens_per_s=None)) for r in runs]
    assert aggregate(nothing)["hot"].tokens_per_s is None


@pytest.fixture
def no_signal_changes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The shutdown would ignore Ctrl-C for the rest of the test session: count it instead."""
    calls: list[int] = []
    monkeypatch.setattr(comparing, "ignore_further_interrupts", lambda: calls.append(1))
    return calls


@pytest.mark.parametrize(("raised", "code"), [(KeyboardInterrupt(), 130), (Interrupted(signal.SIGTERM), 143)])
def test_an_interruption_keeps_the_finished_presets(
    tiny_lm, prompt_ids, monkeypatch: pytest.MonkeyPatch, no_signal_changes: list[int], raised: Exception, code: int
) -> None:
    real_rows = loop.generate_rows

    def interrupted_rows(*args: Any, **kwargs: Any) -> Any:
        preset = args[3][0].preset  # the RunStats of the first row
        for n, item in enumerate(real_rows(*args, **kwargs)):
            if preset == "cold" and n == 2:  # the second preset, after two items
                raise raised
            yield item

    monkeypatch.setattr(loop, "generate_rows", interrupted_rows)
    done = compare(tiny_lm, prompt_ids, CONFIGS, samples=2, seed=0, max_tokens=6)
    assert done.exit_code == code and no_signal_changes == [1]
    assert [(r.preset, r.sample) for r in done.runs] == [("hot", 0), ("hot", 1), ("cold", 0), ("cold", 1)]
    assert not any(r.interrupted for r in done.runs[:2])
    cut = done.runs[2:]
    assert all(r.interrupted and r.summary.tokens == len(r.events) for r in cut)
    assert sum(len(r.events) for r in cut) == 2  # the two items it got before the interruption
    assert all(r.metrics.tokens == len(r.events) for r in cut)


@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated")  # the backend's call, seen by the wrapper
def test_a_greedy_preset_never_diverges_even_where_the_batch_shape_moves_the_numbers(
    tiny_lm, prompt_ids, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model whose numbers depend on how many rows a pass holds (as padding and matmul blocking
    make real ones, here made large): the greedy text of a batch of one is not that of a batch of
    three, and the reference is decoded as the presets' samples are, so a greedy preset keeps it."""
    forward = tiny_lm.model.forward

    def shape_dependent(*args: Any, **kwargs: Any) -> Any:
        out = forward(*args, **kwargs)
        out.logits[..., 7 + out.logits.shape[0]] += 50.0  # the favourite token follows the batch's rows
        return out

    monkeypatch.setattr(tiny_lm.model, "forward", shape_dependent)
    alone, _ = loop.run_to_end(loop.generate(tiny_lm, prompt_ids, SamplingConfig(temperature=0.0, max_tokens=4),
                                             RunStats("t", "g", None)))  # fmt: skip
    done = compare(tiny_lm, prompt_ids, {"cold": SamplingConfig(temperature=0.0)}, samples=3, seed=0, max_tokens=4)
    assert [e.token_id for e in alone] == [8] * 4  # one row throughout
    assert done.greedy == [8, 10, 10, 10]  # the prompt prefilled once (one row), then steps of three rows
    assert [run.metrics.divergence_index for run in done.runs] == [None] * 3


def test_an_interruption_during_the_greedy_run_keeps_nothing(
    tiny_lm, prompt_ids, monkeypatch: pytest.MonkeyPatch, no_signal_changes: list[int]
) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise Interrupted(signal.SIGHUP)

    monkeypatch.setattr(comparing, "greedy_reference", interrupted)
    done = compare(tiny_lm, prompt_ids, CONFIGS, samples=2, seed=0, max_tokens=6)
    assert done == Comparison([], [], 129) and no_signal_changes == [1]


def test_progress_advances_once_per_finished_preset(tiny_lm, prompt_ids) -> None:
    import contextlib

    seen: list[str] = []

    @contextlib.contextmanager
    def progress(total: int) -> Any:
        seen.append(f"start {total}")
        yield lambda: seen.append("done")
        seen.append("end")

    compare(tiny_lm, prompt_ids, CONFIGS, samples=1, seed=0, max_tokens=3, progress=progress)
    assert seen == ["start 3", "done", "done", "done", "end"]
