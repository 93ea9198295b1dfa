"""A sliding-window model (a tiny Mistral whose window, 4 positions, is far shorter than the
texts here) through every command: the padded batch keeps such layers whole and the model's mask
applies the window, so each command writes what transformers' own forward pass gives, greedy
token by greedy token, and scores what it scores. (The window changes this model's greedy text:
the tests would see a backend that ignored it.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from llmsample.cli import main
from tests.chat.conftest import TEMPLATE
from tests.conftest import REPO, make_tiny_model, with_chat_template

WINDOW = 4
PROMPT = "w3 w9 w4 w17 w5 w11"
N = 16


def save_mistral(path: Path, window: int | None) -> Path:
    """The tiny word-level tokenizer (with the chat test's template) and a random Mistral."""
    from transformers import MistralConfig, MistralForCausalLM

    make_tiny_model(path)
    config = MistralConfig(
        vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, sliding_window=window, initializer_range=0.5,
        bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(1)
    MistralForCausalLM(config).save_pretrained(path)
    return with_chat_template(path, TEMPLATE)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_mistral(tmp_path_factory.mktemp("mistral"), WINDOW)


@pytest.fixture(scope="module")
def hf(model_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)


def greedy(model, ids: list[int], n: int = N) -> list[int]:
    """Greedy by full recomputation in transformers' own forward pass (which applies the window)."""
    ids = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[-n:]


def prompt_ids(hf) -> list[int]:
    return hf[1].encode(PROMPT, add_special_tokens=False)


def cli(*args: str) -> list[dict]:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def common(model_dir: Path) -> list[str]:
    return ["-m", str(model_dir), "--device", "cpu", "--dtype", "float32", "--raw", "-q", "--format", "jsonl"]


def tokens(records: list[dict]) -> list[int]:
    return [r["token_id"] for r in records if r["type"] == "token"]


def test_the_window_changes_the_answer(hf, tmp_path: Path) -> None:
    """Without its window the same weights write something else: the checks below can fail."""
    from transformers import AutoModelForCausalLM

    unwindowed = AutoModelForCausalLM.from_pretrained(hf[0].name_or_path, sliding_window=None).eval()
    assert greedy(unwindowed, prompt_ids(hf)) != greedy(hf[0], prompt_ids(hf))


@pytest.mark.parametrize("draft", [None, "ngram", "model"])
def test_generate_and_speculate_write_transformers_greedy(model_dir: Path, hf, draft: str | None) -> None:
    command = "generate" if draft is None else "speculate"
    extra = [] if draft is None else ["--draft", str(model_dir) if draft == "model" else "ngram"]
    records = cli(command, *common(model_dir), "-p", PROMPT, "-n", str(N), "-t", "0", "--ignore-eos", *extra)
    assert tokens(records) == greedy(hf[0], prompt_ids(hf))
    if draft == "model":  # the draft is the target: its greedy drafts pass
        assert records[-1]["accepted"] > 0


def test_compare_presets_two_samples(model_dir: Path) -> None:
    """Two rows of one prompt in one cache write what ``generate`` writes alone (checked above)."""
    args = [*common(model_dir), "-p", PROMPT, "-n", str(N), "--preset", "deterministic"]
    want = cli("generate", *args)[-1]["text"]
    lines = cli("compare-presets", *common(model_dir), "-p", PROMPT, "-n", str(N), "--presets", "deterministic",
                "--samples", "2")  # fmt: skip
    assert [line["text"] for line in lines] == [want, want]


def test_batch_rows_of_different_prompts(model_dir: Path, hf, tmp_path: Path) -> None:
    prompts = [PROMPT, "w20 w21", "w7 w8 w9 w10 w11 w12 w13 w14 w15"]
    (tmp_path / "in.txt").write_text("\n".join(prompts) + "\n")
    out = tmp_path / "out.jsonl"
    CliRunner().invoke(main, ["batch", str(tmp_path / "in.txt"), "-o", str(out), "-m", str(model_dir), "--device",
                              "cpu", "--dtype", "float32", "--raw", "-q", "-n", str(N), "-t", "0", "--ignore-eos",
                              "--tokens", "ids", "--batch-size", "3"])  # fmt: skip
    records = [json.loads(line) for line in out.read_text().splitlines()]
    for record, prompt in zip(records, prompts, strict=True):
        want = greedy(hf[0], hf[1].encode(prompt, add_special_tokens=False))
        assert [t["token_id"] for t in record["per_token"]] == want, prompt


def test_explain_and_compare_models_score_as_transformers(model_dir: Path, hf, tmp_path: Path) -> None:
    prompt = prompt_ids(hf)
    continuation = greedy(hf[0], prompt, 10)
    text = hf[1].decode(continuation)
    with torch.inference_mode():
        want = hf[0](torch.tensor([prompt + continuation])).logits[0, len(prompt) - 1 : -1].softmax(-1)
    want = [float(want[i, t]) for i, t in enumerate(continuation)]
    scored = cli("explain", *common(model_dir), "-p", PROMPT, "--continuation", text)
    assert [s["token_id"] for s in scored] == continuation
    assert max(abs(s["model_prob"] - w) for s, w in zip(scored, want, strict=True)) < 1e-5
    copy = save_mistral(tmp_path / "copy", WINDOW)  # the same weights under another name: loaded twice
    drift = cli("compare-models", *common(model_dir)[:-3], "-m", str(copy), "-q", "--format", "jsonl",
                "-p", PROMPT, "--continuation", text)  # fmt: skip
    assert max(abs(d["prob_a"] - w) for d, w in zip(drift[:-1], want, strict=True)) < 1e-5
    assert drift[-1]["mean_kl"] < 1e-9


def test_chat_regen_and_explain(model_dir: Path) -> None:
    """Piped: greedy, so /regen writes the same reply; /explain shows the chain mid-reply."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "LLMSAMPLE_HOME": os.environ.get("LLMSAMPLE_HOME", "")}
    done = subprocess.run(
        [sys.executable, "-m", "llmsample", "chat", "-m", str(model_dir), "--device", "cpu", "--dtype", "float32",
         "-n", str(N), "-t", "0", "--ignore-eos", "--no-color"],
        input="w7 w8 w9\n/regen\n/explain 9\n", capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == lines[1] and len(lines[0].split()) >= N // 2
    assert "entropy of the final distribution" in done.stdout


def test_serve_one_request(model_dir: Path, tmp_path: Path) -> None:
    """A completion from the server (rows of a batch of 2) is what ``generate`` writes."""
    import httpx

    from tests.serve.conftest import start_server

    want = cli("generate", *common(model_dir), "-p", PROMPT, "-n", str(N), "-t", "0")[-1]["text"]
    server = start_server(model_dir, tmp_path / "stderr", "--batch-size", "2")
    try:
        body = {"prompt": PROMPT, "max_tokens": N, "temperature": 0}
        response = httpx.post(server.base + "/completions", json=body, timeout=120)
    finally:
        server.stop()
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == want
