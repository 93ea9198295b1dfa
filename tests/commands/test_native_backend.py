"""``--backend torch`` (llmsample's own forward, models/native_llama.py) from the command line: the
greedy tokens, speculation, batch records and logit lens of ``--backend transformers`` on the
same checkpoint; no transformers import on its path; auto's choice per flag combination; the
refusals, one line each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from llmsample.cli import main
from llmsample.models import llamacpp_load as llamacpp
from llmsample.models.plan import Asked, plan
from tests.commands.test_cold_imports import imported
from tests.conftest import cli_env, make_tiny_model
from tests.models.test_native import MODELS, save_tiny

PROMPT = "w3 w9 w4 w17 w5 w11 w3 w9"
CPU = torch.device("cpu")


def picked(requested: str, spec: str | None, device: torch.device, dtype_given: bool, simple: bool) -> str:
    return plan(Asked(requested, spec, device, dtype_given, simple)).backend


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tied embeddings, Llama 3.1's rope scaling."""
    return MODELS["llama-tied-llama3"](tmp_path_factory.mktemp("llama") / "model")


def run(*args: str) -> list[dict[str, Any]]:
    """``llmsample ARGS --format jsonl`` in a fresh process: its records."""
    done = subprocess.run([sys.executable, "-m", "llmsample", *args, "--format", "jsonl", "--no-log"],
                          capture_output=True, text=True, env=cli_env(), timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def tokens(records: list[dict[str, Any]]) -> list[int]:
    return [r["token_id"] for r in records if r["type"] == "token"]


@pytest.mark.parametrize("draft", [None, "none", "ngram", "model"])
def test_greedy_tokens_are_transformers(llama: Path, draft: str | None) -> None:
    """``generate`` (drafting by default on torch, ``--draft auto``, and not on transformers;
    ``--draft none``), and ``speculate`` with prompt lookup or a draft model (the target itself,
    on torch too: its greedy drafts pass)."""
    if draft in (None, "none"):
        command, extra = "generate", [] if draft is None else ["--draft", "none"]
    else:
        command, extra = "speculate", ["--draft", str(llama) if draft == "model" else draft]
    base = [command, "-m", str(llama), "-p", PROMPT, "-n", "24", "-t", "0", "--ignore-eos", "--raw", "-q", *extra]
    theirs, ours = run(*base, "--backend", "transformers"), run(*base, "--backend", "torch")
    assert tokens(ours) == tokens(theirs) and len(tokens(ours)) == 24
    assert ours[-1]["backend"] == "torch" and theirs[-1]["backend"] == "transformers"
    if draft in (None, "none"):  # the summary says what auto drafted, where it drafts
        assert ("drafted" in ours[-1], "drafted" in theirs[-1]) == (draft is None, False)
    else:
        assert ours[-1]["accepted"] == theirs[-1]["accepted"]
    if draft == "model":
        assert ours[-1]["accepted"] > 0


def test_batch_records_are_transformers(llama: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("w3 w4 w5\nw9\nw7 w8 w9 w10 w11 w12\n")
    texts = {}
    for backend in ("transformers", "torch"):
        out = tmp_path / f"{backend}.jsonl"
        result = CliRunner().invoke(main, ["batch", str(source), "-o", str(out), "-m", str(llama), "--raw", "-q",
                                           "-n", "6", "--seed", "4", "--tokens", "ids", "--batch-size", "3",
                                           "--backend", backend, "--no-log"])  # fmt: skip
        assert result.exit_code == 0, result.output
        records = [json.loads(line) for line in out.read_text().splitlines()]
        texts[backend] = [(r["text"], [t["token_id"] for t in r["per_token"]]) for r in records]
    assert texts["torch"] == texts["transformers"] and len(texts["torch"]) == 3


def test_the_logit_lens_is_transformers(llama: Path) -> None:
    records = {}
    for backend in ("transformers", "torch"):
        result = CliRunner().invoke(main, ["explain", "-m", str(llama), "--raw", "-p", PROMPT, "-q", "--layers",
                                           "--format", "jsonl", "--backend", backend])  # fmt: skip
        assert result.exit_code == 0, result.output
        records[backend] = json.loads(result.stdout)
    ours, theirs = records["torch"], records["transformers"]
    assert ours["layers"] == theirs["layers"] == 2
    assert ours["chosen"] == theirs["chosen"] and ours["settles_at"] == theirs["settles_at"]
    assert [(t["token_id"], t["ranks"]) for t in ours["tokens"]] == [(t["token_id"], t["ranks"]) for t in theirs["tokens"]]
    for a, b in zip(ours["tokens"], theirs["tokens"], strict=True):
        assert a["probs"] == pytest.approx(b["probs"], abs=1e-5)


def test_a_torch_run_imports_no_transformers(llama: Path, tmp_path: Path) -> None:
    for command in (["generate"], ["speculate", "--draft", str(llama)]):
        modules = imported(tmp_path, *command, "-m", str(llama), "--backend", "torch", "-p", "w3", "-n", "2", "-q",
                           "--no-log", "--local")  # fmt: skip
        assert "llmsample.models.native_llama" in modules and "tokenizers" in modules
        assert [m for m in modules if m == "transformers" or m.startswith("transformers.")] == []


@pytest.mark.parametrize(
    ("requested", "device", "dtype_given", "simple", "chosen"),
    [
        ("auto", "cpu", False, True, "torch"),
        ("auto", "cpu", True, True, "torch"),  # --dtype is the torch path's too
        ("auto", "cpu", False, False, "transformers"),  # --compile, --quantize, --device-map, --tp
        ("auto", "cuda", False, True, "transformers"),  # not measured there: transformers
        ("transformers", "cpu", False, True, "transformers"),
        ("torch", "cpu", True, True, "torch"),
    ],
)
def test_auto_picks_torch_on_a_cpu_for_a_plain_load(
    llama: Path, monkeypatch: pytest.MonkeyPatch, requested: str, device: str, dtype_given: bool, simple: bool,
    chosen: str,
) -> None:  # fmt: skip
    monkeypatch.setattr(llamacpp, "installed", lambda: False)
    assert picked(requested, str(llama), torch.device(device), dtype_given, simple) == chosen


def test_auto_leaves_to_llama_cpp_what_it_runs(llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llamacpp, "installed", lambda: True)
    monkeypatch.setattr(llamacpp, "checkpoint_folder", lambda spec: None)  # as a GGUF file would be
    monkeypatch.setattr(llamacpp, "gguf_file", lambda spec: Path("model.gguf"))
    assert picked("auto", str(llama), CPU, False, True) == "llama.cpp"


def test_auto_runs_the_converted_default_model_on_torch_without_llama_cpp(
    llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from llmsample.models import native_checkpoint as native_load
    from llmsample.models.gguf_to_hf import DEFAULT_MODEL

    monkeypatch.setattr(llamacpp, "installed", lambda: False)
    monkeypatch.setattr(native_load, "models_dir", lambda: tmp_path)
    assert picked("auto", None, CPU, False, True) == "transformers"  # not converted yet: transformers does it
    shutil.copytree(llama, tmp_path / DEFAULT_MODEL)
    assert picked("auto", None, CPU, False, True) == "torch"


def one_line(*args: str) -> str:
    result = CliRunner().invoke(main, ["generate", "-p", "w3", "-n", "2", "-q", *args])
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    return result.stderr


def edited(folder: Path, target: Path, file: str, **changes: Any) -> Path:
    """A copy of ``folder`` with keys of a JSON file changed."""
    import shutil

    shutil.copytree(folder, target)
    values = json.loads((target / file).read_text())
    (target / file).write_text(json.dumps(values | changes))
    return target


def test_what_torch_cannot_run_is_one_line_and_auto_goes_to_transformers(llama: Path, tmp_path: Path) -> None:
    gelu = edited(llama, tmp_path / "gelu", "config.json", hidden_act="gelu")
    line = one_line("-m", str(gelu), "--backend", "torch")
    assert f"cannot run {gelu} on --backend torch: its activation is 'gelu'" in line
    assert picked("auto", str(gelu), CPU, False, True) == "transformers"
    qwen = save_tiny(tmp_path / "qwen", "qwen2")  # transformers reads its tokenizer with Qwen2Tokenizer
    assert "its tokenizer is transformers' Qwen2Tokenizer" in one_line("-m", str(qwen), "--backend", "torch")
    assert picked("auto", str(qwen), CPU, False, True) == "transformers"
    windows = edited(qwen, tmp_path / "windows", "config.json", use_sliding_window=True)
    assert "sliding windows cover some layers" in one_line("-m", str(windows), "--backend", "torch")
    yarn = edited(llama, tmp_path / "yarn", "config.json", rope_parameters={"rope_type": "yarn", "rope_theta": 1e4})
    assert "rope type is 'yarn'" in one_line("-m", str(yarn), "--backend", "torch")
    tokenizer = edited(llama, tmp_path / "tokenizer", "tokenizer_config.json", add_prefix_space=True)
    assert "tokenizer needs transformers" in one_line("-m", str(tokenizer), "--backend", "torch")
    assert picked("auto", str(tokenizer), CPU, False, True) == "transformers"
    assert "hub-id" in one_line("-m", "some/hub-id", "--backend", "torch")
    assert "transformers'" in one_line("-m", str(llama), "--backend", "torch", "--compile")
    assert "llama.cpp's weight type" in one_line("-m", str(llama), "--backend", "torch", "--gguf-type", "Q8_0")


def test_broken_weights_are_the_transformers_paths_lines(tmp_path: Path) -> None:
    """The same words on both backends (models/checkpoint.py's): a config that does not match the
    weights, a cut safetensors file."""
    model = make_tiny_model(tmp_path / "tiny")
    folders = [edited(model, tmp_path / f"changed{i}", "config.json", **change) for i, change in
               enumerate(({"num_attention_heads": 5}, {"intermediate_size": 48}, {"num_hidden_layers": 3}))]  # fmt: skip
    cut = edited(model, tmp_path / "cut", "config.json")
    (cut / "model.safetensors").write_bytes((model / "model.safetensors").read_bytes()[:5000])
    lines = {b: [one_line("-m", str(f), "--backend", b) for f in [*folders, cut]] for b in ("transformers", "torch")}
    assert lines["torch"] == lines["transformers"]
    heads, shape, missing, corrupt = lines["torch"]
    assert "not a multiple of the number of attention heads (5)" in heads
    assert "down_proj.weight is [32, 64] in the weights, [32, 48] by config.json" in shape
    assert "9 weights are missing, e.g. model.layers.2.input_layernorm.weight" in missing
    assert "the file is incomplete or corrupt" in corrupt
