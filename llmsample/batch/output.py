"""The ``-o`` file of a batch: claimed by one run at a time, checked before the model loads, and
always left with one record per request in input order, whatever killed the runs before.

- **Claim** (``claim_output``): the path is resolved (a symlink's target is the file), then a
  regular file (or one to create) is locked with ``flock`` on ``OUT.lock`` beside it, which
  also proves the folder writable. A second run on the same output is refused in one line
  naming the holder; the kernel drops the lock when its process dies, so a lock file that a
  killed run left behind blocks nothing. Anything that is not a regular file (a pipe,
  ``/dev/stdout``, a device) is only written: never read, resumed, locked or rewritten.
- **Consolidate** (``consolidate``): the output and every part file beside it
  (``OUT.part-R-of-N``, from ranks of a torchrun run) become one file in input order, with
  each result once (the first wins) and, on resume, no error records (they are retried). It
  is written next to the output, synced and renamed over it, and only then are the parts
  removed: a crash at any point leaves the old output or the new one, and parts that outlive
  the rename only repeat records the next consolidation drops again.
"""

from __future__ import annotations

import contextlib
import glob
import os
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmsample.batch.requests import Request, RequestError
from llmsample.batch.resume import OutputFormat, read_records
from llmsample.errors import OutputFailed, UserError

try:
    import fcntl
except ImportError:  # Windows: no flock; runs are not locked there
    fcntl = None  # type: ignore[assignment]


def existing_parts(output: Path) -> list[Path]:
    """Every part file of this output, from this run's ranks or an earlier run's."""
    return sorted(output.parent.glob(f"{glob.escape(output.name)}.part-*-of-*"))


def lock_path(output: Path) -> Path:
    return output.with_name(f"{output.name}.lock")


@dataclass
class OutputClaim:
    """An output path checked for writing: ``path`` is where it really is, ``regular`` whether
    it can be resumed and rewritten; ``release`` lets the next run have it."""

    given: Path
    path: Path
    regular: bool
    _lock: int | None = field(default=None, repr=False)

    def release(self) -> None:
        if self._lock is None:
            return
        with contextlib.suppress(OSError):  # unlinked while still held: nobody can be waiting on it
            lock_path(self.path).unlink()
        os.close(self._lock)
        self._lock = None


def resolve_output(given: Path) -> tuple[Path, bool]:
    """The real path of ``-o`` (a symlink's target) and whether it is, or will be, a regular
    file; anything else (``/dev/stdout``, a pipe, a device) is written through ``given``."""
    try:
        mode = os.stat(given).st_mode
    except FileNotFoundError:
        return Path(os.path.realpath(given)), True
    except OSError as exc:
        raise UserError(f"cannot write {given} ({exc.strerror})") from exc
    if stat.S_ISDIR(mode):
        raise UserError(f"{given} is a directory; pass -o a file")
    if not stat.S_ISREG(mode):
        return given, False
    return Path(os.path.realpath(given)), True


def claim_output(given: Path) -> OutputClaim:
    """Check that ``-o`` can be written and lock it for this run (see the module docstring).
    Raises ``UserError`` (exit 2) when it cannot be written or another run holds it."""
    path, regular = resolve_output(given)
    if not regular:
        return OutputClaim(given, path, regular=False)
    if not path.parent.is_dir():
        raise UserError(f"cannot write {given}: the folder {path.parent} does not exist")
    claim = OutputClaim(given, path, regular=True, _lock=_lock(given, path))
    try:
        if path.exists():
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
        _remove_stale_temporaries(path)
    except OSError as exc:
        claim.release()
        raise UserError(f"cannot write {given} ({exc.strerror}); pass -o a file you can write") from exc
    return claim


def _lock(given: Path, path: Path) -> int | None:
    lock = lock_path(path)
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as exc:
            raise UserError(
                f"cannot write in {path.parent} ({exc.strerror}); pass -o a file in a folder you can write"
            ) from exc
        if fcntl is None:  # the folder is writable; runs are not locked here
            os.close(fd)
            lock.unlink(missing_ok=True)
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise UserError(
                f"{given} is being written by another llmsample batch ({holder}); "
                "wait for it to end, or pass another -o"
            ) from None
        try:
            current = os.stat(lock)
        except FileNotFoundError:
            current = None
        held = os.fstat(fd)
        if current is not None and (current.st_ino, current.st_dev) == (held.st_ino, held.st_dev):
            break
        os.close(fd)  # the run before removed the file between our open and our lock: again
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    return fd


