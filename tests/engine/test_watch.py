"""``--watch``: named tokens' probabilities at every step, in every loop and every view."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from llmsample.cli import main
from llmsample.engine.continuous_batch import BatchItem, decode_batch
from llmsample.engine.loop import generate, run_to_end
from llmsample.engine.prompt import encode_prompt
from llmsample.engine.speculative import ModelDrafter, NgramDrafter
from llmsample.events import RunStats, Summary
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import sampler_chain
from llmsample.sampling.vocabulary import Vocabulary

PROMPT = "w4 w8 w15 w16 w23 w4 w8 w15"


def resolve(lm, *texts: str) -> list[tuple[str, int]]:
    vocabulary = Vocabulary.of(lm.tokenizer, lm.model.config.vocab_size, lm.eos_ids)
    return [(text, vocabulary.token_id(text)) for text in texts]


def plain(lm, cfg: SamplingConfig, watch):
    ids = encode_prompt(lm, PROMPT, raw=True)
    return run_to_end(generate(lm, ids, cfg, RunStats("t", "t", cfg.seed), ignore_eos=True, watch=watch))


def test_watched_numbers_are_the_chains_at_each_step(tiny_lm) -> None:
    cfg = SamplingConfig(temperature=0.7, top_k=5, max_tokens=12, seed=4)
    first, _ = plain(tiny_lm, cfg, [])
    watch = resolve(tiny_lm, str(first[0].token_id), "w5", "w9")
    tokens, _ = plain(tiny_lm, cfg, watch)
    assert [t.token_id for t in tokens] == [t.token_id for t in first]  # watching changes nothing
    ids = encode_prompt(tiny_lm, PROMPT, raw=True)
    vocab = tiny_lm.model.config.vocab_size
    with torch.inference_mode():
        for event in tokens:
            # recomputed from scratch: a full forward pass and the pipeline's own chain
            logits = tiny_lm.model(ids).logits[:, -1].float()
            history = TokenHistory.for_config(ids, vocab, cfg, tiny_lm.tokenizer, tiny_lm.eos_ids)
            chain = sampler_chain(logits, history, cfg)
            model_probs = logits.softmax(-1)[0]
            assert list(event.watch) == [name for name, _ in watch]
            for name, token in watch:
                seen = event.watch[name]
                assert seen.token_id == token
                assert seen.prob == pytest.approx(float(chain.probs[0, token]), abs=1e-5)
                assert seen.model_prob == pytest.approx(float(model_probs[token]), abs=1e-5)
                assert seen.model_rank == int((logits[0] > logits[0, token]).sum()) + 1
                if token == event.token_id:  # the sampled token: the event's own numbers
                    assert seen.prob == pytest.approx(event.prob, abs=1e-7)
                    assert seen.model_rank == event.model_rank
                for candidate in event.top:  # and a top candidate's
                    if candidate.token_id == token:
                        assert seen.prob == pytest.approx(candidate.prob, abs=1e-7)
                        assert seen.model_prob == pytest.approx(candidate.model_prob, abs=1e-7)
            ids = torch.cat([ids, torch.tensor([[event.token_id]])], dim=1)
    # a filtered-out watched token has probability 0 in the sampling distribution, not under the model
    assert any(w.prob == 0 and w.model_prob > 0 for t in tokens for w in t.watch.values())


def assert_same_watch(got, expected) -> None:
    assert [t.token_id for t in got] == [t.token_id for t in expected]
    for mine, theirs in zip(got, expected, strict=True):
        assert list(mine.watch) == list(theirs.watch)
        for name, seen in mine.watch.items():
            other = theirs.watch[name]
            assert seen.token_id == other.token_id and seen.model_rank == other.model_rank
            assert seen.prob == pytest.approx(other.prob, abs=1e-5)
            assert seen.model_prob == pytest.approx(other.model_prob, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_speculation_carries_the_plain_watch_values(tiny_lm, drafter: str) -> None:
    cfg = SamplingConfig(temperature=0, max_tokens=30)
    watch = resolve(tiny_lm, "w5", "w16", "3")
    expected, _ = plain(tiny_lm, cfg, watch)
    made = ModelDrafter(tiny_lm, 32) if drafter == "model" else NgramDrafter(32, torch.device("cpu"), 1, 3)
    ids = encode_prompt(tiny_lm, PROMPT, raw=True)
    events = generate(tiny_lm, ids, cfg, RunStats("t", "t", None), drafter=made, draft_tokens=3, ignore_eos=True,
                                  watch=watch)  # fmt: skip
    tokens, _ = run_to_end(events)
    assert {t.source for t in tokens} == {"draft", "target"}  # both kinds of row are checked
    assert_same_watch(tokens, expected)


def test_batch_rows_carry_the_plain_watch_values(tiny_lm) -> None:
    watch = resolve(tiny_lm, "w5", "w16")
    prompts = [PROMPT, "w3 w4", "w8"]
    items = []
    for i, prompt in enumerate(prompts):
        cfg = SamplingConfig(temperature=0, max_tokens=6 + 2 * i)
        ids = encode_prompt(tiny_lm, prompt, raw=True)[0].tolist()
        items.append(BatchItem(i, ids, cfg, RunStats("t", "t", None)))
    got: dict[int, list] = {i: [] for i in range(len(prompts))}
    for key, record in decode_batch(tiny_lm, items, 2, ignore_eos=True, watch=watch):
        if not isinstance(record, Summary):
            got[key].append(record)
    for item in items:
        ids = torch.tensor([item.prompt_ids])
        expected, _ = run_to_end(generate(tiny_lm, ids, item.cfg, RunStats("t", "t", None), ignore_eos=True,
                                          watch=watch))  # fmt: skip
        assert_same_watch(got[item.key], expected)


# --- the command line and the views ---------------------------------------------------------------


def args(model: Path, *extra: str) -> list[str]:
    return ["generate", "-m", str(model), "--raw", "-p", "w3 w4", "-n", "8", "--seed", "2", "--device", "cpu",
            "-q", "--ignore-eos", *extra]  # fmt: skip


def strict(line: str) -> dict:
    def refuse(constant: str) -> None:
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(line, parse_constant=refuse)


def test_jsonl_inspect_and_html_show_the_watched_tokens(tiny_model_dir: Path, tmp_path: Path) -> None:
    page = tmp_path / "view.html"
    result = CliRunner().invoke(
        main, args(tiny_model_dir, "--watch", "w5", "--watch", "7", "--format", "jsonl", "--html", str(page))
    )
    assert result.exit_code == 0, result.output
    records = [strict(line) for line in result.stdout.splitlines()]
    tokens = [r for r in records if r["type"] == "token"]
    assert len(tokens) == 8
    for record in tokens:
        assert list(record["watch"]) == ["w5", "7"]
        assert record["watch"]["7"]["token_id"] == 7
        for seen in record["watch"].values():
            assert set(seen) == {"token_id", "prob", "model_prob", "model_rank"}
            assert 0 <= seen["prob"] <= 1 and 0 < seen["model_prob"] <= 1 and seen["model_rank"] >= 1
            if seen["token_id"] == record["token_id"]:
                assert seen["prob"] == pytest.approx(record["prob"])
    document = page.read_text()
    assert document.count("<svg") == 2 and document.count("<polyline") == 2
    assert 'data-watch="w5"' in document and 'data-watch="7"' in document and "<script" not in document
    assert '<pre class="prompt">w3 w4</pre>' in document and "<td>seed</td><td>2</td>" in document  # what was asked
    plain_run = CliRunner().invoke(main, args(tiny_model_dir, "--format", "jsonl"))
    assert all("watch" not in strict(line) for line in plain_run.stdout.splitlines())  # only with --watch
    table = CliRunner().invoke(main, args(tiny_model_dir, "--watch", "w5", "--watch", "7", "--inspect", "--no-color"))
    assert table.exit_code == 0, table.output
    header = next(line for line in table.stdout.splitlines() if "p model" in line)
    assert "p w5" in header and "p 7" in header
    first = next(line for line in table.stdout.splitlines() if line.lstrip().startswith("0 "))
    assert f"{tokens[0]['watch']['w5']['prob']:.3f}" in first.split()[-2:]


def test_a_watch_that_is_not_one_token_is_one_line_and_exit_2(tiny_model_dir: Path) -> None:
    for bad, reason in (("w5 w6", "encodes to 2 tokens"), ("99999", "outside the vocabulary")):
        result = CliRunner().invoke(main, args(tiny_model_dir, "--watch", bad))
        assert result.exit_code == 2, result.output
        assert result.stdout == ""
        message = result.stderr.strip()
        assert "--watch" in message and reason in message and len(message.splitlines()) == 1


def test_explain_shows_the_watched_rows(tiny_model_dir: Path) -> None:
    base = ["explain", "-m", str(tiny_model_dir), "--raw", "-p", "w3 w4", "--device", "cpu", "-q", "--top-n", "2"]
    without = strict(CliRunner().invoke(main, [*base, "--format", "jsonl"]).stdout)
    shown = {c["token_id"] for c in without["candidates"]}
    absent = next(t for t in range(5, 32) if t not in shown)
    result = CliRunner().invoke(main, [*base, "--format", "jsonl", "--watch", str(absent)])
    assert result.exit_code == 0, result.output
    report = strict(result.stdout)
    assert [c["token_id"] for c in report["candidates"]] == [*[c["token_id"] for c in without["candidates"]], absent]
    text = CliRunner().invoke(main, [*base, "--no-color", "--watch", "w9"])
    assert text.exit_code == 0, text.output
    rows = [line.split()[0] for line in text.stdout.splitlines() if line.strip()]
    assert "w9" in rows or "·w9" in rows
