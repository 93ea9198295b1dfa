"""A run log that is damaged (garbage bytes, a file cut short), empty, or on a read-only
filesystem: the commands that read it (``logs``, ``logs list/show/search``, ``generate
--replay``, ``chat -c``) say one line naming the file and the way out (exit 2), list nothing,
or read it without writing, never a traceback."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmsample.cli import main
from llmsample.logs import store
from tests.conftest import cli_env

READERS = [["logs"], ["logs", "list"], ["logs", "search", "w3"], ["logs", "show", "LAST"], ["generate", "--replay", "LAST"],
           ["chat", "-c"]]  # fmt: skip


def keep_runs(model: Path, count: int) -> int:
    """``count`` real runs in the log (the first through the CLI, the rest its copies); the last id."""
    done = CliRunner().invoke(main, ["generate", "-m", str(model), "--raw", "-p", "w3 w4", "-n", "4", "--seed", "1",
                                     "-q", "--device", "cpu"])  # fmt: skip
    assert done.exit_code == 0, done.output
    (run,) = store.recent(1)
    store.add_all([run] * (count - 1))
    return run.id + count - 1


def invoke(args: list[str], last: int):
    return CliRunner().invoke(main, [str(last) if a == "LAST" else a for a in args], input="")


@pytest.mark.parametrize("args", READERS, ids=" ".join)
@pytest.mark.parametrize("damage", ["garbage", "cut short"])
def test_a_damaged_log_is_one_line_naming_it_and_the_way_out(
    tiny_model_dir: Path, args: list[str], damage: str
) -> None:  # fmt: skip
    last = keep_runs(tiny_model_dir, 60)
    path = store.database_path()
    data = path.read_bytes()
    path.write_bytes(bytes(range(256)) * 32 if damage == "garbage" else data[: len(data) // 2])
    done = invoke(args, last)
    assert done.exit_code == 2, done.output
    assert done.stdout == "" and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"Error: the run log {path} is damaged (")
    assert f"move it aside (mv {path} {path}.damaged) and the next run starts a new one" in done.stderr


@pytest.mark.parametrize("args", READERS[:3], ids=" ".join)
def test_a_log_made_but_never_written_lists_nothing(args: list[str]) -> None:
    store.database_path().parent.mkdir(parents=True)
    store.database_path().write_bytes(b"")  # a writer made the file and failed before its table
    done = invoke(args, 1)
    assert done.exit_code == 0 and done.stdout == "", done.output


def test_reading_opens_the_log_read_only(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    last = keep_runs(tiny_model_dir, 2)
    opened: list[str] = []
    connect = sqlite3.connect

    def watched(database: str, *args: object, **kwargs: object) -> sqlite3.Connection:
        opened.append(str(database))
        return connect(database, *args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", watched)
    for args in READERS[:4]:
        assert invoke(args, last).exit_code == 0
    assert len(opened) == 4 and all(name.startswith("file://") and name.endswith("?mode=ro") for name in opened)


@pytest.mark.slow
def test_a_log_on_a_read_only_filesystem_lists_and_shows(tiny_model_dir: Path) -> None:
    """A real read-only mount (a mount namespace of its own: root, or user namespaces)."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to mount a read-only filesystem")
    last = keep_runs(tiny_model_dir, 2)
    folder = store.database_path().parent
    llmsample = f"{sys.executable} -m llmsample"
    script = (f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} || exit 99; "
              f"touch {folder}/probe 2>/dev/null && exit 98; {llmsample} logs list && {llmsample} logs show {last}")  # fmt: skip
    flags = ["-m"] if os.geteuid() == 0 else ["-rm"]  # root, or root in a user namespace of its own
    done = subprocess.run(["unshare", *flags, "sh", "-c", script], capture_output=True, text=True, env=cli_env(),
                          timeout=120)  # fmt: skip
    if done.returncode == 99 or done.stderr.startswith("unshare:"):
        pytest.skip(f"cannot mount a read-only filesystem here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count('"w3 w4"') == 2 and "Traceback" not in done.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["logs.db"]  # nothing written beside it
