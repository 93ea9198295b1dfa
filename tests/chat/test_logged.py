"""``llmsample chat`` in the run log: each kept reply a run linked to the one before it, ``-c``
continuing the last conversation as it stood (a branch replaces the reply it branched from), and
``--replay`` replaying each logged reply against the saved history, skipping interrupted ones and
saying where and why a reply differs."""

from __future__ import annotations

import json
import sqlite3
import subprocess

from llmsample.logs import store
from tests.chat.conftest import chat_command
from tests.conftest import REPO, cli_env


def chat(model, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(chat_command(model, "-n", "4", "--ignore-eos", "-q", *args), input=stdin,
                          capture_output=True, text=True, timeout=300, env=cli_env(PYTHONPATH=str(REPO)))  # fmt: skip


def test_replies_are_logged_and_c_continues_the_last_conversation(chat_model_dir) -> None:
    first = chat(chat_model_dir, "--seed", "3", stdin="w7 w8\nw9 w10\n/branch 1 #1\n")
    assert first.returncode == 0, first.stderr
    one, two, branched = store.recent(10)[::-1]
    assert [r.command for r in (one, two, branched)] == ["chat"] * 3 and len({one.conversation, two.conversation}) == 1
    assert (one.prompt, two.prompt, branched.prompt) == ("w7 w8", "w9 w10", "w9 w10")
    assert (one.parent, two.parent, branched.parent) == (None, one.id, one.id)  # the branch replaced the second
    assert one.flags == branched.flags == {"ignore_eos": True}  # a replay decodes past EOS as they did
    assert [r.id for r in store.last_conversation()] == [one.id, branched.id]
    assert first.stdout.splitlines()[0].strip() == one.text.strip() and branched.tokens == 4 - 2 + 2

    again = chat(chat_model_dir, "-c", "--replay", stdin="w11\n")
    assert again.returncode == 0, again.stderr
    assert "continuing the last conversation: 2 exchange(s)" in again.stderr
    assert "replayed 2 replies: all equal to the saved ones" in again.stderr
    replayed = again.stdout.splitlines()
    assert [line.strip() for line in replayed[:2]] == [one.text.strip(), branched.text.strip()]
    newest = store.recent(1)[0]
    assert len(store.recent(10)) == 4  # the replays were not logged, the new reply was
    assert (newest.prompt, newest.parent, newest.conversation) == ("w11", branched.id, one.conversation)
    # The history came back: the new reply's prompt holds both exchanges before it.
    assert newest.summary["prompt_tokens"] > branched.summary["prompt_tokens"] + branched.tokens


def test_replay_skips_interrupted_replies_and_says_where_a_reply_differs(chat_model_dir) -> None:
    assert chat(chat_model_dir, "--seed", "5", stdin="w7\nw8\nw9\n").returncode == 0
    first, second, third = store.recent(10)[::-1]
    records = [dict(r) for r in second.records]
    changed = (records[2]["token_id"] + 1) % 48
    records[2] = {**records[2], "token_id": changed}
    with sqlite3.connect(store.database_path()) as db:
        db.execute("UPDATE runs SET stop_reason = 'interrupted' WHERE id = ?", (first.id,))
        db.execute("UPDATE runs SET records = ? WHERE id = ?", ("\n".join(map(json.dumps, records)), second.id))
    done = chat(chat_model_dir, "-c", "--replay")
    assert done.returncode == 0, done.stderr
    notes = done.stderr.splitlines()
    assert f"exchange 2 differs at token 2: saved 'w{changed}' (id {changed}), replayed" in done.stderr
    assert "the numbers differ" in done.stderr  # why: the saved token's probability is not the replay's
    assert notes[-1] == "replayed 2 replies (1 interrupted, skipped: where the interrupt landed is not in the " \
                        "seed): exchange(s) 2 differ from the saved ones"  # fmt: skip
    assert len(done.stdout.splitlines()) == 2 and done.stdout.splitlines()[1].strip() == third.text.strip()


def test_no_log_keeps_the_chat_out_and_c_without_a_chat_is_one_line(chat_model_dir) -> None:
    assert chat(chat_model_dir, "--no-log", stdin="w7\n").returncode == 0
    assert store.recent(5) == []
    done = chat(chat_model_dir, "-c")
    assert done.returncode == 2 and done.stdout == "" and done.stderr.startswith("Error: no chat in the log")
