"""lm-evaluation-harness itself scoring against the server: its ``local-completions`` model (the
log-likelihood requests ``echo: true``, ``logprobs: 1``, ``max_tokens: 1``, ``temperature: 0``)
on a small multiple-choice task (``lm_eval_task/``: a task YAML over a JSON file), against its own
``hf`` model on the same checkpoint. Every choice's log-likelihood within 1e-3, the same greedy
flags, the same accuracies; the prompts sent as token ids (lm-eval's default, in batches of 4: a
list of prompts) and as text (``tokenized_requests=False``, one string at a time). The checkpoint
is a tiny random byte-level model built here, offline (no BOS added, a lossless decode: text
prompts tokenize back to lm-eval's own ids)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.constraints.conftest import make_byte_model
from tests.serve.conftest import start_server

HERE = Path(__file__).resolve().parent
TOLERANCE = 1e-3


@pytest.mark.slow
def test_lm_eval_scores_through_the_server_as_its_own_hf_model(tmp_path: Path) -> None:
    model = make_byte_model(tmp_path / "byte")
    server = start_server(model, tmp_path / "stderr", "--batch-size", "4")
    try:
        api = f"model={model},base_url={server.base}/completions,tokenizer={model},tokenizer_backend=huggingface"
        runs = evaluate(
            tmp_path,
            ("hf", f"pretrained={model},dtype=float32,batch_size=1"),
            ("local-completions", f"{api},tokenized_requests=True,batch_size=4"),
            ("local-completions", f"{api},tokenized_requests=False,batch_size=1"),
        )
    finally:
        server.stop()
    hf, *served = runs
    print(f"\nlm-eval hf: acc {hf['acc']}, acc_norm {hf['acc_norm']}")
    for how, run in zip(("token ids", "text"), served, strict=True):
        differences = [abs(got[0] - want[0]) for doc, want_doc in zip(run["choices"], hf["choices"], strict=True)
                       for got, want in zip(doc, want_doc, strict=True)]  # fmt: skip
        print(f"local-completions ({how}): acc {run['acc']}, acc_norm {run['acc_norm']}, "
              f"max |loglikelihood - hf's| {max(differences):.2e} over {len(differences)} choices")  # fmt: skip
        for doc, want_doc in zip(run["choices"], hf["choices"], strict=True):
            print("  " + "  ".join(f"{got[0]:.6f}/{want[0]:.6f}" for got, want in zip(doc, want_doc, strict=True)))
        assert max(differences) < TOLERANCE
        assert [[greedy for _, greedy in doc] for doc in run["choices"]] == [
            [greedy for _, greedy in doc] for doc in hf["choices"]
        ]
        assert (run["acc"], run["acc_norm"]) == (hf["acc"], hf["acc_norm"])
    assert "GET /tokenizer_info" not in server.log.read_text()  # the tokenizer is lm-eval's own: no probe


def evaluate(tmp_path: Path, *runs: tuple[str, str]) -> list[dict]:
    """lm-eval's figures for each (model, model_args), from one offline process in the task's folder."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    command = [sys.executable, str(HERE / "lm_eval_run.py"), *(part for run in runs for part in run)]
    done = subprocess.run(command, cwd=HERE / "lm_eval_task", env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
