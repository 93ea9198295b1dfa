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

``Appender`` writes each record as one ``os.write`` of a whole line; a write that fails (a full
disk) is cut back to the last whole line, so the file never ends in a partial record.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from llmsample.batch.result_lines import dumps
from llmsample.errors import OutputFailed, UserError

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
            custom_id = classify(line, fmt, path, number)[1]
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


@dataclass(frozen=True)
class Records:
    """The complete, non-blank lines of an output file, each classified; the torn tail left out."""

    lines: list[tuple[bytes, dict[str, Any], str | None]]  # line, record, custom_id of a result (None: error)
    end: int  # offset just past the last complete line
    torn: int  # bytes after it


def read_records(path: Path, fmt: OutputFormat) -> Records:
    """Every complete record of ``path`` (a missing file has none), changing nothing; raises
    ``UserError`` when a complete line is not a record of ``fmt``."""
    lines: list[tuple[bytes, dict[str, Any], str | None]] = []
    end = torn = 0
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return Records(lines, 0, 0)
    with handle:
        for number, line in enumerate(handle, 1):
            if not line.endswith(b"\n"):
                torn = len(line)
                break
            end += len(line)
            if line.strip():
                lines.append((line, *classify(line, fmt, path, number)))
    return Records(lines, end, torn)


def classify(line: bytes, fmt: OutputFormat, path: Path, number: int) -> tuple[dict[str, Any], str | None]:
    """A complete line as its record and, for a result record, its custom_id (None: an error record)."""
    record = _record(line, path, number)
    return record, _result_id(record, fmt, path, number)


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
    """Appends one record per finished request as one complete line, written with one
    ``os.write`` (looped only for a short write) and so on disk for readers at once: a kill loses
    at most the line being written (which ``prepare_resume`` then cuts off), and a failed write
    (``ENOSPC``) is truncated back to the last whole line and raises ``OutputFailed``; every
    later write raises it again. ``path`` may be a pipe or a device (``-o /dev/stdout``): then
    it is only written, never read or cut.

    ``fsync`` also survives a power cut, at the cost of a disk sync per line."""

    def __init__(self, path: Path, fsync: bool = False) -> None:
        self.path = path
        try:
            regular = stat.S_ISREG(os.stat(path).st_mode)
        except FileNotFoundError:
            regular = True
        if regular and path.exists() and path.stat().st_size:
            with path.open("rb") as existing:
                existing.seek(-1, os.SEEK_END)
                if existing.read(1) != b"\n":
                    raise UserError(f"{path} ends in a partial line (a killed run?); resume to repair it")
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        except OSError as exc:
            raise UserError(f"cannot write {path} ({exc.strerror}); pass -o a file you can write") from exc
        self._regular = regular
        self._end = os.fstat(self._fd).st_size if regular else 0  # the last whole line ends here
        self._fsync = fsync
        self._failed: OutputFailed | None = None

    def write(self, record: dict[str, Any]) -> None:
        """Serialise first (``ValueError`` on NaN leaves the file as it was), then write."""
        data = (dumps(record) + "\n").encode("utf-8")
        if self._failed is not None:
            raise self._failed
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            if self._fsync:
                os.fsync(self._fd)
        except OSError as exc:
            self._failed = self._failure(exc)
            raise self._failed from exc
        self._end += len(data)

    def _failure(self, exc: OSError) -> OutputFailed:
        if exc.errno == errno.EPIPE:  # the reader of -o /dev/stdout went away (| head)
            return OutputFailed(f"{self.path} was closed by its reader", quiet=True)
        if self._regular:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._end)  # no partial line left behind
        return OutputFailed(
            f"cannot write {self.path} ({exc.strerror or exc}); every record in it is whole: "
            "make room and rerun with the same -o to resume"
        )

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Appender:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()