def _holder(fd: int, wait: float = 2.0) -> str:
    """The pid line of the run holding the lock: a run that has just taken it writes that line
    a moment later, so an empty file is read again for up to ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while not (text := os.pread(fd, 200, 0).decode("utf-8", "replace").strip()):
        if time.monotonic() > deadline:
            return "starting"
        time.sleep(0.01)
    return text


def _remove_stale_temporaries(path: Path) -> None:
    """What a run killed in the middle of a rewrite left (never the output itself)."""
    name = glob.escape(path.name)
    for pattern in (f".{name}.*.merge", f".{name}.*.resume"):
        for stale in path.parent.glob(pattern):
            stale.unlink(missing_ok=True)


@dataclass(frozen=True)
class Consolidated:
    """What the output holds once consolidated."""

    done: frozenset[str]  # custom_ids with a result record
    last: int | None  # the highest input line among its records (None: it is empty)
    rewritten: bool

    def in_order_after(self, parsed: Sequence[Request | RequestError]) -> bool:
        """Whether appending the requests not done keeps the file in input order."""
        todo = [item.line for item in parsed if not (isinstance(item, Request) and item.custom_id in self.done)]
        return self.last is None or not todo or min(todo) > self.last


def consolidate(
    output: Path, parsed: Sequence[Request | RequestError], fmt: OutputFormat, *, keep_errors: bool
) -> Consolidated:
    """Merge the output and its part files into the output, in input order, one record per
    request, and remove the parts (see the module docstring). ``keep_errors``: a finished run's
    merge keeps its error records; a resume drops them, to retry those requests. A file that is
    already so is left as it is (a torn last line is cut in place)."""
    order: dict[str, int] = {}
    for item in parsed:
        if item.custom_id is not None:
            order.setdefault(item.custom_id, item.line)
    parts = existing_parts(output)
    kept: list[tuple[int, int, bytes]] = []
    results: set[str] = set()
    errors: set[int] = set()
    changed = bool(parts)
    torn = end = 0
    for source in (output, *parts):
        records = read_records(source, fmt)
        if source == output:
            torn, end = records.torn, records.end
        for line, record, result in records.lines:
            position = record_position(record, result, order)
            if result is not None and result not in results:
                results.add(result)
            elif result is None and keep_errors and position not in errors:
                errors.add(position)
            else:
                changed = True  # a duplicate, or an error to retry
                continue
            kept.append((position, len(kept), line))
    positions = [position for position, _, _ in kept]
    changed = changed or positions != sorted(positions)
    if changed:
        _replace(output, [line for _, _, line in sorted(kept)], parts)
        for part in parts:
            part.unlink(missing_ok=True)
    elif torn:
        os.truncate(output, end)
    return Consolidated(frozenset(results), max(positions, default=None), changed)


def record_position(record: dict[str, Any], result: str | None, order: dict[str, int]) -> int:
    """The input line of a record's request. A result: the first line with its custom_id (else
    the line it names); an error: the line ours carries and OpenAI's message starts with (two
    lines may share a custom_id, the later one an error)."""
    if result is not None and result in order:
        return order[result]
    if isinstance(record.get("line"), int):
        return record["line"]
    error = record.get("error")
    message = error.get("message", "") if isinstance(error, dict) else ""
    number = str(message).removeprefix("line ").split(":", 1)[0]
    if number.isdigit():
        return int(number)
    return order.get(str(record.get("custom_id")), sys.maxsize)  # not this input's: at the end


def _replace(output: Path, lines: list[bytes], parts: list[Path]) -> None:
    """Write ``lines`` next to ``output``, sync, and rename over it: all of it or nothing."""
    fd, temp = tempfile.mkstemp(dir=output.parent, prefix=f".{output.name}.", suffix=".merge")
    try:
        try:
            view = memoryview(b"".join(lines))
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        template = output if output.exists() else next((part for part in parts if part.exists()), None)
        if template is not None:
            os.chmod(temp, stat.S_IMODE(template.stat().st_mode))
        os.replace(temp, output)
    except OSError as exc:
        Path(temp).unlink(missing_ok=True)
        raise OutputFailed(
            f"cannot write {output} ({exc.strerror or exc}); it is as it was: make room and rerun to finish it"
        ) from exc
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    _sync_folder(output.parent)


def _sync_folder(folder: Path) -> None:
    """The rename on disk before the parts go (a power cut must not lose both)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
