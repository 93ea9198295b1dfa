"""The optional libraries a plain load hides from transformers' first imports: not imported by a
cold plain load, importable after it, and back for a later load in the same process that uses
torchao (fresh processes: in this one transformers' modelling code is imported already)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import quant_library

PLAIN_THEN_INT8 = """
import sys
from llmsample.models.loading import load_model

load_model(sys.argv[1], "cpu", "float32")
print(sorted(name for name in ("scipy", "torchao") if name in sys.modules))
print(sorted(name for name in ("scipy", "torchao") if sys.modules.get(name, 0) is None))
quantized = load_model(sys.argv[1], "cpu", "float32", quantize="int8")
quantized.model.save_pretrained(sys.argv[2])  # torchao's serialisation, in transformers' torchao quantizer
quantized.tokenizer.save_pretrained(sys.argv[2])
print(quantized.quantization, load_model(sys.argv[2], "cpu", "float32").quantization)
"""

STORED_FIRST = """
import sys
import torch
from llmsample.models.loading import load_model

loaded = load_model(sys.argv[1], "cpu", "float32")
with torch.inference_mode():
    logits = loaded.model(input_ids=torch.tensor([[0, 5, 7]])).logits
print(loaded.quantization, bool(torch.isfinite(logits).all()))
"""


def child(code: str, *args: Path) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_a_plain_load_imports_neither_and_int8_follows(tiny_model_dir: Path, tmp_path: Path) -> None:
    quant_library("torchao")
    imported, still_hidden, quantizations = child(PLAIN_THEN_INT8, tiny_model_dir, tmp_path / "int8")
    assert imported == "[]"  # neither scipy nor torchao came in with transformers' model classes
    assert still_hidden == "[]"  # both importable again once the load is done
    assert quantizations == "int8 torchao"  # the int8 load after the plain one, saved and read back


def test_a_checkpoint_stored_with_torchao_loads_first_in_a_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    quant_library("torchao")
    child(PLAIN_THEN_INT8, tiny_model_dir, tmp_path / "int8")
    assert child(STORED_FIRST, tmp_path / "int8") == ["torchao True"]
