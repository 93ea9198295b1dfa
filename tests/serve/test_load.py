"""A bounded load on loopback: 32 concurrent clients, streamed and whole, mixed settings, one
client gone mid-stream; every other request completes with its own tokens, none lost or
doubled, and the server lets go of everything afterwards."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx

from tests.serve.conftest import NO_EOS, Server, wait_in_flight

CLIENTS = 32


def body_for(i: int) -> dict:
    body = {"prompt": f"w{3 + i % 20} w{4 + i % 7}", "seed": 100 + i, "max_tokens": 8 + i % 9}
    body["llmsample"] = {"tokens": "ids"}
    if i % 3 == 0:
        body["top_k"] = 5
    if i % 4 == 1:
        body["temperature"] = 0.7
    if i % 5 == 2:
        body["logit_bias"] = NO_EOS
    return body


def whole(client: httpx.Client, body: dict) -> list[int]:
    answer = client.post("/v1/completions", json={**body, "stream": False})
    assert answer.status_code == 200, answer.text
    return [t["token_id"] for t in answer.json()["choices"][0]["llmsample"]["tokens"]]


def streamed(client: httpx.Client, body: dict, stop_after: int | None = None) -> list[int]:
    ids, finished, done = [], 0, False
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            choice = json.loads(line.removeprefix("data: "))["choices"][0]
            ids += [t["token_id"] for t in choice.get("llmsample", {}).get("tokens", [])]
            finished += choice["finish_reason"] is not None
            if stop_after is not None and len(ids) >= stop_after:
                return ids  # the client goes away mid-stream
    assert done and finished == 1
    return ids


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))


def test_32_clients_one_killed(server: Server) -> None:
    bodies = [body_for(i) for i in range(CLIENTS)]
    killed = 7
    bodies[killed] = {**bodies[killed], "max_tokens": 400, "logit_bias": NO_EOS}
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    before = rss_kib(server.proc.pid)
    cancelled = httpx.get(server.url + "/health").json()["cancelled"]

    def client(i: int) -> None:
        try:
            with httpx.Client(base_url=server.url, timeout=120) as http:
                if i == killed:
                    streamed(http, bodies[i], stop_after=3)
                else:
                    results[i] = streamed(http, bodies[i]) if i % 2 else whole(http, bodies[i])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert not errors, errors
    assert sorted(results) == [i for i in range(CLIENTS) if i != killed]
    wait_in_flight(server, 0)
    assert httpx.get(server.url + "/health").json()["cancelled"] == cancelled + 1  # the one that went away
    with httpx.Client(base_url=server.url, timeout=120) as http:
        for i, got in results.items():  # the same request alone: the same tokens
            assert got == whole(http, bodies[i]), i
            assert len(got) == bodies[i]["max_tokens"] or 1 in got  # its length, or it ended at <eos>
    assert rss_kib(server.proc.pid) - before < 200 * 1024  # what the load left behind stays bounded
