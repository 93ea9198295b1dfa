"""``llmsample.Engine`` on a tiny model: the CLI's tokens for the same seed, batch rows equal to
runs alone, a stream cut short, explain's report, settings checked as the CLI checks its flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import llmsample
from llmsample.cli import main


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> llmsample.Engine:
    return llmsample.Engine(model=str(tiny_model_dir), backend="transformers")


def cli_records(*args: str) -> list[dict]:
    done = CliRunner().invoke(main, ["generate", "--format", "jsonl", "--local", "--no-log", *args],
                              catch_exceptions=False)  # fmt: skip
    assert done.exit_code == 0, done.output
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.parametrize(
    "settings, flags",
    [
        ({}, []),
        ({"preset": "creative", "top_k": 7, "max_tokens": 9}, ["--preset", "creative", "--top-k", "7", "-n", "9"]),
        ({"draft": "ngram", "max_tokens": 12}, ["--draft", "ngram", "-n", "12"]),
        ({"watch": ["w5"], "ignore_eos": True, "top_n": 3}, ["--watch", "w5", "--ignore-eos", "--top-n", "3"]),
    ],
)
def test_the_same_seed_gives_the_clis_records(
    engine: llmsample.Engine, tiny_model_dir: Path, settings: dict, flags: list[str]
) -> None:
    result = engine.generate("w3 w4 w5", raw=True, seed=11, **settings)
    records = cli_records("-m", str(tiny_model_dir), "--raw", "-p", "w3 w4 w5", "--seed", "11", *flags)
    assert result.tokens == records[:-1]
    summary = records[-1]
    assert (result.summary.seed, result.summary.text, result.summary.tokens) == (11, summary["text"], summary["tokens"])
    assert result.text == summary["text"]


def test_a_fresh_seed_is_drawn_and_reported(engine: llmsample.Engine) -> None:
    first = engine.generate("w3", raw=True, max_tokens=8)
    again = engine.generate("w3", raw=True, max_tokens=8, seed=first.summary.seed)
    assert first.tokens == again.tokens and isinstance(first.summary.seed, int)


def test_batch_rows_equal_each_prompt_alone(engine: llmsample.Engine) -> None:
    prompts = ["w3 w4 w5", "w9", "w6 w7"]
    together = engine.batch(prompts, raw=True, seed=5, max_tokens=10, preset="creative")
    alone = [engine.generate(prompt, raw=True, seed=5, max_tokens=10, preset="creative") for prompt in prompts]
    ids = lambda result: [token["token_id"] for token in result.tokens]  # noqa: E731
    assert [ids(r) for r in together] == [ids(r) for r in alone]  # the figures to rounding: rows share passes
    for a, b in zip(together, alone, strict=True):
        assert [t["prob"] for t in a.tokens] == pytest.approx([t["prob"] for t in b.tokens], rel=1e-4)


def test_a_stream_left_early_has_no_result_and_the_engine_goes_on(engine: llmsample.Engine) -> None:
    stream = engine.stream("w3", raw=True, seed=1, max_tokens=30, ignore_eos=True)
    seen = [token.text for _, token in zip(range(3), stream, strict=False)]
    assert len(seen) == 3 and stream.result is None
    full = engine.stream("w3", raw=True, seed=1, max_tokens=30, ignore_eos=True)
    assert [token.text for token in full][:3] == seen and full.result is not None and full.result.summary.tokens == 30


def test_explain_gives_the_chain_and_scores_a_continuation(engine: llmsample.Engine) -> None:
    report = engine.explain("w3 w4", raw=True, top_k=3)
    assert report.kept["top_k"] == 3 and len(report.candidates) == 10
    scored = engine.explain("w3 w4", "w5 w6", raw=True)
    assert [token.text for token in scored] == [" w5", " w6"] or len(scored) == 2


@pytest.mark.parametrize(
    "settings, words",
    [
        ({"temperature": -1}, "temperature"),
        ({"bogus": 1}, "'bogus' is not a setting"),
        ({"preset": "no-such-preset"}, "no-such-preset"),
        ({"draft": "suffix"}, "draft='suffix'"),
    ],
)
def test_a_bad_setting_is_a_value_error_naming_it(engine: llmsample.Engine, settings: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        engine.job("w3", **settings)


def test_status_names_the_model_and_what_it_can_do(engine: llmsample.Engine, tiny_model_dir: Path) -> None:
    status = engine.status()
    assert status["model"] == str(tiny_model_dir) and status["backend"] == "transformers"
    assert status["capabilities"] == [] and status["chat_template"] is False


def test_the_html_view_is_the_html_page_in_a_frame(engine: llmsample.Engine, tmp_path: Path) -> None:
    """The page is ``--html``'s own (the same renderer): written by the CLI for the same run, it
    equals the result's, and the frame holds it escaped once more."""
    import html

    result = engine.generate("w3 w4", raw=True, seed=2, max_tokens=6)
    page = tmp_path / "run.html"
    done = CliRunner().invoke(main, ["generate", "--local", "--no-log", "-m", engine.model, "--raw", "-p", "w3 w4",
                                     "--seed", "2", "-n", "6", "--html", str(page), "--quiet"])  # fmt: skip
    assert done.exit_code == 0, done.output
    strip = lambda text: text.split('<p class="meta">')[1].split("</p>", 1)[1]  # noqa: E731  (the meta line has timings)
    assert strip(result.html()) == strip(page.read_text())
    frame = result._repr_html_()
    assert frame.startswith('<iframe srcdoc="') and html.escape(result.html()) in frame
