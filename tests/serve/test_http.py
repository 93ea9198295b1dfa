"""Every error status over plain HTTP, in OpenAI's error shape, and the small endpoints."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.serve.conftest import NO_EOS, Server, serve_process, start_server, wait_in_flight

KEY = "sekret-key"


@pytest.fixture(scope="module")
def strict(chat_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A key from the environment, one row and room for one waiting request."""
    log = tmp_path_factory.mktemp("strict") / "stderr"
    running = start_server(chat_model_dir, log, "--batch-size", "1", "--max-queue", "1", env={"LLMSAMPLE_API_KEY": KEY})
    yield running
    running.stop()


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def post(server: Server, path: str, **kwargs: object) -> httpx.Response:
    return httpx.post(server.url + path, timeout=60, **kwargs)


def test_bad_json_is_400(server: Server) -> None:
    error = error_of(post(server, "/v1/chat/completions", content=b'{"messages": [}'), 400)
    assert "not valid JSON" in error["message"] and error["type"] == "invalid_request_error"
    error = error_of(post(server, "/v1/completions", content=b'{"prompt": "w3", "temperature": NaN}'), 400)
    assert "NaN" in error["message"]
    error_of(post(server, "/v1/completions", content=b"[1, 2]"), 400)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "w3", "suffix": "w4"}, "suffix"),
        ({"prompt": "w3", "top_p": 0}, "top_p"),
        ({"prompt": 3}, "prompt"),
        ({"prompt": "w3", "min_p": 2}, "min_p"),
        ({"prompt": "w3", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"prompt": "w3", "llmsample": {"tokens": "all"}}, "llmsample"),
        ({"prompt": "w3", "logit_bias": {"not one token": 5}}, "logit_bias"),
        ({"prompt": "w3", "max_tokens": 1024}, "max_tokens"),
        ({"prompt": "w3", "messages": []}, "messages"),
    ],
)
def test_bad_values_name_the_parameter(server: Server, body: dict, param: str) -> None:
    error = error_of(post(server, "/v1/completions", json=body), 400)
    assert error["param"] == param, error


def test_max_completion_tokens_beyond_the_context_names_it(server: Server) -> None:
    body = {"messages": [{"role": "user", "content": "w3"}], "max_completion_tokens": 4000}
    error = error_of(post(server, "/v1/chat/completions", json=body), 400)
    assert error["param"] == "max_completion_tokens" and "context of 1024" in error["message"]


def test_unknown_model_and_path_are_404(server: Server) -> None:
    error = error_of(post(server, "/v1/completions", json={"prompt": "w3", "model": "other"}), 404)
    assert error["param"] == "model" and error["code"] == "model_not_found"
    error = error_of(httpx.get(server.url + "/v1/nothing-here"), 404)
    assert error["code"] == "not_found" and "no such endpoint" in error["message"]


def test_a_wrong_method_is_405_naming_the_right_one(server: Server) -> None:
    response = httpx.get(server.url + "/v1/chat/completions")
    error = error_of(response, 405)
    assert error["code"] == "method_not_allowed" and response.headers["allow"] == "POST"
    assert error["message"] == "GET /v1/chat/completions: method not allowed; use POST"
    assert error_of(post(server, "/v1/models"), 405)["code"] == "method_not_allowed"


def test_one_model_by_its_id(server: Server, model_id: str) -> None:
    model = httpx.get(f"{server.url}/v1/models/{model_id}").json()
    assert model == {"id": model_id, "object": "model", "created": 0, "owned_by": "llmsample", "max_model_len": 1024}
    error = error_of(httpx.get(server.url + "/v1/models/gpt-4o"), 404)
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert server.client().models.retrieve(model_id).id == model_id  # ids with slashes, as the client sends them


def test_a_body_over_the_limit_is_413(server: Server) -> None:
    big = json.dumps({"prompt": "w3 " * (2 * 2**20)}).encode()
    error = error_of(post(server, "/v1/completions", content=big), 413)
    assert "limit" in error["message"]


