"""A constraint and ``--draft ngram`` run on a warm engine (compiled by the command, enforced by
the engine's rows) and print what the in-process run prints; an incomplete answer exits 1 alike.
A byte-level model: the word-level tiny models cannot spell what a constraint asks."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.constraints.conftest import make_byte_model
from tests.warm.conftest import Engine, start_engine
from tests.warm.test_same_bytes import comparable


@pytest.fixture(scope="module")
def byte_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    engine = start_engine(make_byte_model(tmp_path_factory.mktemp("bytes")), "--keep-alive", "10m")
    yield engine
    engine.cli("stop", "--all")


@pytest.mark.parametrize(
    ("command", "flags", "allowed"),
    [
        ("generate", ("--choice", "yes", "--choice", "no"), ("yes", "no")),
        ("speculate", ("--regex", "(ab-[0-9]){2}", "--compare"), ("ab-",)),
    ],
)
def test_the_same_records_under_a_constraint(
    byte_engine: Engine, command: str, flags: tuple[str, ...], allowed: tuple[str, ...]
) -> None:
    args = (command, *byte_engine.load_args, "-p", "ab-1 ab-2 ab-", "--raw", "--seed", "3", "-n", "16",
            *flags, "--format", "jsonl")  # fmt: skip
    warm, local = byte_engine.cli(*args), byte_engine.cli(*args, "--local")
    assert warm.returncode == local.returncode == 0, warm.stderr + local.stderr
    assert comparable(warm.stdout) == comparable(local.stdout)
    summary = json.loads(warm.stdout.splitlines()[-1])
    assert summary["engine"].startswith("unix:") and summary["text"].startswith(allowed)


def test_an_incomplete_answer_fails_alike(byte_engine: Engine) -> None:
    args = ("generate", *byte_engine.load_args, "-p", "x", "--raw", "--seed", "1", "-n", "3",
            "--regex", "[a-c]{9}", "-q")  # fmt: skip
    warm, local = byte_engine.cli(*args), byte_engine.cli(*args, "--local")
    assert warm.returncode == local.returncode == 1
    assert warm.stdout == local.stdout and len(warm.stdout.strip()) == 3
    assert warm.stderr == local.stderr and len(warm.stderr.splitlines()) == 1
