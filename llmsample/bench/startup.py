"""How long until a model is ready: a warm start in a fresh process (converted model on disk),
and the first-run conversion of the shipped GGUF."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from llmsample.bench.results import StartUp
from llmsample.errors import RuntimeFailure
from llmsample.models.gguf_to_hf import gguf_path
from llmsample.models.loading import load_model

WARM_START = """
import json, sys, time
start = time.perf_counter()
from llmsample.models.loading import load_model
load_model(sys.argv[1] or None, sys.argv[2], sys.argv[3])
ready = time.perf_counter()
load_model(sys.argv[1] or None, sys.argv[2], sys.argv[3])
print(json.dumps({"start_s": ready - start, "load_s": time.perf_counter() - ready}))
"""


def warm_start(model: str | None, device: str, dtype: str) -> StartUp:
    """A fresh process, converted model on disk: seconds until the model is ready (``start_s``,
    imports included), and what a second load costs once torch and transformers are imported
    (``load_s``: config, tokenizer, weights)."""
    out = subprocess.run([sys.executable, "-c", WARM_START, model or "", device, dtype], capture_output=True, text=True)
    if out.returncode != 0:  # the child's own last word (a traceback ends with its error)
        last = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        raise RuntimeFailure(f"the warm start's fresh process failed: {last}")
    return StartUp(**json.loads(out.stdout.strip().splitlines()[-1]))


def cold_load_s() -> float | None:
    """The first-run conversion of the shipped GGUF, into a throwaway cache."""
    if gguf_path() is None:
        return None
    previous = os.environ.get("LLMSAMPLE_HOME")
    with tempfile.TemporaryDirectory() as home:
        os.environ["LLMSAMPLE_HOME"] = home
        try:
            start = time.perf_counter()
            load_model(None, "cpu", "float32")
            return time.perf_counter() - start
        finally:
            if previous is None:
                os.environ.pop("LLMSAMPLE_HOME")
            else:
                os.environ["LLMSAMPLE_HOME"] = previous
