"""The client side imports no torch, transformers or llama_cpp: a whole ``generate`` on a warm
engine runs with them blocked; and the records survive the wire as the same dataclasses."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llmsample.client.wire import decode, encode, job_from_json
from llmsample.events import Candidate, ReferenceFigures, RunFacts, Speculation, Summary, TokenEvent, Watched
from llmsample.jobs import Job
from llmsample.sampling.config import SamplingConfig
from tests.conftest import REPO
from tests.warm.conftest import Engine

BLOCK = "import sys\nfor name in ('torch', 'transformers', 'llama_cpp'):\n    sys.modules[name] = None\n"
CLIENT = [
    "llmsample.client.route",
    "llmsample.client.connection",
    "llmsample.commands.host_options",
    "llmsample.cli",
    "llmsample.chat.talk",
    "llmsample.batch.run",
    "llmsample.client.engine_client",
    "llmsample.chat.repl",
    "llmsample.commands.explain",
    "llmsample.analysis.explain_records",
]


@pytest.mark.parametrize("module", CLIENT)
def test_imports_without_the_model_stack(module: str) -> None:
    result = subprocess.run([sys.executable, "-c", f"{BLOCK}import {module}"], capture_output=True, text=True,
                            cwd=REPO, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("flag", "also", "failing"),
    [
        ("--inspect", (), "sys.argv.append('--local')"),  # in-process, the same command needs torch
        ("-q", ("rich",), "sys.argv.remove('-q')"),  # the summary line on stderr needs rich
    ],
)
def test_a_warm_generate_runs_with_the_model_stack_blocked(
    engine: Engine, flag: str, also: tuple[str, ...], failing: str
) -> None:
    """A piped ``-q`` run imports no rich either: its first token waits for no console (rich comes
    with the views that colour or tabulate, and with the summary line after the answer)."""
    args = ["generate", *engine.load_args, "-p", "w3 w4", "--seed", "3", "-n", "8", flag]
    block = BLOCK + "".join(f"sys.modules[{name!r}] = None\n" for name in also)
    code = f"{block}from llmsample.cli import main\nsys.argv = ['llmsample', *{args!r}]\nmain()\n"
    blocked = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=engine.env,
                             cwd=REPO, timeout=120)  # fmt: skip
    assert blocked.returncode == 0, blocked.stderr
    assert blocked.stdout == engine.generate(*args[1 + len(engine.load_args) :]).stdout
    # The check can fail: the same command where it needs what is blocked.
    unblocked = subprocess.run([sys.executable, "-c", code.replace("main()", f"{failing}; main()")],
                               capture_output=True, text=True, env=engine.env, cwd=REPO, timeout=120)  # fmt: skip
    assert unblocked.returncode != 0


def test_a_warm_chat_runs_with_the_model_stack_blocked(engine: Engine) -> None:
    args = ["chat", *engine.load_args, "--seed", "4", "-n", "6", "--top-n", "2", "--no-log"]
    code = f"{BLOCK}from llmsample.cli import main\nsys.argv = ['llmsample', *{args!r}]\nmain()\n"
    session = "w3 w4\nw5\n/undo\n/inspect\n"
    blocked = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=engine.env,
                             cwd=REPO, timeout=120, input=session)  # fmt: skip
    assert blocked.returncode == 0, blocked.stderr
    assert blocked.stdout == engine.cli(*args, input=session).stdout and blocked.stdout.count("\n") > 2


def test_records_round_trip() -> None:
    token = TokenEvent(
        3, 17, " w5", 0.1 + 0.2, 1 / 3, 2, 1.5e-9, (Candidate(17, " w5", 0.30000000000000004, 0.25),),
        {"top_k": 4}, "draft", True, {"w9": Watched(9, 0.01, 0.02, 7)}, ReferenceFigures(0.003, True, 0.29),
    )  # fmt: skip
    summary = Summary(" w5", 1, 2, "length", 0.01, None, "m", "balanced", 7, 0.2,
                      RunFacts(device="cpu", speculation=Speculation(4, 3, 2, 1.5), device_map=("cpu",)))  # fmt: skip
    assert decode(encode(token)) == token
    assert decode(encode(summary)) == summary


def test_a_job_round_trips() -> None:
    cfg = SamplingConfig(temperature=0.7, stop=("w3",), logit_bias=(("w4", 2.5),), seed=2**62 + 1)
    job = Job("hi", cfg, "creative", system="s", raw=True, truncate="left", top_n=3, model="m")
    import json

    assert job_from_json(json.loads(json.dumps(job.to_json()))) == job
    with pytest.raises(ValueError, match="unknown keys"):
        job_from_json({**job.to_json(), "cfg": {"temprature": 1}})


def test_an_explanation_and_its_answer_round_trip() -> None:
    import json

    from llmsample.analysis.explain_records import (
        ChainReport,
        ScoredToken,
        StageCandidate,
        answer_from_json,
        answer_to_json,
    )
    from llmsample.client.wire import explanation_from_json
    from llmsample.jobs import Explanation

    job = Job(
        "hi", SamplingConfig(seed=5), "balanced", top_n=10, messages=[{"role": "user", "content": "x"}], fit_room=8
    )
    assert job_from_json(json.loads(json.dumps(job.to_json()))) == job
    with pytest.raises(ValueError, match="fit_room"):
        job_from_json({**job.to_json(), "fit_room": -1})
    once = Job("hi", SamplingConfig(seed=5), "balanced", cache_prompt=False)
    assert job_from_json(json.loads(json.dumps(once.to_json()))) == once
    with pytest.raises(ValueError, match="cache_prompt"):
        job_from_json({**once.to_json(), "cache_prompt": "no"})
    exchange = Job("hi", SamplingConfig(seed=5), "balanced", drafter="auto", own_pool=True)
    assert job_from_json(json.loads(json.dumps(exchange.to_json()))) == exchange
    with pytest.raises(ValueError, match="own_pool"):
        job_from_json({**exchange.to_json(), "own_pool": 1})
    asked = Explanation(Job("hi", SamplingConfig(), "code"), " there", ("w3", "7"))
    assert explanation_from_json(json.loads(json.dumps(asked.to_json()))) == asked
    report = ChainReport(["raw", "top_k"], [StageCandidate(3, " w3", {"raw": 0.1 + 0.2, "top_k": 1 / 3}, "top_k")],
                         {"raw": 32, "top_k": 4}, 1.5e-9)  # fmt: skip
    scored = [ScoredToken(0, 3, " w3", 0.1 + 0.2, 1 / 3, 2, False, "min_p")]
    for answer in (report, scored):
        assert answer_from_json(json.loads(json.dumps(answer_to_json(answer)))) == answer
