"""The summary record's JSONL schema, pinned: the typed run facts flatten to exactly the keys
(and nesting) the records had when they were a string-keyed bag."""

from __future__ import annotations

import json

from llmsample.events import PlainComparison, ReferenceSummary, RunFacts, Speculation, Summary

BASE_KEYS = {
    "type", "text", "tokens", "prompt_tokens", "stop_reason", "ttft_s", "tokens_per_s", "model", "preset", "seed",
    "elapsed_s",
}  # fmt: skip


def summary(facts: RunFacts) -> dict:
    record = Summary("hi", 4, 3, "length", 0.1, 9.5, "m", "p", 7, 0.5, facts=facts).to_dict()
    json.dumps(record, allow_nan=False)  # strict JSON
    return record


def test_a_plain_run_has_device_and_dtype_only() -> None:
    record = summary(RunFacts(device="cpu", dtype="float32"))
    assert set(record) == BASE_KEYS | {"device", "dtype"}
    assert record["type"] == "summary" and record["device"] == "cpu" and record["dtype"] == "float32"


def test_every_section_flattens_to_its_old_keys() -> None:
    facts = RunFacts(
        device="cuda:0",
        dtype="bfloat16",
        backend="transformers",
        quantization="torchao",
        model_file="m.gguf",
        device_map=("cuda:0", "cpu"),
        compile_s=12.5,
        speculation=Speculation(drafted=10, accepted=6, target_passes=4, tokens_per_pass=2.5),
        reference=ReferenceSummary("float32", 4, 0.01, 0.03, 0.75),
        comparison=PlainComparison(20.0, 1.5, 1.8),
    )
    record = summary(facts)
    assert set(record) - BASE_KEYS == {
        "device", "dtype", "backend", "quantization", "model_file", "device_map", "compile_s", "drafted", "accepted", "acceptance_rate",
        "target_passes", "tokens_per_pass", "reference", "plain_tokens_per_s", "plain_elapsed_s", "speedup",
    }  # fmt: skip
    assert record["device_map"] == ["cuda:0", "cpu"] and record["acceptance_rate"] == 0.6
    assert record["reference"] == {"dtype": "float32", "tokens": 4, "mean_kl": 0.01, "max_kl": 0.03, "same_top": 0.75}
    assert (record["plain_tokens_per_s"], record["plain_elapsed_s"], record["speedup"]) == (20.0, 1.5, 1.8)


def test_a_run_that_loaded_its_model_says_how_long_the_load_took() -> None:
    assert summary(RunFacts(load_s=2.5))["load_s"] == 2.5
    assert "load_s" not in summary(RunFacts())


def test_a_comparison_without_a_speed_has_no_speedup_key() -> None:
    record = summary(RunFacts(comparison=PlainComparison(None, 0.2)))
    assert "speedup" not in record and record["plain_tokens_per_s"] is None


def test_no_drafts_give_a_zero_rate_not_a_division() -> None:
    assert Speculation().acceptance_rate == 0.0


def test_a_token_record_is_its_fields_as_asdict_gives_them() -> None:
    """The hand-built record against ``dataclasses.asdict`` (the definition it replaced, for speed):
    the same keys in the same order, so JSON lines keep their bytes; ``watch`` and ``reference``
    only where a run asked for them."""
    from dataclasses import asdict

    from llmsample.events import Candidate, ReferenceFigures, TokenEvent, Watched

    top = (Candidate(5, " w5", 0.5, 0.25), Candidate(7, "\n", 0.125, 1 / 3))
    plain = TokenEvent(3, 5, " w5", 0.5, 0.25, 2, 1.5, top, {"top_k": 30, "top_p": 2}, "draft", True)
    full = TokenEvent(3, 5, " w5", 0.5, 0.25, 2, 1.5, top, {}, watch={"w7": Watched(7, 0.125, 1 / 3, 4)},
                      reference=ReferenceFigures(0.01, False, 0.3))  # fmt: skip
    for event in (plain, full):
        expected = {"type": "token", **asdict(event)}
        for key in ("watch", "reference"):
            if not expected[key]:
                del expected[key]
        assert json.dumps(event.to_dict()) == json.dumps(expected)
        assert event.to_dict() == expected
    assert "watch" not in plain.to_dict() and "reference" not in plain.to_dict()
