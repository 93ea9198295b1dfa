"""A hostile client: bodies that broke the parser or the tokenizer are 400s in OpenAI's shape,
a client that hangs up or stalls mid-request costs neither a traceback nor a socket for good,
a huge prompt does not stall the event loop; and every request is one line of the log."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmsample.batch.requests import COMPLETIONS_URL
from llmsample.models.loading import LoadedModel, load_model
from llmsample.serve.app import create_app
from llmsample.serve.engine import Engine
from llmsample.serve.state import ServeState
from tests.conftest import make_tiny_model
from tests.serve.conftest import NO_EOS, Server, serve_process

LINE = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d 127\.0\.0\.1 "


def waited_line(log: Path, pattern: str) -> re.Match[str]:
    """The log's line matching ``pattern`` (a server writes it once the answer has gone out)."""
    deadline = time.monotonic() + 60
    while not (found := re.search(pattern, log.read_text(errors="replace"), re.MULTILINE)):
        assert time.monotonic() < deadline, f"no line {pattern!r} in the log: {log.read_text(errors='replace')}"
        time.sleep(0.05)
    return found


@pytest.mark.parametrize(
    ("path", "raw", "param"),
    [
        (COMPLETIONS_URL, b'{"prompt": "w3", "stop": ' + b"[" * 5000 + b"]" * 5000 + b"}", None),
        (COMPLETIONS_URL, b'{"prompt": "w3", "stop": ' + b"[" * 100 + b"]" * 100 + b"}", None),
        (COMPLETIONS_URL, b'{"prompt": "w3", "logit_bias": {"\\ud800": 1}}', None),
        ("/tokenize", b'{"prompt": "w3 \\udfff"}', None),
        ("/tokenize", b'{"messages": [{"role": "user", "content": "\\ud800"}]}', None),
        (COMPLETIONS_URL, b'{"prompt": "w3", "max_tokens": 99999, "max_tokens": 2}', "max_tokens"),
    ],
    ids=["nested-5000", "nested-100", "surrogate-bias", "surrogate-tokenize", "surrogate-messages", "twice"],
)
def test_hostile_bodies_are_400_error_objects(server: Server, path: str, raw: bytes, param: str | None) -> None:
    response = httpx.post(server.url + path, content=raw, headers={"Content-Type": "application/json"}, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param


def test_every_request_is_one_line_of_the_log(server: Server, model_id: str) -> None:
    client = server.client()
    whole = client.completions.create(model=model_id, prompt="w3 w4", max_tokens=3, extra_body={"seed": 11})
    usage = whole.usage
    waited_line(server.log, rf"^{LINE}POST /v1/completions 200 {usage.prompt_tokens}\+{usage.completion_tokens} tokens \d+\.\d{{3}} s$")  # fmt: skip
    listed = client.completions.create(model=model_id, prompt=["w3 w4 w5 w6", "w7"], n=2, max_tokens=3,
                                       logit_bias=NO_EOS, extra_body={"seed": 12})  # every prompt's tokens
    usage = listed.usage
    assert usage.completion_tokens == 12
    waited_line(server.log, rf"^{LINE}POST /v1/completions 200 {usage.prompt_tokens}\+12 tokens ")
    chunks = list(client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "w5"}],
                  max_tokens=4, stream=True, stream_options={"include_usage": True}))  # fmt: skip
    usage = chunks[-1].usage
    waited_line(server.log, rf"^{LINE}POST /v1/chat/completions 200 {usage.prompt_tokens}\+{usage.completion_tokens} tokens ")  # fmt: skip
    httpx.get(server.url + "/health")
    httpx.get(server.url + "/v1/nothing-here")
    waited_line(server.log, rf"^{LINE}GET /v1/nothing-here 404 - ")
    assert "GET /health" not in server.log.read_text()  # a load balancer's, every few seconds


def test_a_client_gone_mid_body_leaves_no_traceback(server: Server) -> None:
    head = b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    with socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=60) as sock:
        sock.sendall(head + b'{"pro')
        time.sleep(0.2)  # the server reads the part sent (the test holds either way)
    waited_line(server.log, rf"^{LINE}POST /tokenize 499 ")
    text = server.log.read_text(errors="replace")
    assert "Traceback" not in text and "ClientDisconnect" not in text


