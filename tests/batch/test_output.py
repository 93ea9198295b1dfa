"""The ``-o`` file: merged in input order with one record per request (whatever cut the merges
before), locked for one run at a time, checked before anything runs, and never left with a
partial line when the disk fills (on a real tmpfs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmsample.batch.distributed import launched_ranks
from llmsample.batch.output import claim_output, consolidate, lock_path
from llmsample.batch.requests import Request, RequestError, read_requests
from llmsample.batch.resume import Appender
from llmsample.errors import OutputFailed, UserError
from tests.batch.test_resume import ours, ours_error
from tests.batch.tmpfs import fill, tmpfs

PARSED: list[Request | RequestError] = [Request(line=n, custom_id=f"line-{n}", prompt="p") for n in range(1, 9)]


def write(path: Path, lines: list[str], tail: str = "") -> Path:
    path.write_text("".join(line + "\n" for line in lines) + tail)
    return path


def ids(path: Path) -> list[str | None]:
    return [json.loads(line)["custom_id"] for line in path.read_text().splitlines()]


def test_a_part_beside_the_output_is_merged_in_input_order(tmp_path: Path) -> None:
    """The issue's form: line 2's record in OUT.part-1-of-2, lines 1 and 3 in OUT."""
    out = write(tmp_path / "out.jsonl", [ours("line-1", 1), ours("line-3", 3)])
    write(tmp_path / "out.jsonl.part-1-of-2", [ours("line-2", 2)])
    settled = consolidate(out, PARSED, "jsonl", keep_errors=False)
    assert ids(out) == ["line-1", "line-2", "line-3"]
    assert settled.done == {"line-1", "line-2", "line-3"} and settled.last == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]  # parts gone, no temporary left


def test_a_merge_cut_short_is_not_merged_twice(tmp_path: Path) -> None:
    """An earlier version's merge appended 5 of the 8 part records and died with the parts still there."""
    share0 = [ours(f"line-{n}", n) for n in (1, 3, 5, 7)]
    share1 = [ours(f"line-{n}", n) for n in (2, 4, 6, 8)]
    write(tmp_path / "out.jsonl.part-0-of-2", share0)
    write(tmp_path / "out.jsonl.part-1-of-2", share1, tail='{"custom_id": "line-9"')  # and a torn line
    out = write(tmp_path / "out.jsonl", [ours(f"line-{n}", n) for n in range(1, 6)])
    consolidate(out, PARSED, "jsonl", keep_errors=False)
    assert ids(out) == [f"line-{n}" for n in range(1, 9)]
    assert consolidate(out, PARSED, "jsonl", keep_errors=False).rewritten is False  # settled: left alone


def test_a_crash_between_the_rename_and_removing_the_parts_repeats_nothing(tmp_path: Path) -> None:
    out = write(tmp_path / "out.jsonl", [ours("line-1", 1)])
    part = write(tmp_path / "out.jsonl.part-0-of-1", [ours("line-3", 3), ours("line-2", 2)])
    consolidate(out, PARSED, "jsonl", keep_errors=True)
    write(part, [ours("line-3", 3), ours("line-2", 2)])  # as if the process died before the unlink
    consolidate(out, PARSED, "jsonl", keep_errors=False)
    assert ids(out) == ["line-1", "line-2", "line-3"] and not part.exists()


def test_errors_are_retried_on_resume_and_kept_by_the_final_merge(tmp_path: Path) -> None:
    parsed = [*PARSED[:3], RequestError(4, "line-1", "custom_id 'line-1' is already used on line 1")]
    out = write(tmp_path / "out.jsonl", [ours("line-2", 2), ours_error("line-1", 4), ours("line-1", 1)])
    settled = consolidate(out, parsed, "jsonl", keep_errors=True)
    # The duplicate id's error stays at its own line, after the result with that id.
    assert [json.loads(line)["line"] for line in out.read_text().splitlines()] == [1, 2, 4]
    assert settled.done == {"line-1", "line-2"}
    consolidate(out, parsed, "jsonl", keep_errors=False)
    assert [json.loads(line)["line"] for line in out.read_text().splitlines()] == [1, 2]


def test_an_ordered_output_is_left_in_place_and_a_torn_line_cut(tmp_path: Path) -> None:
    out = write(tmp_path / "out.jsonl", [ours("line-1", 1), ours("line-2", 2)], tail='{"custom_id": "li')
    inode = out.stat().st_ino
    settled = consolidate(out, PARSED, "jsonl", keep_errors=False)
    assert out.stat().st_ino == inode and ids(out) == ["line-1", "line-2"] and not settled.rewritten
    assert settled.in_order_after(PARSED)  # what is left comes after: appending keeps input order
    out.write_text(ours("line-3", 3) + "\n")
    assert not consolidate(out, PARSED, "jsonl", keep_errors=False).in_order_after(PARSED)


