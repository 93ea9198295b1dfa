"""Resuming from an output file: torn last lines, error records retried, duplicates, the appender."""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path

import pytest

from llmsample.batch.requests import Request, RequestError
from llmsample.batch.result_lines import dumps, error_record, openai_error_record, openai_result_record, result_record
from llmsample.batch.resume import Appender, ResumeState, prepare_resume
from llmsample.errors import UserError
from llmsample.events import Summary

SUMMARY = Summary("ok", 1, 3, "eos", 0.1, None, "tiny", "balanced", 1, 0.2)


def ours(custom_id: str, line: int = 1) -> str:
    return dumps(result_record(Request(line=line, custom_id=custom_id, prompt="p"), SUMMARY, [], "none"))


def ours_error(custom_id: str | None, line: int = 1) -> str:
    return dumps(error_record(RequestError(line, custom_id, "bad")))


def theirs(custom_id: str) -> str:
    return dumps(openai_result_record(Request(line=1, custom_id=custom_id, prompt="p"), SUMMARY, []))


def write(path: Path, lines: list[str], tail: bytes = b"") -> Path:
    path.write_bytes("".join(line + "\n" for line in lines).encode() + tail)
    return path


def test_missing_and_empty_files_have_nothing_done(tmp_path: Path) -> None:
    empty = ResumeState(frozenset(), 0, (), 0, 0)
    assert prepare_resume(tmp_path / "absent.jsonl", "jsonl") == empty
    assert not (tmp_path / "absent.jsonl").exists()
    assert prepare_resume(write(tmp_path / "empty.jsonl", []), "openai") == empty


def test_torn_last_line_is_cut_off(tmp_path: Path) -> None:
    kept = [ours("a"), ours("b")]
    torn = ours("c").encode()[:-7]
    path = write(tmp_path / "out.jsonl", kept, torn)
    inode = path.stat().st_ino
    state = prepare_resume(path, "jsonl")
    assert state == ResumeState(frozenset({"a", "b"}), 2, (), 0, len(torn))
    assert path.read_text() == "".join(line + "\n" for line in kept)
    assert path.stat().st_ino == inode  # truncated in place, not rewritten
    assert prepare_resume(path, "jsonl").torn_bytes == 0  # idempotent


def test_a_complete_record_without_its_newline_is_still_torn(tmp_path: Path) -> None:
    path = write(tmp_path / "out.jsonl", [ours("a")], ours("b").encode())
    state = prepare_resume(path, "jsonl")
    assert state.done == {"a"}
    assert path.read_text() == ours("a") + "\n"


def test_errors_are_dropped_and_retried(tmp_path: Path) -> None:
    lines = [ours_error("a"), ours("b"), ours_error(None, 3), ours_error("c"), ours("a"), "", ours("d")]
    path = write(tmp_path / "out.jsonl", lines, b'{"custom_id": "e", "li')
    path.chmod(0o640)
    state = prepare_resume(path, "jsonl")
    assert state == ResumeState(frozenset({"a", "b", "d"}), 3, (), 3, len(b'{"custom_id": "e", "li'))
    assert path.read_text() == "".join(line + "\n" for line in (ours("b"), ours("a"), "", ours("d")))
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]  # no temporary file left


def test_duplicate_results_are_reported_and_kept(tmp_path: Path) -> None:
    lines = [ours("a"), ours("b"), ours("a"), ours("a")]
    path = write(tmp_path / "out.jsonl", lines)
    before = path.read_bytes()
    state = prepare_resume(path, "jsonl")
    assert state == ResumeState(frozenset({"a", "b"}), 4, ("a", "a"), 0, 0)
    assert path.read_bytes() == before


def test_openai_records(tmp_path: Path) -> None:
    failed_http = json.loads(theirs("x"))
    failed_http["response"]["status_code"] = 400
    lines = [
        theirs("a"),
        dumps(openai_error_record(RequestError(2, "b", "bad"))),
        dumps(failed_http),
        theirs("c"),
    ]
    path = write(tmp_path / "out.jsonl", lines)
    state = prepare_resume(path, "openai")
    assert (state.done, state.dropped_errors) == ({"a", "c"}, 2)
    assert path.read_text() == theirs("a") + "\n" + theirs("c") + "\n"


