"""``--host`` / ``LLMSAMPLE_HOST`` that cannot be an llmsample serve: a value that is no server's
URL, and a server that answers as something else (a web server's HTML page, bytes that are not
HTTP). Each is one line naming what was wrong, exit 2, the same for ``generate``, ``batch`` and
``chat``, never the server's page; a server that closes without answering is the engine gone
(exit 1). In process, against servers on threads of the test."""

from __future__ import annotations

import http.server
import json
import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from llmsample.cli import main

COMMANDS = {
    "generate": ["generate", "-p", "w3"],
    "batch": ["batch", "-"],
    "chat": ["chat"],
}


def run(command: str, *args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, [*COMMANDS[command], *args], input="w3\n", env=env)


def assert_one_line(result, code: int, words: str) -> None:
    assert result.exit_code == code, result.output
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("Error: ") and words in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "<" not in result.stderr and "\x1b" not in result.stderr


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("http://127.0.0.1:99999", "its port '99999' is not a number from 0 to 65535"),
        ("http://127.0.0.1:80x", "its port '80x' is not a number"),
        ("http://[::1", "its brackets are not an IPv6 address's"),
        ("http://::1:8000", "an IPv6 address goes in brackets"),
        ("ftp://example.org", "it does not start with http:// or https://"),
        ("http://", "it names no host"),
    ],
)
def test_a_value_that_is_no_servers_url_is_one_line(command: str, value: str, words: str) -> None:
    assert_one_line(run(command, "--host", value), 2, f"--host {value!r}: {words}")
    assert_one_line(run(command, env={"LLMSAMPLE_HOST": value}), 2, f"LLMSAMPLE_HOST {value!r}: {words}")


class WebPage(http.server.BaseHTTPRequestHandler):
    """A web server of another kind: GET a 404 page, POST a 501 page (http.server's own)."""

    def do_GET(self) -> None:
        self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


class PageForAll(WebPage):
    """A server answering every request 200 with a page (a catch-all site)."""

    def do_GET(self) -> None:
        body = b"<!DOCTYPE html>\n<html><body>hello</body></html>\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET


class OtherApi(WebPage):
    """Another API's JSON errors (llama-server's shape): a 404 for paths it does not have."""

    def do_GET(self) -> None:
        body = json.dumps({"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}).encode()
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET


class Refuses(WebPage):
    """A server of llmsample's shape refusing the request with words that hold control characters."""

    def do_GET(self) -> None:
        body = json.dumps({"error": {"message": "bad\n\x1b[31mvalue", "type": "invalid_request_error"}}).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET


class RawBytes(socketserver.BaseRequestHandler):
    """Not HTTP: bytes with a terminal escape and a line break."""

    def handle(self) -> None:
        self.request.recv(65536)
        self.request.sendall(b"\x00\xffgarbage\x1b[31mred\r\nmore\n")


class Hangs(socketserver.BaseRequestHandler):
    """A server that reads the request and closes without an answer."""

    def handle(self) -> None:
        self.request.recv(65536)


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[str]:
    kind = http.server.ThreadingHTTPServer if issubclass(request.param, WebPage) else socketserver.ThreadingTCPServer
    with kind(("127.0.0.1", 0), request.param) as running:
        thread = threading.Thread(target=running.serve_forever, daemon=True)
        thread.start()
        yield f"http://127.0.0.1:{running.server_address[1]}"
        running.shutdown()


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    ("server", "answered", "posted"),  # posted: what generate's POST gets, where a GET gets another
    [
        (WebPage, "(HTTP 404, text/html", "(HTTP 501, text/html"),
        (PageForAll, "(HTTP 200, text/html", None),
        (OtherApi, "(HTTP 404, application/json)", None),
        (RawBytes, "(an answer that is not HTTP)", None),
    ],
    indirect=["server"],
)
def test_a_server_that_is_not_llmsample_is_one_line(command: str, server: str, answered: str, posted: str) -> None:
    result = run(command, "--host", server)
    assert_one_line(result, 2, f"{server} does not answer as llmsample serve does")
    assert ((command == "generate" and posted) or answered) in result.stderr


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("server", [Hangs], indirect=True)
def test_a_server_that_closes_without_answering_is_the_engine_gone(command: str, server: str) -> None:
    assert_one_line(run(command, "--host", server), 1, f"cannot reach the engine at {server}")


def test_a_closed_port_is_the_engine_gone() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for command in COMMANDS:
        assert_one_line(run(command, "--host", f"http://127.0.0.1:{port}"), 1, "cannot reach the engine at")


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("server", [Refuses], indirect=True)
def test_a_servers_words_are_one_line_with_control_characters_escaped(command: str, server: str) -> None:
    assert_one_line(run(command, "--host", server), 2, "Error: bad\\n\\x1b[31mvalue")
