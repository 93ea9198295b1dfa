"""``--host URL``: generate on any ``llmsample serve`` (here one on a loopback port), the same
bytes as in-process; a model it does not serve, and an option an engine cannot honour, are one
line each (exit 2), never dropped."""

from __future__ import annotations

import json
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


def test_watch_runs_on_a_server_as_in_process(engine: Engine, server: Server) -> None:
    """Each row of the server's batch follows its own watched tokens: the records are the
    in-process run's, byte for byte, with the figures under the names given."""
    args = ("-p", "w5 w6", "--seed", "4", "-n", "10", "--watch", "w4", "--watch", "7", "--format", "jsonl")
    remote, local = engine.generate(*args, "--host", server.url), engine.generate(*args, "--local")
    assert remote.returncode == local.returncode == 0, remote.stderr
    assert remote.stdout.splitlines()[:-1] == local.stdout.splitlines()[:-1]
    assert set(json.loads(remote.stdout.splitlines()[0])["watch"]) == {"w4", "7"}


def test_what_a_server_cannot_do_is_one_line(engine: Engine, server: Server) -> None:
    referenced = engine.generate("-p", "w3", "--reference", "--host", server.url)
    other = engine.cli("generate", "-m", "some/other-model", "-p", "w3", "--host", server.url)
    for done, words in ((referenced, "--reference does not run on this engine"), (other, "is not served at this engine")):
        assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
        assert words in done.stderr


def test_batch_and_chat_on_a_server(engine: Engine, server: Server, tmp_path: Path) -> None:
    source = tmp_path / "requests.txt"
    source.write_text("w3 w4\nw5\nw6 w7 w8\n")
    args = ("batch", str(source), *engine.load_args, "--seed", "2", "-n", "6", "--tokens", "ids", "--no-log", "-q")
    remote, local = engine.cli(*args, "--host", server.url), engine.cli(*args, "--local")
    assert remote.returncode == local.returncode == 0, remote.stderr
    records = [[json.loads(line) for line in done.stdout.splitlines()] for done in (remote, local)]
    assert [[t["token_id"] for t in r["per_token"]] for r in records[0]] == [
        [t["token_id"] for t in r["per_token"]] for r in records[1]
    ]  # the same tokens (the server's batch of 2 rounds its figures by its own shape)
    assert {r["engine"] for r in records[0]} == {server.url}
    chat = ("chat", *engine.load_args, "--seed", "4", "-n", "6", "--no-log", "-q")
    remote, local = engine.cli(*chat, "--host", server.url, input="w3\nw4 w5\n"), engine.cli(*chat, "--local", input="w3\nw4 w5\n")
    assert remote.returncode == local.returncode == 0, remote.stderr
    assert remote.stdout == local.stdout and remote.stdout.count("\n") == 2


@pytest.mark.parametrize("command", ["batch", "chat"])
def test_a_model_the_server_does_not_serve_is_one_line(engine: Engine, server: Server, command: str) -> None:
    done = engine.cli(command, *(["-"] if command == "batch" else []), "-m", "some/other-model", "--host", server.url,
                      input="w3\n")  # fmt: skip
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert "'some/other-model' is not served at" in done.stderr