@pytest.mark.parametrize(
    ("lines", "fmt", "message"),
    [
        ([ours("a")], "openai", "line 2 is a --format jsonl record, not --format openai"),
        ([theirs("a")], "jsonl", "line 2 is a --format openai record, not --format jsonl"),
        ([ours("a"), theirs("b")], "jsonl", "line 3 is a --format openai record"),
        ([ours("a"), "not json at all"], "jsonl", "line 3 is not JSON"),
        (["[1, 2]"], "jsonl", "line 2 is not a JSON object"),
        (['{"text": "a generate summary"}'], "jsonl", "line 2 has no custom_id and line"),
        (['{"custom_id": 5, "line": 1}'], "jsonl", "line 2 has the custom_id 5, not a string"),
    ],
)
def test_a_foreign_file_is_refused_and_left_alone(tmp_path: Path, lines: list[str], fmt: str, message: str) -> None:
    first = ours_error("z") if fmt == "jsonl" else dumps(openai_error_record(RequestError(1, "z", "bad")))
    path = write(tmp_path / "out.jsonl", [first, *lines], b'{"torn')
    before = path.read_bytes()
    with pytest.raises(UserError, match=re.escape(message)):
        prepare_resume(path, fmt)  # type: ignore[arg-type]
    assert path.read_bytes() == before  # neither the error record dropped nor the tail cut


def test_invalid_utf8_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"custom_id": "\xff", "line": 1}\n')
    with pytest.raises(UserError, match="line 1 is not JSON"):
        prepare_resume(path, "jsonl")


def test_appender_writes_whole_flushed_lines(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    with Appender(path) as out:
        out.write(json.loads(ours("a")))
        assert path.read_text() == ours("a") + "\n"  # on disk before the next request finishes
        out.write({"custom_id": "b", "line": 2, "text": "multi\nline é"})
        assert path.read_text().count("\n") == 2
    with Appender(path) as out:  # appends, never truncates
        out.write(json.loads(ours("c")))
    assert [json.loads(line)["custom_id"] for line in path.read_text().splitlines()] == ["a", "b", "c"]
    assert "é" in path.read_text(encoding="utf-8")


def test_appender_refuses_nan_without_writing(tmp_path: Path) -> None:
    path = write(tmp_path / "out.jsonl", [ours("a")])
    with Appender(path) as out, pytest.raises(ValueError):
        out.write({"custom_id": "b", "line": 2, "tokens_per_s": math.nan})
    assert path.read_text() == ours("a") + "\n"


def test_appender_refuses_a_torn_file(tmp_path: Path) -> None:
    path = write(tmp_path / "out.jsonl", [ours("a")], b'{"custom_id": "b"')
    with pytest.raises(UserError, match="ends in a partial line"):
        Appender(path)
    prepare_resume(path, "jsonl")
    with Appender(path) as out:
        out.write(json.loads(ours("b")))
    assert path.read_text() == ours("a") + "\n" + ours("b") + "\n"


def test_appender_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    with Appender(tmp_path / "a.jsonl") as out:
        out.write({"custom_id": "a", "line": 1})
    assert synced == []
    with Appender(tmp_path / "b.jsonl", fsync=True) as out:
        out.write({"custom_id": "a", "line": 1})
        out.write({"custom_id": "b", "line": 2})
    assert len(synced) == 2


def test_kill_and_resume_cycle(tmp_path: Path) -> None:
    """A run dies mid-line; the resumed run skips what is done and the file ends clean."""
    path = tmp_path / "out.jsonl"
    with Appender(path) as out:
        out.write(json.loads(ours("a", 1)))
        out.write(json.loads(ours_error("b", 2)))
    with path.open("ab") as dying:
        dying.write(ours("c", 3).encode()[:10])
    state = prepare_resume(path, "jsonl")
    assert state.done == {"a"} and state.dropped_errors == 1 and state.torn_bytes == 10
    with Appender(path) as out:
        for custom_id, line in (("a", 1), ("b", 2), ("c", 3)):
            if custom_id not in state.done:
                out.write(json.loads(ours(custom_id, line)))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["custom_id"], "error" in r) for r in records] == [("a", False), ("b", False), ("c", False)]
    assert prepare_resume(path, "jsonl").done == {"a", "b", "c"}
