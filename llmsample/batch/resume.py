"""Resuming a killed batch from its output file, and writing that file one whole line at a time.

A request is **done** when the file holds a result record for its ``custom_id`` (ours: a
record without ``error``; OpenAI's: ``error`` null and status 200). Error records do not count:
a bad line may have been fixed and a runtime failure (out of memory) may pass next time, so
resuming retries them. To keep one record per request, ``prepare_resume`` removes the old
error records (rewriting the file through a temporary file and an atomic rename); the retry
writes a fresh result or error.

A run killed in the middle of a write leaves a **torn last line**: the bytes after the last
newline. ``prepare_resume`` cuts them off (the request is redone). Any other line that is not
a record of the expected format is an error, and the file is left untouched: resuming into a
file that is not this batch's output must not destroy it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Literal

from llmsample.batch.responses import dumps
from llmsample.errors import UserError

OutputFormat = Literal["jsonl", "openai"]


@dataclass(frozen=True)
class ResumeState:
    """What an output file holds after ``prepare_resume`` repaired it."""

    done: frozenset[str]
    results: int  # result records kept
    duplicates: tuple[str, ...]  # custom_ids with more than one result record (e.g. concatenated files)
    dropped_errors: int
    torn_bytes: int


def prepare_resume(path: Path, fmt: OutputFormat) -> ResumeState:
    """Cut a torn last line, drop error records, and return the finished custom_ids.

    A missing file is an empty one. Raises ``UserError`` (touching nothing) when a complete
    line is not a record of ``fmt``."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return ResumeState(frozenset(), 0, (), 0, 0)
    done: set[str] = set()
    duplicates: list[str] = []
    dropped: list[int] = []  # line numbers of error records
    end = 0  # offset just past the last complete line
    torn = 0
    with handle:
        for number, line in enumerate(handle, 1):
            if not line.endswith(b"\n"):
                torn = len(line)
                break
            end += len(line)
            if not line.strip():
                continue
            custom_id = _result_id(_record(line, path, number), fmt, path, number)
            if custom_id is None:
                dropped.append(number)
            elif custom_id in done:
                duplicates.append(custom_id)
            else:
                done.add(custom_id)
    if dropped:
        _rewrite_without(path, set(dropped), end)
    elif torn:
        os.truncate(path, end)
    return ResumeState(frozenset(done), len(done) + len(duplicates), tuple(duplicates), len(dropped), torn)


def _record(line: bytes, path: Path, number: int) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(
            f"cannot resume into {path}: line {number} is not JSON ({exc}); is it this batch's output?"
        ) from None
    if not isinstance(record, dict):
        raise UserError(f"cannot resume into {path}: line {number} is not a JSON object; is it this batch's output?")
    return record


def _result_id(record: dict[str, Any], fmt: OutputFormat, path: Path, number: int) -> str | None:
    """The custom_id of a result record; None for an error record."""
    is_openai = record.keys() == {"id", "custom_id", "response", "error"}
    if is_openai != (fmt == "openai"):
        other = "openai" if is_openai else "jsonl"
        raise UserError(
            f"cannot resume into {path}: line {number} is a --format {other} record, not --format {fmt}; "
            "resume with the format the file was written in"
        )
    if fmt == "openai":
        response = record["response"]
        failed = record["error"] is not None or not isinstance(response, dict) or response.get("status_code") != 200
    else:
        if "custom_id" not in record or "line" not in record:
            raise UserError(
                f"cannot resume into {path}: line {number} has no custom_id and line; is it this batch's output?"
            )
        failed = "error" in record
    if failed:
        return None
    custom_id = record["custom_id"]
    if not isinstance(custom_id, str):
        raise UserError(f"cannot resume into {path}: line {number} has the custom_id {custom_id!r}, not a string")
    return custom_id


def _rewrite_without(path: Path, skip: set[int], end: int) -> None:
    """Copy every complete line but ``skip`` next to ``path``, then rename over it: a crash
    at any point leaves either the old file or the new one."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".resume")
    try:
        with os.fdopen(fd, "wb") as out, path.open("rb") as source:
            copied = 0
            for number, line in enumerate(source, 1):
                if copied + len(line) > end:
                    break
                copied += len(line)
                if number not in skip:
                    out.write(line)
            out.flush()
            os.fsync(out.fileno())
        shutil.copymode(path, temp)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


class Appender:
    """Appends one record per finished request as one complete line, flushed at once, so that
    a kill loses at most the line being written (which ``prepare_resume`` then cuts off).

    ``fsync`` also survives a power cut, at the cost of a disk sync per line."""

    def __init__(self, path: Path, fsync: bool = False) -> None:
        if path.exists() and path.stat().st_size:
            with path.open("rb") as existing:
                existing.seek(-1, os.SEEK_END)
                if existing.read(1) != b"\n":
                    raise UserError(f"{path} ends in a partial line (a killed run?); resume to repair it")
        self._file: BinaryIO = path.open("ab")
        self._fsync = fsync

    def write(self, record: dict[str, Any]) -> None:
        """Serialise first (``ValueError`` on NaN leaves the file as it was), then write."""
        data = (dumps(record) + "\n").encode("utf-8")
        self._file.write(data)
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Appender:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()
