"""Where this user's engines are: one JSON record per engine, written atomically beside its Unix
socket in a directory only the user can enter (``$XDG_RUNTIME_DIR/llmsample``, else a 0700
directory of the user's under the temporary directory). An engine is known by the load options it
was started with (its *spec*): a command with the same ones finds it. A record whose process is
gone is stale: it and its socket are removed, and it counts as no engine."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from llmsample.errors import UserError
from llmsample.jobs import Capabilities

SPEC_KEYS = ("model", "device", "dtype", "backend", "quantize", "deterministic")
"""The load options that make two engines different (an engine refuses the others: placement,
``--compile``, ``--tp``). ``--deterministic`` is one: such an engine computes every row alone,
so its numbers are the in-process ``--deterministic`` run's, and a plain command's are not."""


def runtime_path() -> Path:
    """Where the user's engines are (it may not exist yet)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    return Path(base) / "llmsample" if base else Path(tempfile.gettempdir()) / f"llmsample-{os.getuid()}"


def runtime_dir() -> Path:
    """The user's engine directory (created 0700); one line when it is not the user's own."""
    path = runtime_path()
    base = os.environ.get("XDG_RUNTIME_DIR")
    try:
        path.mkdir(mode=0o700, parents=bool(base), exist_ok=True)
        info = path.lstat()
    except OSError as exc:
        raise UserError(f"cannot use {path} for engines ({exc.strerror})") from None
    if info.st_uid != os.getuid() or info.st_mode & 0o077 or not path.is_dir() or path.is_symlink():
        raise UserError(f"{path} is not a private directory of this user (0700); remove it or set XDG_RUNTIME_DIR")
    return path


def spec_of(options: dict[str, Any]) -> dict[str, Any]:
    """The engine identity of a command's options: a local model directory by its real path."""
    spec = {key: options.get(key) for key in SPEC_KEYS}
    model = spec["model"]
    if model is not None and os.path.isdir(model):
        spec["model"] = os.path.realpath(model)
    spec["backend"] = spec["backend"] or "auto"
    spec["dtype"] = spec["dtype"] or "auto"
    spec["device"] = spec["device"] or "auto"
    spec["deterministic"] = bool(spec["deterministic"])
    return spec


def draft_of(options: dict[str, Any]) -> str | None:
    """``--draft`` as an engine's capability: a draft model (a local one by its real path) or
    ``suffix``; None for none, ``ngram`` (a row's own drafter, which any engine runs) or
    ``auto`` (what the engine drafts with by default)."""
    draft = options.get("draft")
    if draft in (None, "ngram", "auto", "none"):
        return None
    return os.path.realpath(draft) if os.path.exists(draft) else draft


def engine_id(spec: dict[str, Any]) -> str:
    """Short (a Unix socket's path holds at most 107 bytes) and the same for the same spec."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class EngineRecord:
    """A running engine as its process wrote it once the model was loaded."""

    id: str
    pid: int
    spec: dict[str, Any]
    name: str  # the model's name as the engine reports it
    backend: str  # the backend it loaded (transformers, llama.cpp or torch)
    dtype: str
    device: str
    socket: str
    version: str
    keep_alive_s: float | None
    started: float
    draft: str | None = None  # what it drafts with beyond a row's own (--draft MODEL or suffix)
    reference: bool = False  # it holds a reference model (--reference)

    @property
    def where(self) -> str:
        return f"unix:{self.socket}"

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(self.draft, self.reference)

    @property
    def deterministic(self) -> bool:
        """Started with ``--deterministic`` (every row computed alone)."""
        return bool(self.spec.get("deterministic"))


def record_path(directory: Path, ident: str) -> Path:
    return directory / f"{ident}.json"


SOCKET_PATH_MAX = 107 if sys.platform.startswith("linux") else 103
"""The longest path a Unix socket can be bound at, in bytes (``sun_path`` less its last byte)."""


def socket_path(directory: Path, ident: str) -> Path:
    """Engine ``ident``'s socket in ``directory``; a directory too deep for one is one line naming
    it and the variable that chose it (before anything loads)."""
    path = directory / f"{ident}.sock"
    size = len(os.fsencode(path))
    if size > SOCKET_PATH_MAX:
        variable = "XDG_RUNTIME_DIR" if os.environ.get("XDG_RUNTIME_DIR") else "TMPDIR (or XDG_RUNTIME_DIR)"
        raise UserError(f"an engine's socket in {directory} would be {size} bytes long, over the {SOCKET_PATH_MAX} a "
                        f"Unix socket takes; set {variable} to a shorter directory")  # fmt: skip
    return path


def write_record(directory: Path, record: EngineRecord) -> None:
    """Atomically: a reader sees the whole record or none."""
    final = record_path(directory, record.id)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{record.id}.", suffix=".tmp")
    with os.fdopen(handle, "w") as out:
        json.dump(asdict(record), out)
    os.replace(temporary, final)


def remove_record(directory: Path, ident: str, pid: int | None = None) -> None:
    """The record and socket of engine ``ident`` (only ``pid``'s, when given: a newer engine of
    the same spec may have replaced them)."""
    path = record_path(directory, ident)
    if pid is not None:
        current = _read(path)
        if current is not None and current.pid != pid:
            return
    for stale in (path, socket_path(directory, ident)):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process of this user's (a zombie, never reaped where no init
    reaps orphans, has ended)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone, or someone else's process holds the pid now
        return False
    return _state(pid) != "Z"  # no /proc here (None): the signal's answer stands


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, Ctrl-Z, a debugger): alive, and answering nothing."""
    return _state(pid) in ("T", "t")


def _state(pid: int) -> str | None:
    """The process's state letter from ``/proc`` (Linux); None where it cannot be read."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def answers(path: str) -> bool:
    """Whether an engine listens on the socket at ``path`` (a dead one's refuses connections)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2)
    try:
        probe.connect(path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


def _read(path: Path) -> EngineRecord | None:
    try:
        data = json.loads(path.read_text())
        return EngineRecord(**data)
    except (OSError, ValueError, TypeError):
        return None


def engines(directory: Path | None = None) -> Iterator[EngineRecord]:
    """The live engines; stale records (process gone, socket gone, unreadable) are removed."""
    directory = directory or runtime_dir()
    for path in sorted(directory.glob("*.json")):
        record = _read(path)
        if record is None:
            if time.time() - _mtime(path) > 60:  # not one being written right now
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            continue
        if not alive(record.pid) or not answers(record.socket):
            remove_record(directory, record.id, record.pid)
            continue
        yield record


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()


def find(spec: dict[str, Any], directory: Path | None = None) -> EngineRecord | None:
    """The live engine started with ``spec``, if any."""
    wanted = engine_id(spec)
    return next((record for record in engines(directory) if record.id == wanted), None)