def test_health_tokenize_detokenize(server: Server) -> None:
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    tokens = post(server, "/tokenize", json={"prompt": "w3 w4", "add_special_tokens": False}).json()
    assert tokens["tokens"] == [3, 4] and tokens["count"] == 2 and tokens["max_model_len"] == 1024
    chat = post(server, "/tokenize", json={"messages": [{"role": "user", "content": "w5"}]}).json()
    assert chat["tokens"] == [5]
    assert post(server, "/detokenize", json={"tokens": [3, 4]}).json() == {"prompt": "w3 w4"}
    assert error_of(post(server, "/detokenize", json={"tokens": [99999]}), 400)["param"] == "tokens"


def test_a_key_is_required_401(strict: Server) -> None:
    import openai

    body = {"prompt": "w3", "max_tokens": 2}
    error = error_of(post(strict, "/v1/completions", json=body), 401)
    assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
    error_of(post(strict, "/v1/completions", json=body, headers={"Authorization": "Bearer wrong"}), 401)
    assert post(strict, "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert httpx.get(strict.url + "/health").status_code == 200  # load balancers probe without the key
    with pytest.raises(openai.AuthenticationError):
        strict.client(api_key="wrong").models.list()
    assert strict.client(api_key=KEY).models.list().data


def test_a_full_queue_is_503_with_retry_after_and_a_disconnect_frees_the_row(strict: Server) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"prompt": "w3", "max_tokens": 1000, "logit_bias": NO_EOS, "stream": True}
    cancelled = httpx.get(strict.url + "/health").json()["cancelled"]
    with (
        httpx.Client(base_url=strict.url, headers=headers, timeout=60) as first,
        httpx.Client(base_url=strict.url, headers=headers, timeout=60) as second,
    ):
        with first.stream("POST", "/v1/completions", json=body) as running:
            lines = running.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))  # decoding: the one row is taken
            with second.stream("POST", "/v1/completions", json=body) as waiting:
                wait_in_flight(strict, 2)  # the second request waits in the queue
                refused = post(strict, "/v1/completions", json=body, headers=headers)
                error = error_of(refused, 503)
                assert int(refused.headers["retry-after"]) >= 1 and error["code"] == "server_busy"
                waiting.close()
        # both clients went away: their rows are cancelled, nothing stays in flight
        wait_in_flight(strict, 0)
    assert httpx.get(strict.url + "/health").json()["cancelled"] == cancelled + 2  # not decoded to the end
    assert post(strict, "/v1/completions", json={"prompt": "w3", "max_tokens": 2}, headers=headers).status_code == 200


def test_max_model_len_is_every_requests_context(chat_model_dir: Path, tmp_path: Path) -> None:
    """``--max-model-len``: what ``/v1/models`` reports and requests are held to; beyond the
    model's own context it is one line and exit 2, before anything listens."""
    running = start_server(chat_model_dir, tmp_path / "stderr", "--max-model-len", "48")
    try:
        model = httpx.get(running.url + "/v1/models", timeout=30).json()["data"][0]
        assert model["max_model_len"] == 48
        error = error_of(post(running, "/v1/completions", json={"prompt": "w3", "max_tokens": 60}), 400)
        assert error["param"] == "max_tokens" and "context of 48" in error["message"]
        assert post(running, "/v1/completions", json={"prompt": "w3", "max_tokens": 40}).status_code == 200
    finally:
        running.stop()
    with open(tmp_path / "refused", "wb") as err:
        refused = serve_process(chat_model_dir, err, "--max-model-len", "5000")
        assert refused.wait(timeout=120) == 2
    lines = (tmp_path / "refused").read_text().strip().splitlines()
    assert lines == ["Error: --max-model-len 5000 is beyond the model's context of 1024; give at most 1024"], lines
