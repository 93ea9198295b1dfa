"""The run log: every generate and speculate kept whole (prompt, settings, seed, text, summary and
each token's record), never at the cost of the run, safe with several writers at once."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from llmsample.logs import store
from llmsample.logs.store import LoggedRun
from tests.conftest import cli_env


def run(model: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "llmsample", "generate", "-m", str(model), "--raw", "-n", "5", "--ignore-eos",
               *args]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, env=cli_env(**env), timeout=300)


def test_every_run_is_kept_whole_newest_first(tiny_model_dir: Path) -> None:
    first = run(tiny_model_dir, "-p", "w3 w4", "--seed", "7", "--top-k", "9", "-q")
    second = run(tiny_model_dir, "-p", "w5", "--format", "jsonl", "-q")
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    newest, oldest = store.recent(10)
    assert (oldest.prompt, oldest.seed, oldest.settings["top_k"], oldest.command) == ("w3 w4", 7, 9, "generate")
    assert oldest.text == first.stdout.rstrip("\n") and oldest.tokens == len(oldest.records) == 5
    lines = [json.loads(line) for line in second.stdout.splitlines()]
    assert newest.records == lines[:-1]  # each token's record as --format jsonl wrote it
    assert newest.seed == lines[-1]["seed"] and newest.summary["stop_reason"] == "length"
    assert store.get(newest.id) == newest and store.get(10**6) is None
    holding = [r.id for r in (newest, oldest) if "w3 w4" in r.prompt + " " + r.text]  # the second's text may too
    assert oldest.id in holding and [r.id for r in store.recent(10, search="W3 W4")] == holding  # any case
    assert store.database_path().stat().st_mode & 0o777 == 0o600  # prompts are private


@pytest.mark.parametrize("how", ["--no-log", "LLMSAMPLE_NO_LOG", "logs-off"])
def test_a_run_the_user_keeps_out_is_not_kept(tiny_model_dir: Path, how: str) -> None:
    if how == "logs-off":
        store.off_switch().parent.mkdir(parents=True)
        store.off_switch().touch()
    done = run(tiny_model_dir, "-p", "w3", "-q", *(["--no-log"] if how == "--no-log" else []),
               **({"LLMSAMPLE_NO_LOG": "1"} if how == "LLMSAMPLE_NO_LOG" else {}))  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip()
    assert not store.database_path().exists()


@pytest.mark.parametrize("broken", ["a file where its folder should be", "not a database"])
def test_a_log_that_cannot_be_written_costs_a_warning_never_the_run(tiny_model_dir: Path, tmp_path: Path,
                                                                      broken: str) -> None:  # fmt: skip
    blocker = tmp_path / "blocker"
    blocker.write_bytes(b"x" * 4096)  # a regular file: nothing can be made under it, and it is no database
    path = blocker / "logs.db" if broken.startswith("a file") else blocker
    done = run(tiny_model_dir, "-p", "w3", "--seed", "1", LLMSAMPLE_LOGS=str(path))
    assert done.returncode == 0 and len(done.stdout.split()) == 5
    warnings = [line for line in done.stderr.splitlines() if line.startswith("Warning: the run was not logged")]
    assert len(warnings) == 1 and "Traceback" not in done.stderr
    assert ("move it aside (mv" in warnings[0]) == (broken == "not a database")  # a damaged log: the way out


WRITER = """
import sys
from llmsample.logs.store import LoggedRun, add
for i in range(25):
    add(LoggedRun("generate", "m", None, "p", i, f"prompt {sys.argv[1]}-{i}", None, {}, "text", "length", 1, {}, [{}]))
"""


def test_several_writers_at_once_lose_nothing(tmp_path: Path) -> None:
    env = cli_env(LLMSAMPLE_LOGS=str(tmp_path / "logs.db"))
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(n)], env=env, stderr=subprocess.PIPE)
               for n in range(6)]  # fmt: skip
    assert all(w.wait(timeout=120) == 0 for w in writers), [w.stderr.read() for w in writers]
    runs = store.recent(1000, path=tmp_path / "logs.db")
    assert len(runs) == 150 and len({r.prompt for r in runs}) == 150 and len({r.id for r in runs}) == 150


def test_a_database_locked_while_another_writer_closes_is_tried_again(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """SQLite refuses a change of journal mode at once, without its busy wait, while the last writer
    before it checkpoints and closes (seen with six writers at once): the connection tries again."""
    prepare, refusals = store._prepare, []

    def refused_twice(db) -> None:
        if len(refusals) < 2:
            refusals.append(1)
            raise sqlite3.OperationalError("database is locked")
        prepare(db)

    monkeypatch.setattr(store, "_prepare", refused_twice)
    store.add(LoggedRun("generate", "m", None, None, 1, "p", None, {}, "t", "length", 1, {}, [{}]), tmp_path / "l.db")
    assert len(refusals) == 2 and len(store.recent(5, path=tmp_path / "l.db")) == 1
    monkeypatch.setattr(store, "_prepare", lambda db: (_ for _ in ()).throw(sqlite3.OperationalError("disk I/O error")))
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):  # anything else is not waited out
        store.add(LoggedRun("generate", "m", None, None, 1, "p", None, {}, "t", "length", 1, {}, [{}]), tmp_path / "l.db")


def logs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmsample", "logs", *args], capture_output=True, text=True,
                          env=cli_env(), timeout=120)  # fmt: skip


def test_logs_lists_searches_and_shows_a_run_as_it_was_printed(tiny_model_dir: Path, tmp_path: Path) -> None:
    page = tmp_path / "run.html"
    printed = run(tiny_model_dir, "-p", "w3 w4", "--seed", "3", "--format", "jsonl", "--html", str(page), "-q")
    assert printed.returncode == 0, printed.stderr
    (kept,) = store.recent(5)
    listed = logs("list", "--format", "jsonl")
    assert [json.loads(line)["id"] for line in listed.stdout.splitlines()] == [kept.id]
    assert f"{kept.id}" in logs().stdout and '"w3 w4"' in logs("search", "W3 w4").stdout
    assert logs("search", "nowhere").stdout == ""
    again = logs("show", str(kept.id), "--format", "jsonl", "--html", str(tmp_path / "again.html"))
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[:-1] == printed.stdout.splitlines()[:-1]  # the same token lines
    assert json.loads(again.stdout.splitlines()[-1])["text"] == json.loads(printed.stdout.splitlines()[-1])["text"]
    assert (tmp_path / "again.html").read_text() == page.read_text()  # the same page, prompt and settings included
    missing = logs("show", "999")
    assert missing.returncode == 2 and missing.stdout == "" and "no run 999 in the log" in missing.stderr


def test_logs_off_and_on(tiny_model_dir: Path) -> None:
    assert logs("off").returncode == 0 and store.off_switch().exists()
    assert run(tiny_model_dir, "-p", "w3", "-q").returncode == 0 and store.recent(5) == []
    assert "not being kept" in logs().stderr
    assert logs("on").returncode == 0 and not store.off_switch().exists()
    assert run(tiny_model_dir, "-p", "w3", "-q").returncode == 0 and len(store.recent(5)) == 1
    assert logs("path").stdout.strip() == str(store.database_path())
