"""Incremental detokenization and stop strings."""

from __future__ import annotations

import pytest

from llmsample.engine.text_stream import Detokenizer, StopMatcher


def feed(matcher: StopMatcher, pieces: list[str]) -> tuple[str, bool]:
    out = []
    for piece in pieces:
        text, stopped = matcher.push(piece)
        out.append(text)
        if stopped:
            return "".join(out), True
    return "".join(out) + matcher.flush(), False


@pytest.mark.parametrize(
    ("pieces", "stops", "expected"),
    [
        (["Hello", " wor", "ld", "\n\n", "Next"], ["\n\n"], ("Hello world", True)),
        (["Hello", "\n", "\n", "Next"], ["\n\n"], ("Hello", True)),  # split across tokens
        (["ab", "cE", "ND", "x"], ["END"], ("abc", True)),
        (["ab", "E", "N", "x"], ["END"], ("abENx", False)),  # a false start is released
        (["x", "STO", "P"], ["STOP", "TOP"], ("x", True)),
        (["aaa", "b"], ["aab"], ("a", True)),
        (["plain"], [], ("plain", False)),
        (["ends with E"], ["END"], ("ends with E", False)),  # held tail flushed at the end
    ],
)
def test_stop_strings(pieces: list[str], stops: list[str], expected: tuple[str, bool]) -> None:
    assert feed(StopMatcher(stops), pieces) == expected


@pytest.mark.parametrize(
    ("pieces", "stops", "expected"),
    [
        (["Hello", "\n", "\n", "Next"], ["\n\n"], ("Hello\n\n", True)),
        (["x", "STO", "P", "y"], ["STOP", "TOP"], ("xSTOP", True)),
        (["ab", "cEND!"], ["END", "EN"], ("abcEN", True)),  # as if fed one character at a time
        (["ab", "E", "N", "x"], ["END"], ("abENx", False)),
    ],
)
def test_a_kept_stop_string_ends_the_text(pieces: list[str], stops: list[str], expected: tuple[str, bool]) -> None:
    """vLLM's ``include_stop_str_in_output``: the text runs to the end of the stop string."""
    assert feed(StopMatcher(stops, keep=True), pieces) == expected


def test_no_part_of_a_stop_string_is_ever_released() -> None:
    matcher = StopMatcher(["</answer>"])
    released = []
    for char in "result</answer>tail":
        text, stopped = matcher.push(char)
        released.append(text)
        if stopped:
            break
    assert "".join(released) == "result"
    assert all("<" not in piece for piece in released)


class ByteTokenizer:
    """Each token is one UTF-8 byte: characters are always split across tokens."""

    def decode(self, ids: list[int], **kwargs: object) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


def test_multibyte_characters_come_out_whole() -> None:
    detok = Detokenizer(ByteTokenizer())
    pieces = [detok.push(b) for b in "né 日本 🙂".encode()]
    assert "".join(pieces) == "né 日本 🙂"
    assert "\ufffd" not in "".join(pieces)
    assert pieces[1] == "" and pieces[2] == "é"  # held until the character is complete


def test_incomplete_character_is_flushed_at_the_end() -> None:
    detok = Detokenizer(ByteTokenizer())
    assert detok.push("🙂".encode()[0]) == ""
    assert detok.flush() == "\ufffd"
