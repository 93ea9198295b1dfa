"""``llmsample compare-models`` end to end on tiny models: JSONL, text, HTML, refusals, and one
run in a real terminal."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pexpect
import pytest
from click.testing import CliRunner

from llmsample.cli import main
from tests.conftest import REPO, cli_env, make_tiny_model

DRIFT_KEYS = {"type", "index", "token_id", "text", "prob_a", "prob_b", "kl", "same_top", "top_a", "top_b"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """Two different random models with the same tokenizer."""
    root = tmp_path_factory.mktemp("pair")
    return str(make_tiny_model(root / "a", seed=0)), str(make_tiny_model(root / "b", seed=1))


def invoke(*args: str, input: str | None = None, **env: str):
    return CliRunner().invoke(main, ["compare-models", *args], input=input, env=env, catch_exceptions=False)


def records(stdout: str) -> tuple[list[dict], dict]:
    lines = [json.loads(line) for line in stdout.splitlines()]
    return lines[:-1], lines[-1]


def test_generated_by_a_jsonl(pair: tuple[str, str]) -> None:
    a, b = pair
    base = ("-m", a, "-m", b, "--raw", "-p", "w3 w4", "-n", "10", "--seed", "4", "--device", "cpu", "-q")
    result = invoke(*base, "--format", "jsonl")
    assert result.exit_code == 0, result.output
    tokens, summary = records(result.stdout)
    assert len(tokens) == summary["tokens"] >= 1
    for i, token in enumerate(tokens):
        assert set(token) == DRIFT_KEYS and token["type"] == "drift" and token["index"] == i
        assert set(token["top_a"]) == {"token_id", "text", "prob"}
        assert token["kl"] >= 0 and 0 <= token["prob_a"] <= 1 and 0 <= token["prob_b"] <= 1
        assert token["same_top"] == (token["top_a"]["token_id"] == token["top_b"]["token_id"])
    assert summary["type"] == "summary" and summary["source"] == "generated" and summary["kl_unit"] == "nats"
    assert summary["model_a"] == a and summary["model_b"] == b
    assert summary["seed"] == 4 and summary["preset"] == "balanced" and summary["stop_reason"] in ("eos", "length")
    assert summary["mean_kl"] == pytest.approx(sum(t["kl"] for t in tokens) / len(tokens))
    assert summary["mean_kl"] > 0.01  # two different random models
    assert summary["same_top_rate"] == pytest.approx(sum(t["same_top"] for t in tokens) / len(tokens))
    assert 0 <= summary["expected_acceptance"] <= 1
    top = sorted(tokens, key=lambda t: (-t["kl"], t["index"]))[:5]
    assert [d["index"] for d in summary["most_divergent"]] == [t["index"] for t in top]
    assert summary["most_divergent"][0]["text"] == top[0]["text"]
    # A's text is exactly what `generate` writes with the same model, preset and seed
    generated = CliRunner().invoke(main, ["generate", "-m", a, *base[4:], "--format", "jsonl"])
    expected = [line["token_id"] for line in map(json.loads, generated.stdout.splitlines()) if line["type"] == "token"]
    assert [t["token_id"] for t in tokens] == expected
    assert invoke(*base, "--format", "jsonl").stdout == result.stdout  # same seed, same records


def test_given_continuation_text_and_html(pair: tuple[str, str], tmp_path: Path) -> None:
    a, b = pair
    page = tmp_path / "drift.html"
    base = ("-m", a, "-m", b, "--raw", "-p", "w3 w4", "--continuation", "w5 w6 w7 w5", "-q")
    result = invoke(*base, "--format", "jsonl", "--html", str(page))
    assert result.exit_code == 0, result.output
    tokens, summary = records(result.stdout)
    assert [t["token_id"] for t in tokens] == [5, 6, 7, 5]
    assert "".join(t["text"] for t in tokens) == " w5 w6 w7 w5"
    assert summary["source"] == "given" and "seed" not in summary
    document = page.read_text()
    assert "<script" not in document.lower() and "http" not in document and "src=" not in document
    spans = SpanParser.parse(document)
    assert [s["data-token-id"] for s in spans] == ["5", "6", "7", "5"]
    assert [float(s["data-kl"]) for s in spans] == pytest.approx([t["kl"] for t in tokens], abs=1e-6)
    differs = [s for s in spans if "differs" in s["class"]]
    assert len(differs) == sum(not t["same_top"] for t in tokens)
    text = invoke(*base, NO_COLOR="1")
    assert text.exit_code == 0 and "\x1b[" not in text.stdout
    assert text.stdout.startswith(" w5 w6 w7 w5\n")
    for figure in ("p A", "p B", "KL", "nats", "same top token", "expected acceptance if B drafted for A"):
        assert figure in text.stdout
    assert any(mark in text.stdout for mark in "·▂▄▆█")


class SpanParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.spans: list[dict[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "span" and "data-kl" in found:
            self.spans.append({k: v or "" for k, v in found.items()})

    @classmethod
    def parse(cls, document: str) -> list[dict[str, str]]:
        parser = cls()
        parser.feed(document)
        return parser.spans


def test_an_interrupted_generation_is_still_scored(pair: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from llmsample.engine import loop
    from llmsample.errors import Interrupted

    real = loop.generate

    def cut_short(*args, **kwargs):
        for i, item in enumerate(real(*args, **kwargs)):
            if i == 3:
                raise Interrupted(signal.SIGTERM)
            yield item

    monkeypatch.setattr(loop, "generate", cut_short)
    a, b = pair
    result = invoke("-m", a, "-m", b, "--raw", "-p", "w3", "-n", "10", "--seed", "2", "--format", "jsonl", "-q")
    assert result.exit_code == 143
    tokens, summary = records(result.stdout)
    assert len(tokens) == summary["tokens"] == 3 and summary["stop_reason"] == "interrupted"


def test_the_same_model_twice_agrees_everywhere(tiny_model_dir: Path) -> None:
    m = str(tiny_model_dir)
    result = invoke("-m", m, "-m", m, "--raw", "-p", "w3", "-n", "6", "--seed", "1", "--format", "jsonl", "-q")
    tokens, summary = records(result.stdout)
    assert all(t["kl"] == 0 and t["same_top"] and t["prob_a"] == t["prob_b"] for t in tokens)
    assert summary["mean_kl"] == 0 and summary["same_top_rate"] == 1
    assert summary["expected_acceptance"] == pytest.approx(1)


def test_another_tokenizer_is_refused(pair: tuple[str, str], tmp_path: Path) -> None:
    other = str(make_tiny_model(tmp_path / "other", vocab_size=40))
    result = invoke("-m", pair[0], "-m", other, "--raw", "-p", "w3", "-n", "2")
    assert result.exit_code == 2
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
    assert "different tokenizer" in result.stderr and "(40 vs 32 tokens)" in result.stderr


def test_a_padded_a_that_writes_an_id_b_lacks_is_scored_up_to_it(pair: tuple[str, str], tmp_path: Path) -> None:
    """A's embedding padded to 48 rows, B's 32, one tokenizer: A samples a padding id (random
    rows). The positions up to it are scored on the shared ids, a note on stderr says so."""
    from tests.analysis.test_drift import save_padded

    padded = str(save_padded(Path(pair[0]), tmp_path / "padded"))
    args = ("-m", padded, "-m", pair[1], "--raw", "-p", "w3 w4", "-n", "20", "--seed", "2", "--device", "cpu", "-q")
    result = invoke(*args, "--format", "jsonl")
    assert result.exit_code == 0, result.output
    tokens, summary = records(result.stdout)
    assert summary["vocab"] == 32 and summary["unscored_tokens"] > 0
    assert summary["tokens"] == len(tokens) and summary["tokens"] + summary["unscored_tokens"] == 20
    assert tokens[-1]["token_id"] >= 32 and all(t["token_id"] < 32 for t in tokens[:-1])
    note = result.stderr.strip().splitlines()
    assert len(note) == 1 and note[0].startswith("Note: ") and f"outside {pair[1]!r}'s vocabulary of 32 ids" in note[0]
    assert f"the first {len(tokens)} of 20 tokens" in note[0]
    text = invoke(*args)  # the table too
    assert text.exit_code == 0 and "Note: " in text.stderr and "Traceback" not in text.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("-m", "A"), "give two models"),
        (("-m", "A", "-m", "B", "-m", "C"), "give two models"),
        (("-m", "A", "-m", "B", "--continuation", "w3", "--seed", "1", "-t", "0"), "--temperature, --seed only apply"),
        (("-m", "A", "-m", "B", "--continuation", " "), "--continuation is empty"),
    ],
)
def test_usage_errors_before_any_load(args: tuple[str, ...], message: str) -> None:
    result = invoke(*args, "-p", "w3")
    assert result.exit_code == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_in_a_real_terminal_and_through_a_pipe(pair: tuple[str, str]) -> None:
    a, b = pair
    args = ["-m", "llmsample", "compare-models", "-m", a, "-m", b, "--raw", "-p", "w3 w4", "--continuation",
            "w5 w6 w7", "--device", "cpu"]  # fmt: skip
    child = pexpect.spawn(
        sys.executable, args, env=cli_env(TERM="xterm-256color"), encoding="utf-8", timeout=120, dimensions=(40, 120)
    )
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    screen = child.before
    assert "\x1b[" in screen and "KL(A‖B), nats" in screen  # coloured, with the legend
    piped = subprocess.run([sys.executable, *args, "--format", "jsonl"], capture_output=True, text=True,
                           env=cli_env(), cwd=REPO, timeout=120)  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    tokens, summary = records(piped.stdout)
    assert [t["token_id"] for t in tokens] == [5, 6, 7] and summary["tokens"] == 3


@pytest.mark.model
def test_the_default_model_against_itself() -> None:
    result = invoke("-m", "default", "-m", "default", "-p", "What is the capital of France?",
                    "--continuation", "The capital of France is Paris.", "--format", "jsonl", "-q")  # fmt: skip
    assert result.exit_code == 0, result.output
    tokens, summary = records(result.stdout)
    assert len(tokens) >= 6 and all(t["kl"] == 0 and t["same_top"] for t in tokens)
    assert summary["model_a"] == summary["model_b"] == "SmolLM2-135M-Instruct"
    assert summary["mean_kl"] == 0 and summary["expected_acceptance"] == pytest.approx(1)
