"""The optional libraries a plain load hides from transformers' first imports: not imported by a
cold plain load, importable after it, and back for a later load in the same process that uses
torchao (fresh processes: in this one transformers' modelling code is imported already)."""

from __future__ import annotations

import os
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


ASKED_FIRST = """
import sys
from transformers.utils import is_scipy_available
from llmsample.models.loading import load_model

assert is_scipy_available()  # cached by transformers before the load hides scipy
load_model(sys.argv[1], "cpu", "float32")
print("loss_for_object_detection" in " ".join(sys.modules), is_scipy_available())
"""

SCIPY_USER = """
import sys
from llmsample.models.lean_imports import lean_imports
from transformers.utils import is_sklearn_available

with lean_imports(None):
    hidden = is_sklearn_available()  # transformers 5.17's generation code imports sklearn.metrics if so
print(hidden, is_sklearn_available(), __import__("sklearn.metrics").metrics.roc_curve())
"""


def test_an_answer_cached_before_the_load_does_not_stand(tiny_model_dir: Path) -> None:
    """transformers caches its availability answers: one given before the hiding would have its
    modelling code import the hidden library, and the load fail."""
    assert child(ASKED_FIRST, tiny_model_dir) == ["True True"]


def test_a_library_that_imports_scipy_is_hidden_with_it(tmp_path: Path) -> None:
    """scikit-learn (a stand-in here, with its import of scipy) hidden while scipy is, visible after."""
    package = tmp_path / "site" / "sklearn"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("import scipy.optimize\n")
    (package / "metrics.py").write_text("def roc_curve():\n    return 'roc'\n")
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), *sys.path])}
    done = subprocess.run([sys.executable, "-c", SCIPY_USER], capture_output=True, text=True, env=environment)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "roc"]
