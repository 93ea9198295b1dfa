"""SIGTERM: the server stops taking connections, ends every in-flight stream with a final chunk
and ``[DONE]``, and exits 0."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.conftest import make_tiny_model
from tests.serve.conftest import NO_EOS, serve_process, start_server, wait_in_flight


def test_sigterm_ends_streams_with_a_final_chunk_and_exits_0(chat_model_dir: Path, tmp_path: Path) -> None:
    server = start_server(chat_model_dir, tmp_path / "stderr", "--batch-size", "2")
    try:
        body = {"prompt": "w3", "max_tokens": 1000, "logit_bias": NO_EOS, "stream": True, "n": 2}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))
            server.proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        finals = [json.loads(line[6:])["choices"][0] for line in rest[:-1]]
        finals = [choice for choice in finals if choice["finish_reason"] is not None]
        assert sorted(choice["index"] for choice in finals) == [0, 1]
        assert {choice["finish_reason"] for choice in finals} == {"length"}
        assert server.proc.wait(30) == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(server.url + "/health", timeout=5)
        assert "Traceback" not in server.log.read_text()
    finally:
        server.stop()


def test_sigterm_ends_queued_streams_with_a_final_chunk_per_choice(tmp_path: Path) -> None:
    """A request still waiting for a row gets what a decoding one gets: a final chunk per choice.
    On a model of a long context: the decoding row cannot end before the signal comes."""
    model = make_tiny_model(tmp_path / "model", positions=1_000_000)
    server = start_server(model, tmp_path / "stderr", "--batch-size", "1")
    try:
        body = {"prompt": "w3", "max_tokens": 900_000, "logit_bias": NO_EOS, "stream": True}
        queued = {**body, "n": 2, "stream_options": {"include_usage": True}}
        with (
            httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as running,
            httpx.stream("POST", server.url + "/v1/completions", json=queued, timeout=60) as waiting,
        ):
            lines = running.iter_lines()  # held: a dropped iterator closes the response
            assert next(line for line in lines if line.startswith("data: {"))
            wait_in_flight(server, 3)  # the one row decodes, the two of the second request wait
            server.proc.send_signal(signal.SIGTERM)
            rest = [line for line in waiting.iter_lines() if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        chunks = [json.loads(line[6:]) for line in rest[:-1]]
        finals = [choice for chunk in chunks for choice in chunk["choices"] if choice["finish_reason"] is not None]
        assert sorted(choice["index"] for choice in finals) == [0, 1]
        assert chunks[-1]["usage"]["completion_tokens"] == 0 and chunks[-1]["usage"]["prompt_tokens"] > 0
        assert server.proc.wait(30) == 0
    finally:
        server.stop()


@pytest.mark.slow
def test_ctrl_c_twice_with_stalled_clients_logs_a_line_per_stream(tmp_path: Path) -> None:
    """Two clients that never read their streams: each first chunk (16 echoes of a 300 kB prompt)
    fills the socket, so a stream cannot send its final chunk; the first Ctrl-C waits for them,
    the second cancels them: one line each, no traceback, exit 0."""
    model = make_tiny_model(tmp_path / "model", positions=1_000_000)
    server = start_server(model, tmp_path / "stderr", "--batch-size", "32")
    body = json.dumps({"prompt": "x" * 300_000, "echo": True, "n": 16, "max_tokens": 900_000, "logit_bias": NO_EOS,
                       "stream": True}).encode()  # fmt: skip
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    stalled = []
    try:
        for _ in range(2):
            client = socket.socket()
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the sends stall soon
            client.connect(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
            client.sendall(head + body)
            stalled.append(client)
        wait_in_flight(server, 32)
        server.proc.send_signal(signal.SIGINT)
        with pytest.raises(subprocess.TimeoutExpired):
            server.proc.wait(2)  # the streams cannot end: it waits for them
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(30) == 0
        log = server.log.read_text()
        assert "Traceback" not in log and "CancelledError" not in log
        assert log.count("a stream was cut off at shutdown (its client was not reading it)") == 2
    finally:
        for client in stalled:
            client.close()
        server.stop()


@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGHUP], [signal.SIGINT, signal.SIGINT]])
def test_a_signal_as_soon_as_it_says_where_it_listens_stops_it_cleanly(
    chat_model_dir: Path, signals: list[int]
) -> None:
    """The line a script waits for comes once the server's own handlers are in place (read from a
    pipe, so the signal follows the line at once)."""
    proc = serve_process(chat_model_dir, subprocess.PIPE)
    try:
        assert b"llmsample serve:" in proc.stderr.readline()
        for sig in signals:
            proc.send_signal(sig)
        assert proc.wait(30) == 0, proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
