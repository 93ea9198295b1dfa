"""The README's examples run as printed (issue 60): each ``llmsample`` line of its code blocks,
through bash as a user types it (pipes, ``$(cat ...)``), on the default model, from a folder laid
out as the repository's root (``docs/`` linked into a temporary folder, so that what an example
writes lands there); each output is checked for its shape, not only for its exit status.
tests/test_docs.py checks the same lines' flags in milliseconds; this runs them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import cli_env
from tests.test_docs import CommandLine, command_lines, invocations

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = [line for line in command_lines(REPO / "README.md") if not line.inline]
INLINE = [line for line in command_lines(REPO / "README.md") if line.inline]
NOT_RUN = {
    "chat": "needs a terminal: tests/chat/ drives it in a pty",
    "serve": "starts a server: tests/serve/",
    "start": "starts a warm engine: tests/warm/",
}
SUMMARY = re.compile(r"^(\d+) tokens · stop: (eos|length|stop)\b.* tok/s\b.*$", re.M)


@dataclass(frozen=True)
class Ran:
    stdout: str
    stderr: str
    folder: Path

    def summary(self) -> re.Match[str]:
        found = SUMMARY.search(self.stderr)
        assert found, f"no summary line on stderr:\n{self.stderr}"
        return found


def answers_france(ran: Ran) -> None:
    assert "Paris" in ran.stdout
    ran.summary()


def writes_text(ran: Ran) -> None:
    assert len(ran.stdout.split()) >= 3, ran.stdout
    ran.summary()


def inspects(ran: Ran) -> None:
    """The answer, then the table: its header and one row a token from 0 on."""
    answer, _, table = ran.stdout.partition("\n\n")
    assert "hotosynthesis" in answer, ran.stdout
    assert re.search(r"^\s*#\s+token\s+p\s+p model\s+rank\s+H bits\s+removed", table, re.M), table
    rows = [int(row.group(1)) for row in re.finditer(r"^\s*(\d+)\s+\S", table, re.M)]
    assert rows == list(range(int(ran.summary().group(1)))), rows


def explains(ran: Ran) -> None:
    assert "next token under preset 'creative'" in ran.stdout
    assert re.search(r"^token\s+raw\b.*removed by", ran.stdout, re.M), ran.stdout
    assert re.search(r"^entropy of the final distribution: [\d.]+ bits", ran.stdout, re.M), ran.stdout


def fits_the_schema(ran: Ran) -> None:
    person = json.loads(ran.stdout)
    assert set(person) == {"name", "age"}, person
    assert isinstance(person["name"], str) and person["name"].strip()
    assert isinstance(person["age"], int) and 0 <= person["age"] <= 120


def prints_probabilities(ran: Ran) -> None:
    """jq's lines: each token's probability, a tab, its text (a text holding a newline goes on
    over the next line)."""
    head, *rest = re.split(r"^([0-9.e-]+)\t", ran.stdout, flags=re.M)
    probs, texts = rest[::2], rest[1::2]
    assert head == "" and len(probs) >= 3, ran.stdout
    assert all(0 < float(prob) <= 1 for prob in probs)
    assert "".join(texts).strip()


def answers_each_question(ran: Ran) -> None:
    questions = (REPO / "docs/examples/questions.txt").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in (ran.folder / "answers.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["custom_id"] for r in records] == [f"line-{i}" for i in range(1, len(questions) + 1)]
    assert all(r["text"].strip() and r["stop_reason"] in ("eos", "length") for r in records), records
    assert f"{len(questions)} done, 0 failed" in ran.stderr


def writes_a_page(ran: Ran) -> None:
    page = (ran.folder / "view.html").read_text(encoding="utf-8")
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert f" · {ran.summary().group(1)} tokens · stop: " in page  # the run printed is the one on the page


def speculates(ran: Ran) -> None:
    """The file given back (greedy: the model copies it), the drafts' count, and the plain loop
    compared in words: a speedup, or how many times slower."""
    assert "def mean(values):" in ran.stdout and "def normalise(values):" in ran.stdout, ran.stdout
    summary = ran.summary().group(0)
    assert re.search(r"accepted \d+/\d+ drafted", summary), summary
    assert re.search(r"plain loop [\d.]+ tok/s: (\d+\.\d\dx speedup|speculation \d+\.\d\dx slower)", summary), summary


def sweeps(ran: Ran) -> None:
    """A row per setting with its figures (a star on the front), and the plot written whole."""
    rows = [line.split() for line in ran.stdout.splitlines()[1:]]
    assert ran.stdout.startswith("setting") and len(rows) == 4, ran.stdout
    assert all(float(row[-7]) < 0 and 0 <= float(row[-6]) <= 1 for row in rows), ran.stdout  # logprob, distinct-2
    assert any("*" in row for row in rows) and (ran.folder / "sweep.svg").read_text().rstrip().endswith("</svg>")


# A fragment of each example's line, and what its output must look like: a new example needs one.
CHECKS: dict[str, Callable[[Ran], None]] = {
    '"What is the capital of France?" -t 0': answers_france,
    "--seed 7": writes_text,
    "--inspect": inspects,
    "llmsample explain": explains,
    "--json-schema": fits_the_schema,
    "--format jsonl |": prints_probabilities,
    "llmsample batch": answers_each_question,
    "llmsample speculate": speculates,
    "llmsample sweep": sweeps,
}
# The prose's inline examples that are run too, as the blocks' are (the others: placeholders such as
# ./my-finetune and run 12, bench and compare-presets runs of their own tests, listings of no model).
INLINE_CHECKS: dict[str, Callable[[Ran], None]] = {
    "| llmsample generate --raw -n 50": writes_text,
    "--html view.html": writes_a_page,
}


def check_of(line: CommandLine) -> Callable[[Ran], None]:
    found = [check for fragment, check in (INLINE_CHECKS if line.inline else CHECKS).items() if fragment in line.text]
    assert len(found) == 1, f"{line.where}: {line.text!r} matches {len(found)} checks (want one)"
    return found[0]


def run_as_printed(line: CommandLine, folder: Path) -> Ran:
    """``line`` through bash in ``folder``, ``llmsample`` being this interpreter's; a pipe fails as
    its first failing command does."""
    (folder / "docs").symlink_to(REPO / "docs")
    script = 'llmsample() { "$LLMSAMPLE_TEST_PYTHON" -m llmsample "$@"; }\nset -o pipefail\n' + line.text
    env = cli_env(LLMSAMPLE_TEST_PYTHON=sys.executable)
    env.pop("LLMSAMPLE_BACKEND", None)  # the suite pins transformers; a user's run is auto's choice
    result = subprocess.run(
        ["bash", "-c", script], cwd=folder, capture_output=True, text=True, env=env, timeout=300
    )  # fmt: skip
    assert result.returncode == 0, f"{line.where}: {line.text}\nexit {result.returncode}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return Ran(result.stdout, result.stderr, folder)


def test_every_example_is_run_or_left_to_its_own_tests() -> None:
    """The README has its examples, and each is run here (with its check) or named in NOT_RUN."""
    assert len(EXAMPLES) >= 10
    for line in EXAMPLES:
        [call] = invocations(line)
        if call[0] not in NOT_RUN:
            check_of(line)
    assert {invocations(line)[0][0] for line in EXAMPLES} >= set(NOT_RUN)
    inline = [line.text for line in INLINE]
    assert all(sum(fragment in text for text in inline) == 1 for fragment in INLINE_CHECKS), inline


RUN = [line for line in EXAMPLES if invocations(line)[0][0] not in NOT_RUN]
RUN += [line for line in INLINE if any(fragment in line.text for fragment in INLINE_CHECKS)]


@pytest.mark.model
@pytest.mark.skipif(shutil.which("bash") is None, reason="the README's lines are bash")
@pytest.mark.parametrize("line", RUN, ids=lambda line: line.where)
def test_a_readme_example_runs_as_printed(line: CommandLine, tmp_path: Path) -> None:
    if "| jq" in line.text and shutil.which("jq") is None:
        pytest.skip("jq is not installed")
    check_of(line)(run_as_printed(line, tmp_path))
