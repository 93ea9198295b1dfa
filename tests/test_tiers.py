"""The tiers (tests/tiers.py): markers found from what a test uses, and a test that does what a
tier says without its marker fails. The planted suites run in this process (pytester), so the
guards they meet are the ones every test of the suite meets."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.tiers import tiers_of


def starts_a_process() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def calls_a_helper_that_starts_one() -> None:
    starts_a_process()


class Runner:
    def go(self) -> None:
        calls_a_helper_that_starts_one()


def imports_llama_cpp() -> None:
    import llama_cpp  # noqa: F401


def adds(a: int, b: int) -> int:
    return a + b


@pytest.mark.parametrize(
    ("function", "expected"),
    [
        (starts_a_process, {"slow"}),
        (calls_a_helper_that_starts_one, {"slow"}),
        (Runner, {"slow"}),
        (lambda: Runner().go(), {"slow"}),
        (imports_llama_cpp, {"llamacpp"}),
        (adds, set()),
        (print, set()),  # not the suite's: not followed
    ],
)
def test_tiers_are_read_through_helpers(function: object, expected: set[str]) -> None:
    assert tiers_of(function, ("tests",)) == expected


PLANTED = """
import subprocess
import sys

import pytest


def helper():
    return subprocess.run([sys.executable, "-c", "pass"]).returncode


@pytest.fixture
def spawned():
    return helper()


def test_through_a_helper():
    assert helper() == 0


def test_through_a_fixture(spawned):
    assert spawned == 0


def test_plain():
    assert 1 + 1 == 2


def test_hidden():
    run = getattr(__import__("sub" + "process"), "run")  # no name the reading can follow
    run([sys.executable, "-c", "pass"])
"""


def test_markers_are_applied_and_an_unmarked_process_fails(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_planted=PLANTED)
    pytester.makeconftest('pytest_plugins = ["tests.tiers"]')
    fast = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-m", "not slow", "-q")
    fast.assert_outcomes(passed=1, failed=1, deselected=2)  # test_plain passes; test_hidden is refused
    fast.stdout.fnmatch_lines(["*test_hidden started a process without the 'slow' marker*"])


def test_a_model_load_without_its_marker_fails(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["tests.tiers"]')
    pytester.makepyfile(
        test_planted_model="""
from llmsample.models import loading

def test_loads_it():
    getattr(loading, "default_" + "model_path")()  # no name the reading can follow
"""
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*loaded the real default model without the 'model' marker*"])