@pytest.fixture(scope="module")
def quiet(chat_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``--quiet`` (no line to wait for: it is ready once ``/health`` answers) and a 1 s read timeout,
    on a port picked here (a quiet server does not say which one it took). The port is free when
    picked, but another process may take it before the server binds it: then another port."""
    log = tmp_path_factory.mktemp("quiet") / "stderr"
    for attempt in range(3):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        with open(log, "wb") as err:
            proc = serve_process(chat_model_dir, err, "--port", str(port), "--quiet", "--read-timeout", "1")
        running = Server(f"http://127.0.0.1:{port}", proc, log)
        if started(running, deadline=time.monotonic() + 180):
            break
        if attempt == 2 or "cannot listen on" not in log.read_text(errors="replace"):
            pytest.fail(f"the quiet server did not start: {log.read_text(errors='replace')}")
    yield running
    running.stop()


def started(server: Server, deadline: float) -> bool:
    """Whether ``server`` answers ``/health`` before ``deadline`` (killed when it does not)."""
    while True:
        try:
            httpx.get(server.url + "/health", timeout=5)
            return True
        except httpx.TransportError:
            if server.proc.poll() is not None or time.monotonic() > deadline:
                server.proc.kill()
                server.proc.wait()
                return False
            time.sleep(0.2)


def connect(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=60)


def test_half_sent_headers_are_hung_up_on(quiet: Server) -> None:
    with connect(quiet) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        assert sock.recv(1024) == b""  # closed by the server, long before the socket's own 60 s


def test_a_half_sent_body_is_408_and_hung_up_on(quiet: Server) -> None:
    with connect(quiet) as sock:
        sock.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"prompt')
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and json.loads(body)["error"]["code"] == "body_timeout"


class Gate:
    """A tokenizer whose calls wait until the test opens the gate, as a 4 MiB prompt keeps it busy."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.entered, self.opened = threading.Event(), threading.Event()
        self.timed_out = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        self.timed_out = not self.opened.wait(30)  # on the event loop nobody could open it: bounded
        return self.tokenizer(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_model(str(make_tiny_model(tmp_path_factory.mktemp("tiny"))), "cpu", "float32")


@pytest.mark.parametrize(("path", "body"), [("/tokenize", {"prompt": "w3 w4"}), (COMPLETIONS_URL, {"prompt": "w3"})])
def test_tokenizing_leaves_the_event_loop_free(tiny: LoadedModel, path: str, body: dict[str, Any]) -> None:
    gate = Gate(tiny.tokenizer)
    lm = dataclasses.replace(tiny, tokenizer=gate)
    engine = Engine(lm, 1, 0)  # never run: a completion stays queued once its prompt is tokenized
    app = create_app(ServeState(lm, engine))

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://serve", timeout=60) as client:
            slow = asyncio.ensure_future(client.post(path, json=body))
            deadline = time.monotonic() + 60
            while not gate.entered.is_set():
                assert time.monotonic() < deadline and not slow.done()
                await asyncio.sleep(0.01)
            assert (await client.get("/health")).status_code == 200
            gate.opened.set()
            assert not gate.timed_out  # /health was answered while the tokenizer was busy
            if path == "/tokenize":
                assert (await slow).json()["tokens"] == tiny.tokenizer("w3 w4")["input_ids"]
            else:
                while engine.figures()["in_flight"] != 1:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.01)
                slow.cancel()

    asyncio.run(main())
    engine.shutdown()


def test_a_failure_of_ours_is_a_500_error_object_and_one_line(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(lm: LoadedModel, body: Any) -> None:
        raise RuntimeError("something of ours broke\nand said more")

    monkeypatch.setattr("llmsample.serve.tokens.tokenize_body", broken)
    app = create_app(ServeState(tiny, Engine(tiny, 1, 0)))

    async def main() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serve") as client:
            return await client.post("/tokenize", json={"prompt": "w3"})

    response = asyncio.run(main())
    assert response.status_code == 500
    assert response.json()["error"] == {"message": "the server failed: RuntimeError: something of ours broke",
                                        "type": "server_error", "param": None, "code": "internal_error"}  # fmt: skip
    assert capsys.readouterr().err == "llmsample serve: POST /tokenize failed: RuntimeError: something of ours broke\n"


def test_quiet_logs_no_request(quiet: Server, model_id: str) -> None:
    assert quiet.client().completions.create(model=model_id, prompt="w3", max_tokens=2).choices
    quiet.stop()  # whatever it would have written is out once it has exited (the module's last test)
    assert quiet.proc.returncode == 0
    assert "/v1/completions" not in quiet.log.read_text(errors="replace")
