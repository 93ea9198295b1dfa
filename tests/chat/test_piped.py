"""``llmsample chat`` off a terminal: each stdin line a user turn, each reply a line of plain
text on stdout (its newlines escaped) or JSON lines; a saved conversation replays to the same
replies; user errors are one line and exit 2; a reader that leaves ends the chat."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.chat.conftest import chat_command, make_chat_model
from tests.conftest import REPO, cli_env, make_tiny_model, with_context


def run(model, *args: str, stdin: str = "", cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        chat_command(model, *args), input=stdin, capture_output=True, text=True, timeout=300,
        env=cli_env(PYTHONPATH=str(REPO)), cwd=cwd,
    )  # fmt: skip


def test_piped_turns_are_plain_lines_and_a_saved_chat_replays_the_same(chat_model_dir, tmp_path) -> None:
    """The replies run past end-of-sequence (--ignore-eos, EOS made likely), and so do their replays;
    a branch samples on with its reply's seed."""
    turns = "w7 w8\n\nw9 w10\n/branch 2 #1\n/save saved.jsonl\n"
    eos = ("--ignore-eos", "--logit-bias", "1=6")  # <eos> is id 1
    done = run(chat_model_dir, "-n", "5", *eos, "--seed", "3", stdin=turns, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and all(line.split() and "\x1b" not in line for line in lines)  # plain text
    assert done.stderr.count("prefilled") == 3 and "saved 2 exchange(s)" in done.stderr
    saved = [json.loads(line) for line in (tmp_path / "saved.jsonl").read_text().splitlines()]
    assert saved[2]["token_ids"][0] == 1 and len(saved[2]["token_ids"]) == 5  # seed 3 draws EOS first, goes on
    assert saved[4]["seed"] == 3 and saved[4]["prefix"] == saved[4]["token_ids"][:3]  # the branch: 2 kept, 1 put
    replay = run(chat_model_dir, "--load", "saved.jsonl", "--replay", "-q", cwd=tmp_path)
    assert replay.returncode == 0, replay.stderr
    assert "replayed 2 replies: all equal to the saved ones" in replay.stderr
    assert replay.stdout.splitlines() == [lines[0], lines[2]]  # the branched reply, as saved
    older = [{k: v for k, v in record.items() if k != "ignore_eos"} for record in saved]  # a save from before the field
    (tmp_path / "older.jsonl").write_text("".join(json.dumps(record) + "\n" for record in older))
    for flags, said in ((("--ignore-eos",), "all equal to the saved ones"), ((), "exchange 1 differs")):
        again = run(chat_model_dir, "--load", "older.jsonl", "--replay", "-q", *flags, cwd=tmp_path)
        assert again.returncode == 0 and said in again.stderr, again.stderr  # the command's flag decides


def test_set_shows_values_as_typed_and_ollama_habits_work(chat_model_dir) -> None:
    lines = ['/set stop ["w9", "w10"]', "/set logit_bias w7=-5 11=2.5", "/set seed none", "/set temperature 0.7",
             "/set", "/?", "/bye", "w7 w8"]  # fmt: skip
    done = run(chat_model_dir, "-n", "3", stdin="\n".join(lines) + "\n")
    assert done.returncode == 0, done.stderr
    notes = done.stderr
    for shown in ('stop = ["w9", "w10"]', "logit_bias = w7=-5 11=2.5", "seed = none", "temperature = 0.7"):
        assert shown in notes
    assert "('" not in notes + done.stdout and "None" not in done.stdout  # no Python reprs, in notes or /set's table
    assert "/branch N TOKEN" in done.stdout  # /? is /help
    assert "prefilled" not in notes  # /bye left before the message after it


def test_jsonl_has_token_records_and_one_summary_per_turn(chat_model_dir) -> None:
    done = run(chat_model_dir, "-t", "0", "-n", "3", "--ignore-eos", "--format", "jsonl", stdin="w7\nw8 w9\n")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["type"] for r in records] == ["token"] * 3 + ["summary"] + ["token"] * 3 + ["summary"]
    first, second = records[3], records[7]
    assert first["cache"] == {"reused": 0, "prefilled": first["prompt_tokens"]}
    assert second["cache"]["reused"] == first["prompt_tokens"] + 2  # the first reply but its last token