def test_a_rewrite_keeps_the_mode_of_the_output(tmp_path: Path) -> None:
    out = write(tmp_path / "out.jsonl", [ours("line-2", 2), ours("line-1", 1)])
    out.chmod(0o640)
    consolidate(out, PARSED, "jsonl", keep_errors=False)
    assert out.stat().st_mode & 0o777 == 0o640 and ids(out) == ["line-1", "line-2"]


def test_a_second_claim_is_refused_naming_the_first(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    first = claim_output(out)
    assert lock_path(out).read_text().startswith(f"pid {os.getpid()} ")
    with pytest.raises(UserError, match=rf"is being written by another llmsample batch \(pid {os.getpid()} "):
        claim_output(out)
    first.release()
    assert not lock_path(out).exists()
    claim_output(out).release()


def test_a_run_that_has_just_taken_the_lock_is_named_once_it_writes_its_pid(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import fcntl, os, time; fd = os.open({str(lock_path(out))!r}, os.O_RDWR | os.O_CREAT); "
         "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(0.5); "
         "os.pwrite(fd, b'pid 4242 on elsewhere', 0); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    with pytest.raises(UserError, match=r"another llmsample batch \(pid 4242 on elsewhere\)"):
        claim_output(out)
    holder.kill()
    holder.wait()


def test_a_lock_file_left_by_a_killed_run_blocks_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import fcntl, os, time; fd = os.open({str(lock_path(out))!r}, os.O_RDWR | os.O_CREAT); "
         "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    with pytest.raises(UserError, match="another llmsample batch"):
        claim_output(out)
    holder.kill()
    holder.wait()
    assert lock_path(out).exists()  # SIGKILL: nothing cleaned up, but the kernel dropped the lock
    (tmp_path / ".out.jsonl.abc123.merge").write_text("half a rewrite")
    claim = claim_output(out)
    assert not (tmp_path / ".out.jsonl.abc123.merge").exists()  # a killed rewrite's leftover
    claim.release()


def test_outputs_that_are_not_regular_files_are_only_written(tmp_path: Path) -> None:
    claim = claim_output(Path("/dev/null"))
    assert not claim.regular and not Path("/dev/null.lock").exists()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert not claim_output(fifo).regular
    with pytest.raises(UserError, match=r"the folder .*missing does not exist"):
        claim_output(tmp_path / "missing" / "out.jsonl")


def test_a_read_only_folder_is_refused(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "ro", "size=64k") as folder, pytest.raises(UserError, match="Read-only file system"):
        claim_output(folder / "out.jsonl")


def test_a_full_disk_leaves_only_whole_lines(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "size=64k") as folder:
        fill(folder, 8192)
        out = folder / "out.jsonl"
        record = {"custom_id": "a", "line": 1, "text": "x" * 3000}
        with Appender(out) as appender, pytest.raises(OutputFailed, match="No space left on device") as failed:
            for _ in range(10):
                appender.write(record)
        with pytest.raises(OutputFailed):
            appender.write(record)  # it stays failed; nothing more is written
        data = out.read_bytes()
        assert data and data.endswith(b"\n") and all(json.loads(line) == record for line in data.splitlines())
        assert "rerun with the same -o" in str(failed.value)


def test_consolidate_on_a_full_disk_keeps_the_output(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "size=64k") as folder:
        out = write(folder / "out.jsonl", [ours("line-2", 2)])
        part = write(folder / "out.jsonl.part-0-of-2", [ours("line-1", 1)])
        before = out.read_bytes()
        filler = fill(folder, 0)
        with pytest.raises(OutputFailed, match="it is as it was"):
            consolidate(out, PARSED, "jsonl", keep_errors=False)
        assert out.read_bytes() == before and part.exists() and len(list(folder.iterdir())) == 3
        filler.unlink()
        consolidate(out, PARSED, "jsonl", keep_errors=False)
        assert ids(out) == ["line-1", "line-2"]


def test_world_size_without_a_launcher_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(UserError, match=r"not launched by torchrun .*torchrun --nproc-per-node 2 -m llmsample batch"):
        launched_ranks()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert launched_ranks().world == 2
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(UserError, match="not below WORLD_SIZE"):
        launched_ranks()


def test_openai_records_are_ordered_too(tmp_path: Path) -> None:
    from llmsample.batch.result_lines import dumps, openai_error_record
    from tests.batch.test_resume import theirs

    lines = ['{"custom_id": "b", "prompt": "p"}', "{bad", '{"custom_id": "a", "prompt": "p"}']
    parsed = list(read_requests(lines))
    out = write(tmp_path / "out.jsonl", [theirs("a"), dumps(openai_error_record(parsed[1])), theirs("b")])  # type: ignore[arg-type]
    consolidate(out, parsed, "openai", keep_errors=True)
    assert ids(out) == ["b", None, "a"]
