"""The engine interface's contract: every command runs one program on either engine
(:class:`~llmsample.api.local.LocalEngine` in the command's process, ``--local``;
:class:`~llmsample.client.engine_client.RemoteEngine` on a warm one), so every command and
output format prints the same bytes on both. Only clocks, where it ran, and what the cache
holds may differ; a case's ``shows`` is text both must print, so an engine that drops a
feature fails it even where the other drops it too.

The engine decodes one row at a time (``--batch-size 1``), as ``--batch-size 1`` in-process
does, so batch records agree to the last bit; compare-presets' samples share one prefill
in-process, so their float figures agree to rounding."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.warm.conftest import Engine, start_engine
from tests.warm.test_batch import REQUESTS  # a line of each kind, and one that cannot run
from tests.warm.test_same_bytes import in_terminal

CLOCKS = ("ttft_s", "tokens_per_s", "elapsed_s", "load_s", "plain_tokens_per_s", "plain_elapsed_s", "speedup")
WHERE = ("engine", "warm", "cache")  # where it ran, and what its cache held
FIGURES = ("mean_logprob", "perplexity", "mean_entropy")
CHAT = "w3\n/explain 1\nw4 w5\n/set repetition_penalty 1.3\nw6\n/explain 3\n/inspect\n/stats\n"


def jsonl(stdout: str) -> list[Any]:
    """JSON lines without their clocks and where they ran."""
    records = [json.loads(line) for line in stdout.splitlines()]
    for record in records:
        for key in (*CLOCKS, *WHERE):
            record.pop(key, None)
    return records


def figures_apart(stdout: str) -> tuple[list[Any], list[float]]:
    """compare-presets' records, their float figures apart (compared to rounding)."""
    records = jsonl(stdout)
    return records, [pytest.approx(record.pop(key), rel=1e-5) for record in records for key in FIGURES]


def stats_line(stdout: str) -> str:
    """A chat's transcript with ``/stats``' clocks and cache cut off (the counts kept)."""
    return re.sub(r"(tokens generated) in .*", r"\1", stdout)


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    shows: str  # what both must print
    stdin: str | None = None
    page: bool = False  # --html's page compared too
    terminal: bool = False  # stdout through a pseudo-terminal (colour)
    same: Callable[[str], Any] = lambda out: out  # what must be equal
    code: int = 0


GENERATE = ("-p", "w3 w4 w5", "--system", "w9", "--seed", "5", "-n", "24", "--top-n", "3", "--stop", "w7")
NEXT = ("-p", "w3 w4 w5", "--system", "w9", "--preset", "creative", "--top-n", "6", "--ban", "w8",
        "--logit-bias", "w5=2.5", "--repetition-penalty", "1.3")  # fmt: skip
CONTINUATION = ("-p", "w4 w6", "--raw", "--top-k", "5", "--min-p", "0.05", "--continuation", " w7 w3 w3 w5")
CASES = {
    "generate-plain": Case(("generate", *GENERATE), "w"),
    "generate-inspect-html": Case(("generate", *GENERATE, "--inspect", "--watch", "w6"), "w6", page=True),
    "generate-jsonl": Case(
        ("generate", "-p", "w4 w6", "--raw", "--preset", "creative", "--seed", "11", "-n", "20", "--min-p", "0.02",
         "--dry-multiplier", "0.8", "--logit-bias", "w5=2.5", "--ban", "w8", "--ignore-eos", "--format", "jsonl"),
        '"removed"', same=jsonl),
    "generate-colour": Case(
        ("generate", "-p", "w3 w3 w4", "--seed", "2", "-n", "16", "--color-by", "model", "--inspect", "-q"),
        "\x1b[", terminal=True,
    ),
    "speculate-jsonl": Case(
        ("speculate", "-p", "w3 w4 w5 w3 w4 w5 w3 w4", "--raw", "--seed", "4", "-n", "30", "--draft-tokens", "3",
         "--format", "jsonl", "--compare"), '"drafted"', same=jsonl),
    "explain-next": Case(("explain", *NEXT), "entropy"),
    "explain-jsonl-watch": Case(("explain", *NEXT, "--format", "jsonl", "--watch", "w11", "--watch", "7"), '"chain"'),
    "explain-continuation": Case(("explain", *CONTINUATION), "w7"),
    "explain-colour": Case(("explain", *CONTINUATION, "--ban", "w3", "-q"), "no (", terminal=True),
    "compare-presets-jsonl": Case(
        ("compare-presets", "-p", "w3 w4", "--system", "w9", "--presets", "creative,balanced", "--samples", "2",
         "--seed", "6", "-n", "10", "--format", "jsonl", "-q"), '"text"', same=figures_apart),
    "batch-records": Case(
        ("batch", "-", "--seed", "3", "-n", "10", "--top-n", "3", "--no-log"), '"per_token"',
        stdin="\n".join(REQUESTS) + "\n", same=jsonl, code=1),
    "batch-ids": Case(("batch", "-", "--seed", "3", "-n", "10", "--tokens", "ids", "--no-log"), '"custom_id"',
                      stdin="\n".join(REQUESTS) + "\n", same=jsonl, code=1),
    "chat-transcript": Case(
        ("chat", "--seed", "6", "-n", "6", "--system", "w9", "--top-n", "3", "--no-log", "-q"), "3 replies",
        stdin=CHAT, same=stats_line,
    ),
    "chat-jsonl": Case(("chat", "--seed", "2", "-n", "5", "--watch", "w6", "--ignore-eos", "--no-log", "--format",
                        "jsonl", "-q"), '"watch"', stdin="w3\nw4\n", same=jsonl),
}  # fmt: skip
LOCAL = ("--local", "--batch-size", "1", "--prompt-cache-mb", "0")  # batch's: as the engine's rows run


@pytest.fixture(scope="module")
def serial(chat_model: Path) -> Iterator[Engine]:
    engine = start_engine(chat_model, "--batch-size", "1", "--keep-alive", "10m")
    yield engine
    engine.cli("stop", "--all")


def run(engine: Engine, case: Case, local: bool, folder: Path) -> tuple[str, str | None]:
    """The case's stdout (decoded from the terminal's bytes for ``terminal``) and its page."""
    command, *rest = case.args
    where = [arg for arg in LOCAL if command == "batch" or arg == "--local"] if local else []
    page = folder / ("local.html" if local else "warm.html")
    args = (*rest, *where, *(("--html", str(page)) if case.page else ()))
    if case.terminal:
        return in_terminal(engine, *args, command=command).decode(), None
    done = engine.cli(command, *engine.load_args, *args, input=case.stdin)
    assert done.returncode == case.code, done.stderr
    return done.stdout, page.read_text() if case.page else None


@pytest.mark.parametrize("name", CASES)
def test_every_command_prints_the_same_on_either_engine(serial: Engine, name: str, tmp_path: Path) -> None:
    case = CASES[name]
    (warm, warm_page), (local, local_page) = (run(serial, case, local, tmp_path) for local in (False, True))
    assert case.shows in warm and case.shows in local  # neither dropped the feature
    assert case.same(warm) == case.same(local)
    assert warm_page == local_page
