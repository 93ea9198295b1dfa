"""The log database: one row per run in SQLite (WAL, so several shells, a batch and a server write
at once), under ``$XDG_DATA_HOME/llmsample/logs.db``. On unless ``--no-log``, ``LLMSAMPLE_NO_LOG``
or ``llmsample logs off`` (a file beside the presets, as llm keeps its ``logs-off``)."""

from __future__ import annotations

import json
import os
import shlex
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from llmsample.errors import RuntimeFailure, UserError

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    started TEXT NOT NULL,
    command TEXT NOT NULL,
    model TEXT NOT NULL,
    backend TEXT,
    preset TEXT,
    seed INTEGER,
    prompt TEXT NOT NULL,
    system TEXT,
    settings TEXT NOT NULL,
    text TEXT NOT NULL,
    stop_reason TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    summary TEXT NOT NULL,
    records TEXT NOT NULL,
    conversation TEXT,
    parent INTEGER,
    flags TEXT
);
CREATE INDEX IF NOT EXISTS runs_started ON runs (started);
"""
ADDED = {"conversation": "TEXT", "parent": "INTEGER", "flags": "TEXT"}  # columns a log made before them lacks
KINDS = ("generate", "speculate", "chat", "batch", "serve")  # the command column: what kept the run
BUSY_MS = 5000  # a writer waits this long for another one's transaction before giving up
T = TypeVar("T")
DAMAGED = ("SQLITE_CORRUPT", "SQLITE_NOTADB")  # a file that is no database, or one cut short


def database_path() -> Path:
    """``$LLMSAMPLE_LOGS`` if set, else ``$XDG_DATA_HOME/llmsample/logs.db`` (``~/.local/share``)."""
    if os.environ.get("LLMSAMPLE_LOGS"):
        return Path(os.environ["LLMSAMPLE_LOGS"])
    xdg = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(xdg) / "llmsample" / "logs.db"


def off_switch() -> Path:
    xdg = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(xdg) / "llmsample" / "logs-off"


def logging_on() -> bool:
    """Runs are kept unless ``LLMSAMPLE_NO_LOG`` is set (non-empty) or ``llmsample logs off`` was said
    (a config directory that cannot be read says nothing: the run tries, and warns if it cannot)."""
    if os.environ.get("LLMSAMPLE_NO_LOG"):
        return False
    try:
        return not off_switch().exists()
    except OSError:
        return True


@dataclass(frozen=True)
class LoggedRun:
    """One run as kept: what was asked, what came out, and every token's record (JSON objects)."""

    command: str
    model: str
    backend: str | None
    preset: str | None
    seed: int | None
    prompt: str
    system: str | None
    settings: dict[str, Any]
    text: str
    stop_reason: str
    tokens: int
    summary: dict[str, Any]
    records: list[dict[str, Any]]
    conversation: str | None = None  # a chat's turns share it
    parent: int | None = None  # a chat turn: the run of the reply before it in its conversation
    flags: dict[str, Any] | None = None  # the command's flags beyond the settings (--raw, --ignore-eos...)
    id: int | None = None
    started: str = ""


@contextmanager
def connect(path: Path | None = None) -> Iterator[sqlite3.Connection]:
    """The database, made on first use (mode 0600: prompts are private), in WAL mode; closed after."""
    path = path or database_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    db = sqlite3.connect(path, timeout=BUSY_MS / 1000, isolation_level=None)
    db.row_factory = sqlite3.Row
    try:
        _patiently(lambda: _prepare(db))
        yield db
    finally:
        db.close()


def _reading(query: Callable[[sqlite3.Connection], T], empty: T, path: Path | None = None) -> T:
    """``query``'s answer from the log opened read-only, as a command that only reads it needs
    (a read-only file or filesystem still lists); ``empty`` where there is no log or no run yet.
    A file that is no database (corrupt, truncated) is one line naming it and the way out."""
    path = path or database_path()
    if not path.exists():
        return empty
    try:
        try:
            return _query(path, "mode=ro", query)
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorname != "SQLITE_CANTOPEN":
                raise
            # a WAL log is read beside a -shm file; where none can be made (a read-only filesystem),
            # nothing writes the log either: read it as it stands
            return _query(path, "immutable=1", query)
    except sqlite3.DatabaseError as exc:
        if "no such table" in str(exc):  # made, never written (its first writer failed)
            return empty
        if exc.sqlite_errorname in DAMAGED:
            raise UserError(f"the run log {path} is damaged ({exc}); {way_out(path)}") from None
        raise RuntimeFailure(f"cannot read the run log {path} ({exc})") from None


def way_out(path: Path) -> str:
    """What to do with a damaged log: a new one is made where it was."""
    aside = f"mv {shlex.quote(str(path))} {shlex.quote(f'{path}.damaged')}"
    return f"move it aside ({aside}) and the next run starts a new one"


