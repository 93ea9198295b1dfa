"""``generate --tp`` under torchrun: two CPU ranks (gloo), each with half of every layer, print
exactly what one process prints; ``--tp`` outside torchrun, or with what it does not combine
with, is one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli_env

ARGS = ("--device", "cpu", "--raw", "-p", "w3 w4 w5", "-n", "8", "--seed", "1", "--format", "jsonl", "-q")


def token_ids(stdout: str) -> list[int]:
    lines = [json.loads(line) for line in stdout.splitlines()]
    assert lines[-1]["type"] == "summary"
    return [line["token_id"] for line in lines[:-1]]


def test_two_ranks_print_what_one_process_prints(tiny_model_dir: Path) -> None:
    alone = subprocess.run(
        [sys.executable, "-m", "llmsample", "generate", "-m", str(tiny_model_dir), *ARGS],
        capture_output=True, text=True, env=cli_env(), timeout=120,
    )  # fmt: skip
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "llmsample"]
    split = subprocess.run(
        [*launcher, "generate", "--tp", "-m", str(tiny_model_dir), *ARGS],
        capture_output=True, text=True, env=cli_env(), timeout=300,
    )  # fmt: skip
    assert split.returncode == 0, split.stderr[-2000:]
    assert token_ids(split.stdout) == token_ids(alone.stdout)  # one rank printed, the same tokens


@pytest.mark.parametrize(
    ("extra", "env", "fragment"),
    [
        ((), {}, "torchrun --nproc-per-node N"),
        (("--draft", "ngram"), {"WORLD_SIZE": "2"}, "--tp does not combine with --draft"),
        (("--compile",), {"WORLD_SIZE": "2"}, "--tp does not combine with --compile"),
    ],
)
def test_refusals_are_one_line(tiny_model_dir: Path, extra: tuple[str, ...], env: dict, fragment: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "llmsample", "generate", "--tp", "-m", str(tiny_model_dir), *ARGS, *extra],
        capture_output=True, text=True, env=cli_env(**env), timeout=120,
    )  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and fragment in result.stderr
