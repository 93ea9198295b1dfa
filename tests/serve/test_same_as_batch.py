"""A request's tokens through the server are the same request's through ``llmsample batch``
(same seed, float32), whatever else is decoding beside it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import httpx

from tests.conftest import cli_env
from tests.serve.conftest import NO_EOS, Server

CASES = [
    {"messages": [{"role": "user", "content": "w3 w4"}], "seed": 5, "temperature": 0.9, "top_k": 8, "max_tokens": 12},
    {"prompt": "w3 w9", "seed": 6, "min_p": 0.1, "presence_penalty": 0.5, "max_tokens": 10},
    {"prompt": "w4", "seed": 7, "dry_multiplier": 0.8, "typical_p": 0.9, "max_tokens": 16, "logit_bias": NO_EOS},
    {"prompt": "w5 w6 w7", "seed": 8, "frequency_penalty": 1.0, "xtc_probability": 0.5, "max_tokens": 14},
]
BUSY = [
    {"prompt": "w8", "seed": s, "max_tokens": 60, "logit_bias": NO_EOS, "stream": True, "top_p": 0.8 + s / 100}
    for s in range(5)
]


def through_batch(model: Path) -> list[list[int]]:
    lines = [json.dumps({**case, **({} if "messages" in case else {"raw": True})}) for case in CASES]
    command = [sys.executable, "-m", "llmsample", "batch", "-m", str(model), "--device", "cpu", "--dtype", "float32",
               "--tokens", "ids", "-q", "--batch-size", "2"]  # fmt: skip
    done = subprocess.run(command, input="\n".join(lines), capture_output=True, text=True, env=cli_env(), timeout=300)
    assert done.returncode == 0, done.stderr
    return [[t["token_id"] for t in json.loads(line)["per_token"]] for line in done.stdout.splitlines()]


def through_server(server: Server, case: dict) -> list[int]:
    path = "/v1/chat/completions" if "messages" in case else "/v1/completions"
    body = {**case, "llmsample": {"tokens": "ids"}}
    answer = httpx.post(server.url + path, json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    return [t["token_id"] for t in answer.json()["choices"][0]["llmsample"]["tokens"]]


def stream_out(server: Server, body: dict, seen: list[int]) -> None:
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as response:
        seen.extend(1 for line in response.iter_lines() if line.startswith("data: {"))


def test_server_tokens_equal_batch_tokens_while_others_decode(server: Server, chat_model_dir: Path) -> None:
    expected = through_batch(chat_model_dir)
    counts: list[list[int]] = [[] for _ in BUSY]
    busy = [
        threading.Thread(target=stream_out, args=(server, body, seen)) for body, seen in zip(BUSY, counts, strict=True)
    ]
    for thread in busy:
        thread.start()
    got: list[list[int] | None] = [None] * len(CASES)

    def one(i: int) -> None:
        got[i] = through_server(server, CASES[i])

    tested = [threading.Thread(target=one, args=(i,)) for i in range(len(CASES))]
    for thread in tested:
        thread.start()
    for thread in tested + busy:
        thread.join(300)
    assert got == expected
    assert all(len(seen) == 61 for seen in counts)  # the busy streams: 60 tokens and a final chunk
