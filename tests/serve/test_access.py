"""The access log's line (issue 60): a stream the client cancels counts the tokens it was sent,
and a request whose keys were ignored says which; the caller learns of those keys too, in the
answer's ``warnings`` and in an ``X-Llmsample-Warnings`` header, streamed or not, on every API."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest

from tests.serve.conftest import NO_EOS, Server

LINE = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d 127\.0\.0\.1 POST "
TYPO = "temprature: ignored (unknown parameter; did you mean 'temperature'?)"


def line_after(log: Path, offset: int, pattern: str) -> re.Match[str]:
    """The first line matching ``pattern`` written after ``offset`` (a server writes it once the
    answer has gone out, or the client has gone)."""
    deadline = time.monotonic() + 60
    while not (found := re.search(pattern, log.read_text(errors="replace")[offset:], re.MULTILINE)):
        assert time.monotonic() < deadline, f"no line {pattern!r} in the log: {log.read_text(errors='replace')}"
        time.sleep(0.05)
    return found


ASKED = {
    "/v1/completions": ({"prompt": "w3 w4"}, "max_tokens"),
    "/v1/chat/completions": ({"messages": [{"role": "user", "content": "w3 w4"}]}, "max_tokens"),
    "/v1/messages": ({"messages": [{"role": "user", "content": "w3 w4"}]}, "max_tokens"),
    "/v1/responses": ({"input": "w3 w4"}, "max_output_tokens"),
}


def asked(path: str, model: str, tokens: int, **more: object) -> dict:
    """A body for ``path``: its prompt in that API's key, ``tokens`` long (in that API's key)."""
    prompt, length = ASKED[path]
    return {"model": model, **prompt, length: tokens, "logit_bias": NO_EOS, **more}


@pytest.mark.parametrize("path", list(ASKED))
def test_a_cancelled_stream_logs_the_tokens_it_was_sent(server: Server, model_id: str, path: str) -> None:
    offset = len(server.log.read_text(errors="replace"))
    cancelled = httpx.get(server.url + "/health").json()["cancelled"]
    read = 0
    body = asked(path, model_id, 1000, stream=True, seed=3)
    with httpx.stream("POST", server.url + path, json=body, timeout=60) as streaming:
        assert streaming.status_code == 200, streaming.read()
        for line in streaming.iter_lines():
            read += line.startswith("data:")
            if read >= 12:
                break
    found = line_after(server.log, offset, rf"{LINE}{re.escape(path)} 200 (\d+)\+(\d+) tokens ")
    prompt, completion = int(found.group(1)), int(found.group(2))
    assert prompt >= 2 and 6 <= completion < 1000, found.group(0)  # 12 events read, a few of them openings
    assert httpx.get(server.url + "/health").json()["cancelled"] == cancelled + 1  # not decoded to the end


def test_ignored_keys_are_noted_on_the_requests_line(server: Server) -> None:
    offset = len(server.log.read_text(errors="replace"))
    body = {"prompt": "w3", "max_tokens": 2, "temprature": 0.5, "store": True}
    assert httpx.post(server.base + "/completions", json=body, timeout=60).status_code == 200
    found = line_after(server.log, offset, rf"{LINE}/v1/completions 200 .* s( .*)?$")
    assert found.group(0).endswith(" s warnings: temprature, store"), found.group(0)
    assert "keys were ignored" not in server.log.read_text()[offset:]  # one line per request, not two
    plain = httpx.post(server.base + "/completions", json={"prompt": "w3", "max_tokens": 2}, timeout=60)
    assert plain.status_code == 200
    offset += found.end()
    assert line_after(server.log, offset, rf"{LINE}/v1/completions 200 .*$").group(0).endswith(" s")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("path", list(ASKED))
def test_ignored_keys_come_back_in_the_answer_and_a_header(
    server: Server, model_id: str, path: str, stream: bool
) -> None:
    body = asked(path, model_id, 2, stream=stream, temprature=0.5)
    response = httpx.post(server.url + path, json=body, timeout=60)
    assert response.status_code == 200, response.text
    warnings = json.loads(response.headers["x-llmsample-warnings"])
    assert warnings == [TYPO]
    assert TYPO in response.text  # the body's warnings (a stream's first event)
    del body["temprature"]
    clean = httpx.post(server.url + path, json=body, timeout=60)
    assert clean.status_code == 200 and "x-llmsample-warnings" not in clean.headers
