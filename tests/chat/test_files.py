"""A chat's saved file: ``/save`` on a full disk leaves the earlier save whole, and ``chat
--load`` of a file that is not what ``/save`` writes is one line naming the file and the
problem, exit 2, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmsample.chat.conversation import Conversation, Turn, load, save
from llmsample.cli import main
from llmsample.errors import UserError
from tests.batch.tmpfs import fill, tmpfs

HEADER = {"type": "chat", "version": 1, "model": "m", "preset": "balanced", "settings": {}, "system": None}
REPLY = {"type": "assistant", "content": "w7", "seed": 3, "settings": {}, "prefix": [], "token_ids": [7]}


def conversation(exchanges: int) -> Conversation:
    return Conversation(None, [Turn(f"w{i} " * 40, saved=dict(REPLY)) for i in range(exchanges)])


def test_a_save_that_does_not_fit_leaves_the_earlier_one_whole(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "size=256k") as disk:
        path = disk / "c.jsonl"
        save(path, conversation(1), {"model": "m"})
        first = path.read_bytes()
        fill(disk, leave=1024)
        with pytest.raises(UserError, match=r"c\.jsonl \(No space left on device\); .*c\.jsonl is as it was"):
            save(path, conversation(50), {"model": "m"})  # ~20 kB
        assert path.read_bytes() == first
        assert sorted(p.name for p in disk.iterdir()) == ["c.jsonl", "filler"]  # no temporary left behind
        _, loaded = load(path)
        assert len(loaded.turns) == 1


def write(path: Path, *records: object) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("records", "fragment"),
    [
        (({**HEADER, "settings": "greedy"},), "line 1: settings must be an object"),
        (({**HEADER, "system": 7},), "line 1: system must be a string"),
        ((HEADER, {"type": "user", "content": "w3"}, {**REPLY, "seed": "x"}), "line 3: seed must be an integer"),
        ((HEADER, {"type": "user", "content": "w3"}, {**REPLY, "seed": None}), "line 3: seed must be an integer"),
        ((HEADER, {"type": "user", "content": "w3"}, {**REPLY, "prefix": [3, "a"]}), "line 3: prefix must be a list"),
        ((HEADER, {"type": "user", "content": ["w3"]}), "line 2: content must be a string"),
        ((HEADER, {"type": "user", "content": "w3"}, {**REPLY, "settings": {"top_k": "x"}}), "line 3: bad settings"),
        ((HEADER, '{"type": "user", "content": ' + "[" * 100_000 + "]" * 100_000 + "}"), "line 2: nested too deeply"),
    ],
)
def test_a_malformed_file_is_one_line_and_exit_2(
    chat_model_dir: Path, tmp_path: Path, records: tuple[object, ...], fragment: str
) -> None:
    path = write(tmp_path / "bad.jsonl", *records)
    args = ["chat", "-m", str(chat_model_dir), "--device", "cpu", "--load", str(path), "--replay"]
    done = CliRunner().invoke(main, args, input="w3\n", catch_exceptions=False)
    assert done.exit_code == 2 and done.stdout == ""
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and f"{path}, {fragment}" in errors[0], done.stderr
