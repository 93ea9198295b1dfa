"""Runs lm-evaluation-harness on ``tiny_choice`` (the task YAML beside this file, over its JSON
file) for each ``MODEL ARGS`` pair on the command line, in this one process, and prints one JSON
line: per model, the accuracies and every document's per-choice (log-likelihood, is_greedy).
Run from ``lm_eval_task/`` (the YAML's ``data_files`` is relative to it), offline
(``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE``); ``tests/serve/test_lm_eval.py`` starts it."""

from __future__ import annotations

import json
import sys


def main(pairs: list[str]) -> None:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    tasks = TaskManager(include_path=".")
    runs = []
    for model, args in zip(pairs[::2], pairs[1::2], strict=True):
        out = simple_evaluate(model=model, model_args=args, tasks=["tiny_choice"], task_manager=tasks,
                              log_samples=True, device="cpu")  # fmt: skip
        results = out["results"]["tiny_choice"]
        docs = sorted(out["samples"]["tiny_choice"], key=lambda sample: sample["doc_id"])
        runs.append({
            "model": model,
            "acc": results["acc,none"],
            "acc_norm": results["acc_norm,none"],
            "choices": [[[float(ll), bool(greedy)] for ll, greedy in doc["filtered_resps"]] for doc in docs],
        })  # fmt: skip
    print(json.dumps(runs))


if __name__ == "__main__":
    main(sys.argv[1:])
