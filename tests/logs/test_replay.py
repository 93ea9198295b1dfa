"""``generate --replay`` and the runs the other commands keep: a logged run decoded again says
whether it matched, or where and why it parts; batch requests are runs of their own; a log that
is read-only or from before the newer columns never fails a run."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

from llmsample.events import Candidate, TokenEvent
from llmsample.logs import store
from llmsample.logs.rerun import where_they_part
from tests.conftest import cli_env
from tests.logs.test_store import run


def event(token: int, prob: float, alternatives: dict[int, float]) -> TokenEvent:
    top = tuple(Candidate(t, f"w{t}", p, p) for t, p in alternatives.items())
    return TokenEvent(index=0, token_id=token, text=f" w{token}", prob=prob, model_prob=prob, model_rank=1,
                      entropy=1.0, top=top, removed={})  # fmt: skip


def test_where_two_runs_part_and_why() -> None:
    saved = [(5, " w5", 0.5), (6, " w6", 0.25), (7, " w7", 0.125)]
    same = [event(5, 0.5, {5: 0.5}), event(6, 0.25, {6: 0.25}), event(7, 0.125, {7: 0.125})]
    assert where_they_part(saved, same, "length") is None
    drawn = [same[0], event(9, 0.3, {9: 0.3, 6: 0.25})]
    assert where_they_part(saved, drawn, "length") == (
        "token 1: saved ' w6' (id 6), replayed ' w9' (id 9); the saved token has the same p 0.25: the same "
        "distribution, another draw (the seed)"
    )
    moved = [same[0], event(9, 0.3, {9: 0.3, 6: 0.2})]
    assert "the saved token had p 0.25 and has p 0.2: the numbers differ" in where_they_part(saved, moved, "length")
    gone = [same[0], event(9, 0.3, {9: 0.3, 4: 0.1})]  # p 0.25 would be listed
    assert "not among the replay's alternatives" in where_they_part(saved, gone, "length")
    below = [same[0], event(9, 0.6, {9: 0.6, 4: 0.3})]  # the saved p 0.25 under every listed one
    assert "below the replay's 2 alternatives: a rarer draw" in where_they_part(saved, below, "length")
    assert where_they_part(saved, same[:2], "eos") == (
        "the replay stopped at token 2 (replay: eos); the same tokens before"
    )
    assert where_they_part(saved[:1], same, "length").startswith("the saved run stopped at token 1")


def generate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmsample", "generate", *args], capture_output=True, text=True,
                          env=cli_env(), timeout=300)  # fmt: skip


def test_replay_reruns_a_logged_run_and_says_whether_it_matched(tiny_model_dir: Path) -> None:
    first = run(tiny_model_dir, "-p", "w3 w4", "-t", "1.3", "--seed", "11", "-q")  # --raw, -n 5, --ignore-eos: logged
    assert first.returncode == 0, first.stderr
    (logged,) = store.recent(5)
    assert logged.flags == {"raw": True, "truncate": "error", "ignore_eos": True, "top_n": 5, "ngram_min": 2,
                            "ngram_max": 4}  # fmt: skip
    again = generate("--replay", str(logged.id), "-q")
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout and f"replay of run {logged.id}: matched (5 tokens)" in again.stderr
    reseeded = generate("--replay", str(logged.id), "-q", "--seed", str((logged.seed or 0) + 1))
    line = next(line for line in reseeded.stderr.splitlines() if line.startswith("replay of run"))
    assert "differs at token" in line and "another draw (the seed)" in line, reseeded.stderr
    replayed = store.recent(5)[0]
    assert replayed.id != logged.id and replayed.prompt == logged.prompt  # a replay is a run of its own
    for asked, said in ((str(10**6), f"no run {10**6} in the log"), ("x", "is not a valid integer")):
        refused = generate("--replay", asked)
        assert refused.returncode == 2 and refused.stdout == "" and said in refused.stderr


def test_batch_requests_are_runs_of_their_own(tiny_model_dir: Path, tmp_path: Path) -> None:
    lines = ["w3 w4", '{"prompt": "w5", "seed": 4, "system": "w6"}', '{"prompt": "w7", "temperature": -1}']
    command = [sys.executable, "-m", "llmsample", "batch", "-m", str(tiny_model_dir), "--raw", "-n", "3", "-q"]
    done = subprocess.run(command, input="\n".join(lines), capture_output=True, text=True, env=cli_env(), timeout=300)
    assert done.returncode == 1, done.stderr  # the bad line fails, the others are decoded and kept
    records = [json.loads(line) for line in done.stdout.splitlines()]
    second, first = store.recent(10)
    assert [r.command for r in (first, second)] == ["batch", "batch"]
    assert (first.prompt, second.prompt, second.system, second.seed) == ("w3 w4", "w5", "w6", 4)
    assert [first.text, second.text] == [r["text"] for r in records[:2]] and first.seed == records[0]["seed"]
    assert len(first.records) == first.tokens == 3
    quiet = subprocess.run([*command, "--no-log"], input=lines[0], capture_output=True, text=True, env=cli_env(),
                           timeout=300)  # fmt: skip
    assert quiet.returncode == 0 and len(store.recent(10)) == 2


def test_a_read_only_log_costs_one_warning_and_still_lists(tiny_model_dir: Path) -> None:
    assert run(tiny_model_dir, "-p", "w3", "-q").returncode == 0
    with open(store.database_path(), "r+b") as db:  # read-only for root too: SQLite is told so by the header
        db.seek(18)  # the file format's write version: above 2, SQLite opens the database read-only
        db.write(b"\x03")
    store.database_path().chmod(0o444)
    done = run(tiny_model_dir, "-p", "w4", "--seed", "2")
    assert done.returncode == 0 and len(done.stdout.split()) == 5
    warnings = [line for line in done.stderr.splitlines() if line.startswith("Warning: the run was not logged")]
    assert len(warnings) == 1 and "readonly" in warnings[0] and "Traceback" not in done.stderr
    listed = subprocess.run([sys.executable, "-m", "llmsample", "logs"], capture_output=True, text=True,
                            env=cli_env(), timeout=120)  # fmt: skip
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 1


def test_a_log_from_before_the_newer_columns_reads_and_gains_them(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = store.SCHEMA.replace(",\n    conversation TEXT,\n    parent INTEGER,\n    flags TEXT", "")
    with sqlite3.connect(path) as db:
        db.executescript(old)
        db.execute("INSERT INTO runs (started, command, model, prompt, settings, text, stop_reason, tokens, summary, "
                   "records) VALUES ('t', 'generate', 'm', 'p', '{}', 'x', 'eos', 1, '{}', '{}')")  # fmt: skip
    (kept,) = store.recent(5, path=path)
    assert (kept.prompt, kept.conversation, kept.flags) == ("p", None, None)
    store.add(store.LoggedRun("chat", "m", None, None, 1, "q", None, {}, "y", "eos", 1, {}, [], "c1", kept.id), path)
    assert [(r.conversation, r.parent) for r in store.recent(5, path=path)] == [("c1", kept.id), (None, None)]