def _query(path: Path, mode: str, query: Callable[[sqlite3.Connection], T]) -> T:
    db = sqlite3.connect(f"{path.absolute().as_uri()}?{mode}", uri=True, timeout=BUSY_MS / 1000)
    db.row_factory = sqlite3.Row
    try:
        return query(db)
    finally:
        db.close()


def _prepare(db: sqlite3.Connection) -> None:
    """WAL mode (set only where the file is not in it yet), the schema and any missing column."""
    if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")  # WAL stays whole; a power cut may lose the last run
    db.executescript(SCHEMA)
    _add_columns(db)


def _patiently(step: Callable[[], None]) -> None:
    """Run ``step`` again while the database is locked, for up to ``BUSY_MS``: SQLite answers a
    change of journal mode at once, without waiting, while the last writer before it closes."""
    deadline = time.monotonic() + BUSY_MS / 1000
    while True:
        try:
            return step()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _add_columns(db: sqlite3.Connection) -> None:
    """A log written before a column existed gains it (null in its old runs)."""
    have = {row["name"] for row in db.execute("PRAGMA table_info(runs)")}
    for name, kind in ADDED.items():
        if name not in have:
            try:
                db.execute(f"ALTER TABLE runs ADD COLUMN {name} {kind}")
            except sqlite3.OperationalError as exc:  # another writer added it between the look and now
                if "duplicate column" not in str(exc):
                    raise


def add(run: LoggedRun, path: Path | None = None) -> int:
    """Keep ``run``; its id. One transaction: a run is in the log whole or not at all."""
    return add_all([run], path)[0]


def add_all(runs: list[LoggedRun], path: Path | None = None) -> list[int]:
    """Keep ``runs`` in one transaction (a batch's finished requests, a server's): their ids."""
    ids = []
    with connect(path) as db:
        db.execute("BEGIN IMMEDIATE")
        try:
            for run in runs:
                cursor = db.execute(
                    "INSERT INTO runs (started, command, model, backend, preset, seed, prompt, system, settings, "
                    "text, stop_reason, tokens, summary, records, conversation, parent, flags) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    _values(run),
                )
                ids.append(int(cursor.lastrowid or 0))
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
    return ids


def _values(run: LoggedRun) -> tuple[Any, ...]:
    started = run.started or datetime.now(UTC).isoformat(timespec="seconds")
    return (
        started, run.command, run.model, run.backend, run.preset, run.seed, run.prompt, run.system,
        _json(run.settings), run.text, run.stop_reason, run.tokens, _json(run.summary),
        "\n".join(_json(record) for record in run.records), run.conversation, run.parent,
        None if run.flags is None else _json(run.flags),
    )  # fmt: skip


def recent(limit: int, search: str | None = None, path: Path | None = None) -> list[LoggedRun]:
    """The newest runs first; ``search``: those whose prompt or text holds it (case-insensitive)."""
    where, args = "", [limit]
    if search:
        where, args = "WHERE instr(lower(prompt), lower(?)) OR instr(lower(text), lower(?))", [search, search, limit]
    rows = _reading(lambda db: db.execute(f"SELECT * FROM runs {where} ORDER BY id DESC LIMIT ?", args).fetchall(),
                    [], path)  # fmt: skip
    return [_run(row) for row in rows]


def last_conversation(path: Path | None = None) -> list[LoggedRun]:
    """The newest chat turn and the turns before it in its conversation (by ``parent``), oldest
    first: the conversation as it stood at its last reply; empty when no chat was kept."""

    def chain(db: sqlite3.Connection) -> list[LoggedRun]:
        row = db.execute("SELECT * FROM runs WHERE command = 'chat' ORDER BY id DESC LIMIT 1").fetchone()
        turns = []
        while row is not None and len(turns) < 100000:
            turns.append(_run(row))
            parent = turns[-1].parent
            row = None if parent is None else db.execute("SELECT * FROM runs WHERE id = ?", (parent,)).fetchone()
        return turns

    return _reading(chain, [], path)[::-1]


def get(run_id: int, path: Path | None = None) -> LoggedRun | None:
    row = _reading(lambda db: db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone(), None, path)
    return _run(row) if row is not None else None


def _run(row: sqlite3.Row) -> LoggedRun:
    data = dict(row)
    records = [json.loads(line) for line in data.pop("records").splitlines() if line]
    settings, summary = json.loads(data.pop("settings")), json.loads(data.pop("summary"))
    flags = data.pop("flags", None)  # a log from before the column: read as it is
    flags = None if flags is None else json.loads(flags)
    return LoggedRun(**data, flags=flags, settings=settings, summary=summary, records=records)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)
