"""``--host URL``: generate on any ``llmsample serve`` (here one on a loopback port), the same
bytes as in-process; a model it does not serve, and an option an engine cannot honour, are one
line each (exit 2), never dropped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.serve.conftest import Server, start_server
from tests.warm.conftest import Engine


@pytest.fixture(scope="module")
def server(chat_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(chat_model, tmp_path_factory.mktemp("host") / "stderr", "--batch-size", "2")
    yield running
    running.stop()


def test_generate_on_a_server(engine: Engine, server: Server) -> None:
    args = ("-p", "w5 w6", "--seed", "9", "-n", "12", "--top-p", "0.9", "--format", "jsonl")
    remote = engine.generate(*args, "--host", server.url)
    local = engine.generate(*args, "--local")
    assert remote.returncode == local.returncode == 0, remote.stderr
    assert remote.stdout.splitlines()[:-1] == local.stdout.splitlines()[:-1]
    assert f'"engine": "{server.url}"' in remote.stdout.splitlines()[-1]


def test_what_a_server_cannot_do_is_one_line(engine: Engine, server: Server) -> None:
    watched = engine.generate("-p", "w3", "--watch", "w4", "--host", server.url)
    other = engine.cli("generate", "-m", "some/other-model", "-p", "w3", "--host", server.url)
    for done, words in ((watched, "--watch does not run on an engine"), (other, "is not served at this engine")):
        assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
        assert words in done.stderr
