"""``reasoning_budget``: the token it forces, by hand on a byte tokenizer (one token a byte), the
stage on logits, and a run's records (the closing tokens ``source: "forced"``), the same with
speculation as without."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from llmsample.sampling.budget import force_block_close, forced_token
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.vocabulary import Vocabulary
from tests.constraints.conftest import make_byte_model


@pytest.fixture(scope="module")
def byte_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_byte_model(tmp_path_factory.mktemp("budget-bytes"))


@pytest.fixture(scope="module")
def vocabulary(byte_dir: Path) -> Vocabulary:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(byte_dir)
    return Vocabulary.of(tokenizer, len(tokenizer), [1])


def ids(vocabulary: Vocabulary, text: str) -> list[int]:
    found = vocabulary.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(found) == len(text.encode())  # one token a byte
    return found


@pytest.mark.parametrize(
    ("prompt", "answer", "budget", "forced"),
    [
        ("q <think>\n", "abcd", 4, "<"),  # the prompt opened the block: 4 tokens in, its first closing byte
        ("q <think>\n", "abcd</th", 4, "i"),  # part of the close written by force: the next byte
        ("q <think>\n", "abcd</think>", 4, None),  # closed
        ("q <think>\n", "abc", 4, None),  # under budget
        ("q <think>\n", "a</think>xyz", 9, None),  # the model closed it within its budget
        ("q <think>\n", "abcdz", 4, None),  # not the close after the budget (another writer): free
        ("q ", " <think>ab", 2, "<"),  # the answer opened it: counted after its open
        ("q ", " <thi", 2, None),  # opening, not open yet
        ("q ", "hello", 2, None),  # no block
    ],
)
def test_the_forced_token_by_hand(vocabulary: Vocabulary, prompt: str, answer: str, budget: int, forced: str | None) -> None:
    got = forced_token(vocabulary, ids(vocabulary, prompt), ids(vocabulary, answer), budget)
    assert got == (None if forced is None else ids(vocabulary, forced)[0])


def test_the_stage_keeps_only_the_forced_token_in_rows_at_their_budget(vocabulary: Vocabulary) -> None:
    thinking, plain = ids(vocabulary, "q <think>\n"), ids(vocabulary, "q nothink\n")
    rows = torch.tensor([thinking + ids(vocabulary, "abcd"), plain + ids(vocabulary, "abcd")])
    history = TokenHistory.start(rows[:, :10], vocabulary.size, sequences=True, vocabulary=vocabulary)
    for column in range(10, 14):
        history = history.advanced(rows[:, column])
    logits = torch.randn(2, vocabulary.size, generator=torch.Generator().manual_seed(0))
    out = force_block_close(logits, history, SamplingConfig(reasoning_budget=4))
    less = ids(vocabulary, "<")[0]
    assert torch.isfinite(out[0]).nonzero().view(-1).tolist() == [less] and out[0, less] == logits[0, less]
    assert torch.equal(out[1], logits[1])  # no block in that row
    assert torch.equal(force_block_close(logits, history, SamplingConfig()), logits)


def run(byte_dir: Path, *extra: str) -> list[dict[str, Any]]:
    from click.testing import CliRunner

    from llmsample.cli import main

    args = ["generate", "-m", str(byte_dir), "--raw", "-p", "q </think> <think>\n", "--reasoning-budget", "6",
            "--temperature", "0", "--max-tokens", "20", "--format", "jsonl", "--logit-bias", "1=-100", *extra]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines() if json.loads(line)["type"] == "token"]


def test_a_run_closes_the_block_at_its_budget_with_forced_tokens_with_and_without_speculation(
    byte_dir: Path, vocabulary: Vocabulary
) -> None:
    tokens = run(byte_dir)
    assert [t["source"] for t in tokens[6:14]] == ["forced"] * 8
    assert [t["token_id"] for t in tokens[6:14]] == ids(vocabulary, "</think>")
    assert all(t["source"] != "forced" for t in tokens[:6] + tokens[14:])
    assert all(t["removed"].get("reasoning_budget") for t in tokens[6:14])
    speculated = run(byte_dir, "--draft", "ngram")
    assert [t["token_id"] for t in speculated] == [t["token_id"] for t in tokens]
    assert [t["source"] == "forced" for t in speculated] == [t["source"] == "forced" for t in tokens]
