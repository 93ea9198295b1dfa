"""``llmsample chat`` in a real pseudo-terminal (pexpect): a conversation in colour, every slash
command, Ctrl-C in the middle of a reply and at the prompt, Ctrl-D."""

from __future__ import annotations

import json
import re

import pexpect

from tests.chat.conftest import spawn_chat

PROMPT = ">>>"
COLOUR = re.compile(r"\x1b\[38;[0-9;]*m")  # a foreground colour: the reply's probability bands


def finish(child) -> None:
    """The child gone (killed if a failed test left it running), its status read."""
    if child.isalive():
        child.kill(9)
    child.wait() if child.isalive() else None
    child.close(force=True)


def say(child, text: str, until: str = "prefilled") -> str:
    """Send a line; what came back up to ``until`` (then the next prompt)."""
    child.sendline(text)
    child.expect_exact(until)
    out = child.before
    child.expect_exact(PROMPT)
    return out


def test_a_conversation_in_colour_and_every_slash_command(chat_model_dir, tmp_path) -> None:
    child = spawn_chat(chat_model_dir, tmp_path, "-t", "0", "-n", "6", "--color-by", "model")
    try:
        child.expect_exact(PROMPT)
        first = say(child, "w7 w8", "prompt 0 cached + 5 prefilled")
        assert COLOUR.search(first)
        assert "p(model):" in first  # generate's legend, once
        second = say(child, "w9 w10", "cached +")
        assert COLOUR.search(second) and "p(model):" not in second
        for command, shows in [
            ("/help", "/branch N TOKEN"),
            ("/set top_k 5", "top_k = 5"),
            ("/set temperature hot", "/set temperature: expected a number"),
            ("/set colour 1", "/set: unknown key 'colour'"),
            ("/set", "settings (from preset"),
            ("/watch w7", "watching w7"),
            ("/explain 1", "entropy of the final distribution"),
            ("/explain 99", "/explain: give a token position of the last reply, 0..5"),
            ("/branch 1 #1", "cached + 2 prefilled"),  # rolled back to position 1 of the reply (a turn feeds two tokens at least)
            ("/inspect", "p w7"),
            ("/branch 1 w7 w8", "'w7 w8' encodes to 2 tokens"),
            ("/regen", "prefilled"),
            ("/stats", "2 exchange(s) · 4 replies"),
            ("/undo", "dropped the last exchange"),
            ("/save saved.jsonl", "saved 1 exchange(s) to saved.jsonl"),
            ("/clear", "cleared the conversation"),
            ("/load saved.jsonl", "loaded 1 exchange(s) from saved.jsonl"),
            ("/load missing.jsonl", "missing.jsonl does not exist"),
            ("/system w5", "system message: w5"),
            ("/preset creative", "preset creative"),
            ("/preset nosuch", "unknown preset 'nosuch'"),
            ("/bogus", "unknown command /bogus"),
        ]:
            say(child, command, shows)
        child.sendline('"""')  # a message of several lines
        child.sendline("w11")
        child.sendline('w12"""')
        child.expect_exact("prefilled")
        child.expect_exact(PROMPT)
        child.sendline("quit")  # alone at a terminal: leave, as llm chat and Python's REPL do
        child.expect(pexpect.EOF)
    finally:
        finish(child)
    assert child.exitstatus == 0
    saved = [json.loads(line) for line in (tmp_path / "saved.jsonl").read_text().splitlines()]
    assert [r["type"] for r in saved] == ["chat", "user", "assistant"] and saved[0]["settings"]["top_k"] == 5
    history = (tmp_path / "state" / "llmsample" / "chat_history").read_text()
    assert "+w7 w8" in history and "+/inspect" in history


def test_ctrl_c_stops_a_reply_keeps_it_and_the_next_turn_works(chat_model_dir, tmp_path) -> None:
    child = spawn_chat(chat_model_dir, tmp_path, "-t", "0", "-n", "100000", "--ignore-eos", NO_COLOR="1")
    try:
        child.expect_exact(PROMPT)
        child.sendline("w7 w8")
        child.expect(r"(w\d+\s+){8}")  # the reply is under way
        child.sendintr()
        child.expect(r"(\d+) tokens · stop: interrupted")
        shown = int(child.match.group(1))
        child.expect_exact("interrupted: what was shown is kept as the reply")
        child.expect_exact(PROMPT)
        table = say(child, "/inspect", "removed:")
        assert len(re.findall(r"^\s*\d+\s+·w\d+", table, re.M)) == shown >= 8  # the reply, as shown
        child.send("w5 w6")  # Ctrl-C at the prompt clears the line
        child.sendintr()
        child.expect_exact(PROMPT)
        say(child, "/stats", "1 exchange(s) · 1 replies")
        say(child, "/set max_tokens 4", "max_tokens = 4")
        after = say(child, "w9", "prefilled")
        assert "4 tokens · stop: length" in after and "prompt 0 cached" in after  # a fresh cache
        assert not COLOUR.search(after)  # NO_COLOR
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        finish(child)
    assert child.exitstatus == 0


def test_a_reply_on_a_terminal_keeps_its_newlines(byte_chat_model, tmp_path) -> None:
    """Without colour on a terminal a person reads the replies: their newlines stay newlines
    (only a script's piped replies are escaped to a line each)."""
    child = spawn_chat(byte_chat_model, tmp_path, "--no-color", "--regex", r"a\nb", "-n", "8", "--seed", "1")
    try:
        child.expect_exact(PROMPT)
        reply = say(child, "hi", "prefilled")
        assert "a\r\nb" in reply and "\\n" not in reply  # the pty writes a newline as CR LF
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        finish(child)
