"""``explain`` on a warm engine: the engine runs the in-process run's own function
(``explain_prompt``, teacher forcing through the seam) on its model, between two steps of its
batch, and the client prints exactly the in-process bytes: the next token's table and its JSON,
the continuation's, colour in a terminal, and a user error; ``--layers`` and ``--tree`` are
refused in one line naming the option; the client imports no torch."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time

import pytest

from llmsample.client.connection import Target, UnixConnection, get_json
from llmsample.client.wire import ENGINE_PATH, EXPLAIN_PATH
from tests.conftest import REPO
from tests.warm.conftest import Engine
from tests.warm.test_client import BLOCK

NEXT = ("-p", "w3 w4 w5", "--system", "w9", "--preset", "creative", "--top-n", "6", "--ban", "w8",
        "--logit-bias", "w5=2.5", "--repetition-penalty", "1.3")  # fmt: skip
CONTINUATION = ("-p", "w4 w6", "--raw", "--top-k", "5", "--min-p", "0.05", "--continuation", " w7 w3 w3 w5")


def explain(engine: Engine, *args: str, **kwargs: object) -> subprocess.CompletedProcess:
    return engine.cli("explain", *engine.load_args, *args, **kwargs)


@pytest.mark.parametrize(
    "args",
    [NEXT, (*NEXT, "--format", "jsonl", "--watch", "w11", "--watch", "7"), CONTINUATION, (*CONTINUATION, "--format", "jsonl")],
    ids=["next", "next-jsonl-watch", "continuation", "continuation-jsonl"],
)  # fmt: skip
def test_the_same_bytes_as_in_process(engine: Engine, args: tuple[str, ...]) -> None:
    warm, local = explain(engine, *args), explain(engine, *args, "--local")
    assert warm.returncode == local.returncode == 0, warm.stderr + local.stderr
    assert warm.stdout == local.stdout and warm.stdout.count("\n") >= 1
    assert warm.stderr.strip().splitlines() == [
        f"llmsample: explained by the engine at unix:{engine.record()['socket']}"
    ]


BAN_ALL = tuple(f"--ban={text}" for text in ("<bos>", "<unk>", *(f"w{i}" for i in range(3, 32))))


@pytest.mark.parametrize(
    "args",
    [("-p", "w3", "--watch", "w3 w4"), ("-p", "w3", "--continuation", ""), ("-p", "   "),
     ("-p", "w3", "--raw", *BAN_ALL, "--min-tokens", "1")],
    ids=["watch", "empty-continuation", "empty-prompt", "nothing-left"],
)  # fmt: skip
def test_an_error_is_the_same_line(engine: Engine, args: tuple[str, ...]) -> None:
    warm, local = explain(engine, *args), explain(engine, *args, "--local")
    assert warm.returncode == local.returncode == (1 if "--min-tokens" in args else 2), warm.stderr
    assert warm.stdout == local.stdout == ""
    assert warm.stderr == local.stderr and len(warm.stderr.splitlines()) == 1


@pytest.mark.parametrize(("args", "flag"), [(("--layers",), "--layers"), (("--tree", "2"), "--tree")])
def test_a_view_the_engine_cannot_draw_is_one_line(engine: Engine, args: tuple[str, ...], flag: str) -> None:
    done = explain(engine, "-p", "w3", *args)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"Error: {flag} does not run on the warm engine for {engine.model}; leave it out, or pass --local to run here"
    ]


def test_runs_with_the_model_stack_blocked(engine: Engine) -> None:
    args = ["explain", *engine.load_args, *CONTINUATION, "-q"]
    code = f"{BLOCK}from llmsample.cli import main\nsys.argv = ['llmsample', *{args!r}]\nmain()\n"
    blocked = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=engine.env,
                             cwd=REPO, timeout=120)  # fmt: skip
    assert blocked.returncode == 0 and blocked.stderr == "", blocked.stderr
    assert blocked.stdout == engine.cli(*args, "--local").stdout


def test_answered_between_the_steps_of_rows_in_flight(engine: Engine) -> None:
    """A long answer decoding: the explanation runs on the loop's thread between two of its steps."""
    target = Target(f"unix:{engine.record()['socket']}")
    long = subprocess.Popen([sys.executable, "-m", "llmsample", "generate", *engine.load_args, "-p", "w3",
                             "--min-tokens", "2000", "-n", "2000", "-q"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=engine.env)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while get_json(target, ENGINE_PATH)["in_flight"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        warm = explain(engine, *CONTINUATION)
        assert get_json(target, ENGINE_PATH)["in_flight"] == 1  # still decoding: answered beside it
    finally:
        long.kill()
        long.wait()
    assert warm.returncode == 0 and warm.stdout == explain(engine, *CONTINUATION, "--local").stdout


@pytest.mark.parametrize(
    ("body", "words"),
    [(b"[1]", "not an explanation"), (b'{"job": {"prompt": "w3"}}', "not an explanation"),
     (b'{"job": {"prompt": "w3", "cfg": {}, "preset": "balanced"}, "watch": "w3"}', "watch: expected a list")],
)  # fmt: skip
def test_a_bad_request_gets_the_apis_error_object(engine: Engine, body: bytes, words: str) -> None:
    connection = UnixConnection(engine.record()["socket"], timeout=10)
    try:
        connection.request("POST", EXPLAIN_PATH, body, {"Content-Type": "application/json"})
        response: http.client.HTTPResponse = connection.getresponse()
        status, answer = response.status, json.loads(response.read())
    finally:
        connection.close()
    assert status == 400 and answer["error"]["type"] == "invalid_request_error"
    assert words in answer["error"]["message"]
