"""The server's threads: the engine decodes on the thread that loaded the model, uvicorn on a
thread beside it whose end ends the server, and the HTTP side's work on a request starts no
OpenMP team of its own (a second team made libgomp count more threads than cores and stop
spinning between the engine's parallel regions: forward passes ~35 % slower on a 2-core CPU)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from llmsample.batch.requests import CHAT_URL, COMPLETIONS_URL
from llmsample.batch.run import BatchSettings
from llmsample.errors import RuntimeFailure
from llmsample.models.loading import load_model
from llmsample.serve.engine import Engine
from llmsample.serve.parsing import parse_body
from llmsample.serve.request_rows import build_items
from llmsample.serve.server import bind, serve_forever
from llmsample.serve.state import ServeState
from tests.conftest import make_tiny_model

# Every setting that reads the vocabulary (a ban on <eos> until min_tokens, penalties, a bias, DRY,
# stop strings), on a vocabulary past torch's grain for one parallel region (32,768 elements).
BODIES = [
    (COMPLETIONS_URL, {"prompt": "w3 w4", "max_tokens": 8, "min_tokens": 8, "temperature": 0, "seed": 0}),
    (CHAT_URL, {"messages": [{"role": "user", "content": "w5"}], "max_tokens": 8, "logit_bias": {"w7": 2, "1": -100},
                "frequency_penalty": 0.5, "presence_penalty": 0.2, "dry_multiplier": 0.8, "stop": ["w9"]}),
]  # fmt: skip


def tasks() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_preparing_requests_starts_no_openmp_team(tmp_path: Path) -> None:
    import torch

    lm = load_model(str(make_tiny_model(tmp_path, vocab_size=40_000)), "cpu", "float32")
    lm.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    state = ServeState(lm, Engine(lm, 4, 8), BatchSettings(), None, presets=frozenset())
    seen: list[int] = []

    def prepare() -> None:
        for url, body in BODIES:
            assert build_items(state, parse_body(body, url, state.presets), url == CHAT_URL)[0]
        seen.append(tasks())  # while this thread lives: a team it started would still be here

    prepare()  # the tokenizer's own pool, once per process
    previous = torch.get_num_threads()
    torch.set_num_threads(2)  # a team to start, on any machine
    try:
        before = tasks()
        worker = threading.Thread(target=prepare)
        worker.start()
        worker.join()
    finally:
        torch.set_num_threads(previous)
    assert seen[-1] == before + 1  # the thread itself and nothing else


class IdleEngine:
    """An engine's run and shutdown, with no model."""

    def __init__(self) -> None:
        self.stopped = threading.Event()

    def run(self) -> None:
        assert self.stopped.wait(60)

    def shutdown(self) -> None:
        self.stopped.set()


def test_an_http_side_that_ends_on_its_own_ends_the_server_as_a_failure() -> None:
    sock = bind("127.0.0.1", 0)
    sock.close()  # uvicorn cannot serve on it
    with pytest.raises(RuntimeFailure, match="the HTTP server stopped on its own"):
        serve_forever(object(), sock, IdleEngine(), lambda: None)  # type: ignore[arg-type]