def test_user_errors_are_one_line_and_exit_2(chat_model_dir, tmp_path) -> None:
    plain = make_tiny_model(tmp_path / "plain")  # no chat template
    for args, message in [
        ((), "has no chat template, so it cannot chat"),
        (("--replay",), "--replay decodes a saved conversation again; give it with --load FILE"),
        (("--load", str(tmp_path / "none.jsonl")), "none.jsonl does not exist"),
    ]:
        done = run(plain if not args else chat_model_dir, *args)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.strip().splitlines()[-1].startswith("Error: ") and message in done.stderr


def test_every_reply_keeps_to_the_constraint(tmp_path) -> None:
    """The constraint flags apply to each reply afresh: every turn's reply is one of the choices
    (or matches the pattern), whatever the turns before it wrote."""
    import re

    from transformers import AutoTokenizer

    from tests.chat.conftest import TEMPLATE
    from tests.constraints.conftest import make_byte_model

    model = make_byte_model(tmp_path / "bytes")
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(model)
    turns = "hi\nand again\none more\n"
    chosen = run(model, "--choice", "yes", "--choice", "no way", "-n", "12", "--seed", "1", stdin=turns)
    assert chosen.returncode == 0, chosen.stderr
    assert chosen.stdout.splitlines() and set(chosen.stdout.splitlines()) <= {"yes", "no way"}
    assert len(chosen.stdout.splitlines()) == 3
    matched = run(model, "--regex", "[0-9]{2}-[a-c]+", "-n", "8", "--seed", "2", "-t", "1.3", stdin=turns)
    assert matched.returncode == 0, matched.stderr
    lines = matched.stdout.splitlines()
    assert len(lines) == 3 and all(re.fullmatch("[0-9]{2}-[a-c]+", line) for line in lines), lines


def test_a_reply_with_newlines_is_still_one_line(byte_chat_model: Path) -> None:
    """Each reply is one line whatever it holds: newlines, carriage returns and backslashes are
    escaped, so a shell reads a reply a line (``while IFS= read -r``) and ``printf '%b'`` gives
    it back."""
    reply = "a\nb\r\\c"
    done = run(byte_chat_model, "--regex", r"a\nb\r\\c", "-n", "12", "--seed", "1", stdin="hi\nagain\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n") == [r"a\nb\r\\c", r"a\nb\r\\c", ""]
    script = 'while IFS= read -r reply; do printf "%b\\0" "$reply"; done'
    decoded = subprocess.run(["bash", "-c", script], input=done.stdout.encode(), capture_output=True, check=True)
    assert decoded.stdout.decode().split("\0") == [reply, reply, ""]


def test_a_reader_that_leaves_ends_the_chat(chat_model_dir: Path) -> None:
    """``chat | head -n 1``: once stdout's reader has gone the chat ends at its next write, as
    generate does (quietly, exit 1): no note per message left, no prefill of each."""
    command = chat_command(chat_model_dir, "-n", "3", "--ignore-eos", "--seed", "1")
    pipe = subprocess.PIPE
    proc = subprocess.Popen(command, stdin=pipe, stdout=pipe, stderr=pipe, env=cli_env(PYTHONPATH=str(REPO)))
    proc.stdin.write(b"w7\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip()  # the first reply
    proc.stdout.close()  # the reader leaves, as head does
    proc.stdin.write(b"w8 w9\n" * 20)
    proc.stdin.close()
    code = proc.wait(timeout=120)
    errors = proc.stderr.read().decode()
    assert code == 1 and "closed by its reader" not in errors and "Traceback" not in errors, errors
    assert errors.count("prefilled") == 1, errors  # the first reply's summary, and no other


def test_a_reply_stops_at_the_context(tmp_path: Path) -> None:
    """A reply never runs past the model's context: each turn's stops there (stop reason
    ``context``), older exchanges dropped to make room for the next."""
    model = with_context(make_chat_model(tmp_path / "short", vocab_size=48), 32)
    done = run(model, "-n", "1000", "--ignore-eos", "-t", "0", "--format", "jsonl", stdin="w7\nw8 w9\n")
    assert done.returncode == 0, done.stderr
    summaries = [r for r in map(json.loads, done.stdout.splitlines()) if r["type"] == "summary"]
    assert [s["stop_reason"] for s in summaries] == ["context", "context"]
    assert [s["prompt_tokens"] + s["tokens"] for s in summaries] == [32, 32]
