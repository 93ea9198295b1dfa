"""Result and error records: exact shapes, strict JSON, OpenAI's format, deterministic ids."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from llmsample.batch.requests import Request, RequestError, read_requests
from llmsample.batch.result_lines import (
    dumps,
    error_record,
    openai_error_record,
    openai_result_record,
    request_digest,
    result_record,
)
from llmsample.events import Candidate, RunFacts, Summary, TokenEvent

REPO = Path(__file__).resolve().parents[2]


def event(
    index: int, token_id: int, text: str, prob: float, model_prob: float, top=(), eos: bool = False
) -> TokenEvent:
    return TokenEvent(
        index=index,
        token_id=token_id,
        text=text,
        prob=prob,
        model_prob=model_prob,
        model_rank=1,
        entropy=0.5,
        top=tuple(top),
        removed={"top_k": 3, "top_p": 0, "min_p": 0},
        eos=eos,
    )


EVENTS = [
    event(0, 10, " Par", 0.75, 0.5, [Candidate(10, " Par", 0.75, 0.5), Candidate(11, " Lyon", 0.25, 0.25)]),
    # A split character: the first byte releases nothing, the second the whole "é".
    event(1, 12, "", 1.0, 0.9, [Candidate(12, "\ufffd", 1.0, 0.9), Candidate(13, "x", 0.0, 0.0)]),
    event(2, 14, "is é", 1.0, 1.0, [Candidate(14, "\ufffd", 1.0, 1.0)]),
    event(3, 2, "", 0.5, 0.25, [Candidate(2, "", 0.5, 0.25)], eos=True),
]


def summary(stop_reason: str = "eos", **changes: object) -> Summary:
    values = {
        "text": " Paris é",
        "tokens": 4,
        "prompt_tokens": 9,
        "stop_reason": stop_reason,
        "ttft_s": 0.25,
        "tokens_per_s": 12.0,
        "model": "tiny",
        "preset": "balanced",
        "seed": 5,
        "elapsed_s": 0.5,
        "facts": RunFacts(compile_s=2.0),  # the run's facts ride along
    }
    return Summary(**{**values, **changes})


CHAT = Request(line=3, custom_id="q1", prompt="Capital of France?")
RAW = Request(line=4, custom_id="q2", prompt="The capital is", raw=True, openai=True, logprobs=True, top_logprobs=2)


def strict_loads(line: str) -> dict:
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in the output")

    assert "\n" not in line
    return json.loads(line, parse_constant=refuse)


def test_our_record_ids_level() -> None:
    record = result_record(CHAT, summary(), EVENTS)
    assert record == {
        "custom_id": "q1",
        "line": 3,
        "text": " Paris é",
        "tokens": 4,
        "prompt_tokens": 9,
        "stop_reason": "eos",
        "ttft_s": 0.25,
        "tokens_per_s": 12.0,
        "model": "tiny",
        "preset": "balanced",
        "seed": 5,
        "elapsed_s": 0.5,
        "compile_s": 2.0,
        "per_token": [
            {"token_id": 10, "prob": 0.75},
            {"token_id": 12, "prob": 1.0},
            {"token_id": 14, "prob": 1.0},
            {"token_id": 2, "prob": 0.5},
        ],
    }
    assert list(record)[:2] == ["custom_id", "line"]
    assert strict_loads(dumps(record)) == record


def test_our_record_none_and_full_levels() -> None:
    none = result_record(CHAT, summary(), EVENTS, tokens="none")
    assert "per_token" not in none and none["tokens"] == 4
    full = result_record(CHAT, summary(), EVENTS, tokens="full")
    assert full["per_token"][0] == {
        "index": 0,
        "token_id": 10,
        "text": " Par",
        "prob": 0.75,
        "model_prob": 0.5,
        "model_rank": 1,
        "entropy": 0.5,
        "top": [
            {"token_id": 10, "text": " Par", "prob": 0.75, "model_prob": 0.5},
            {"token_id": 11, "text": " Lyon", "prob": 0.25, "model_prob": 0.25},
        ],
        "removed": {"top_k": 3, "top_p": 0, "min_p": 0},
        "source": "target",
        "eos": False,
    }
    assert [e["eos"] for e in full["per_token"]] == [False, False, False, True]
    assert strict_loads(dumps(full)) == full
    with pytest.raises(ValueError, match="tokens level 'some'"):
        result_record(CHAT, summary(), EVENTS, tokens="some")  # type: ignore[arg-type]


def test_unfinished_requests_have_no_result_record() -> None:
    for build in (result_record, openai_result_record):
        with pytest.raises(ValueError, match="'interrupted': an unfinished request"):
            build(CHAT, summary("interrupted"), EVENTS)


def test_dumps_is_strict_and_keeps_text() -> None:
    with pytest.raises(ValueError):
        dumps(result_record(CHAT, summary(tokens_per_s=math.nan), EVENTS))
    with pytest.raises(ValueError):
        dumps(result_record(CHAT, summary(), [replace(EVENTS[0], prob=math.inf)]))
    line = dumps(result_record(CHAT, summary(text="été\nnext line\u2028"), EVENTS))
    assert "été" in line and "\\n" in line and "\n" not in line


def test_our_error_record() -> None:
    record = error_record(RequestError(7, None, "invalid JSON: Expecting value (column 1)"))
    assert record == {
        "custom_id": None,
        "line": 7,
        "error": {"code": "invalid_request", "message": "invalid JSON: Expecting value (column 1)"},
    }
    assert strict_loads(dumps(record)) == record


def test_openai_chat_record() -> None:
    record = openai_result_record(CHAT, summary(), EVENTS, created=1700000000)
    digest = request_digest(CHAT)
    assert len(digest) == 24 and all(c in "0123456789abcdef" for c in digest)
    assert record == {
        "id": f"batch_req_{digest}",
        "custom_id": "q1",
        "response": {
            "status_code": 200,
            "request_id": f"req_{digest}",
            "body": {
                "id": f"chatcmpl-{digest}",
                "object": "chat.completion",
                "created": 1700000000,
                "model": "tiny",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": " Paris é"},
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13},
                "llmsample": {
                    "line": 3,
                    "stop_reason": "eos",
                    "ttft_s": 0.25,
                    "tokens_per_s": 12.0,
                    "preset": "balanced",
                    "seed": 5,
                    "elapsed_s": 0.5,
                    "compile_s": 2.0,
                },
            },
        },
        "error": None,
    }
    assert strict_loads(dumps(record)) == record


@pytest.mark.parametrize(("stop_reason", "finish"), [("eos", "stop"), ("stop", "stop"), ("length", "length")])
def test_finish_reasons(stop_reason: str, finish: str) -> None:
    record = openai_result_record(CHAT, summary(stop_reason), EVENTS)
    assert record["response"]["body"]["choices"][0]["finish_reason"] == finish


def test_openai_chat_logprobs_are_the_raw_models() -> None:
    request = replace(CHAT, openai=True, logprobs=True, top_logprobs=1)
    content = openai_result_record(request, summary(), EVENTS)["response"]["body"]["choices"][0]["logprobs"]["content"]
    assert content[0] == {
        "token": " Par",
        "logprob": math.log(0.5),
        "bytes": [32, 80, 97, 114],
        "top_logprobs": [
            {
                "token": " Par",
                "logprob": math.log(0.5),
                "bytes": [32, 80, 97, 114],
                "llmsample": {"token_id": 10, "prob": 0.75},
            }
        ],
        "llmsample": {
            "token_id": 10,
            "prob": 0.75,
            "model_prob": 0.5,
            "model_rank": 1,
            "entropy": 0.5,
            "removed": {"top_k": 3, "top_p": 0, "min_p": 0},
            "source": "target",
            "eos": False,
        },
    }
    assert content[1]["token"] == "" and content[1]["bytes"] == []
    assert content[2]["bytes"] == list("is é".encode())
    assert content[2]["logprob"] == 0.0
    assert "".join(entry["token"] for entry in content) == " Paris é"
    assert content[3]["llmsample"]["eos"] is True


def test_openai_chat_logprobs_bytes_are_each_tokens_own() -> None:
    """With the model's token bytes, a split character's tokens each carry their part of it."""
    own = {10: b" Par", 11: b" Lyon", 12: b"is \xc3", 13: b"x", 14: b"\xa9"}
    request = replace(CHAT, openai=True, logprobs=True, top_logprobs=2)
    record = openai_result_record(request, summary(), EVENTS, token_bytes=own.get)
    content = record["response"]["body"]["choices"][0]["logprobs"]["content"]
    assert [entry["bytes"] for entry in content] == [list(b" Par"), list(b"is \xc3"), [0xA9], []]  # the EOS: none
    assert bytes(b for entry in content for b in entry["bytes"]) == " Paris é".encode()
    assert [alt["bytes"] for alt in content[1]["top_logprobs"]] == [list(b"is \xc3"), [ord("x")]]
    assert [entry["token"] for entry in content] == [" Par", "", "is é", ""]  # the text as released


def test_zero_probability_is_openais_floor_not_infinity() -> None:
    request = replace(CHAT, openai=True, logprobs=True, top_logprobs=5)
    line = dumps(openai_result_record(request, summary(), EVENTS))
    content = strict_loads(line)["response"]["body"]["choices"][0]["logprobs"]["content"]
    assert [alt["logprob"] for alt in content[1]["top_logprobs"]] == [math.log(0.9), -9999.0]
    assert len(content[0]["top_logprobs"]) == 2  # fewer alternatives than asked: what there is
    tiny = openai_result_record(
        request, summary(), [replace(EVENTS[0], model_prob=1e-300), replace(EVENTS[2], model_prob=1.0000001)]
    )
    logprobs = [entry["logprob"] for entry in tiny["response"]["body"]["choices"][0]["logprobs"]["content"]]
    assert logprobs == [math.log(1e-300), 0.0]  # a tiny probability keeps its true log


def test_openai_completion_record_with_legacy_logprobs() -> None:
    events = [
        *EVENTS[:3],
        replace(EVENTS[0], index=3, top=(Candidate(20, "a", 0.6, 0.5), Candidate(21, "a", 0.4, 0.5))),
    ]
    body = openai_result_record(RAW, summary(text=" Paris é Par"), events)["response"]["body"]
    assert body["id"] == f"cmpl-{request_digest(RAW)}" and body["object"] == "text_completion"
    choice = body["choices"][0]
    assert choice["text"] == " Paris é Par" and "message" not in choice
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == [" Par", "", "is é", " Par"]
    assert logprobs["token_logprobs"] == [math.log(0.5), math.log(0.9), 0.0, math.log(0.5)]
    assert logprobs["top_logprobs"] == [
        {" Par": math.log(0.5), " Lyon": math.log(0.25)},
        {"\ufffd": math.log(0.9), "x": -9999.0},
        {"\ufffd": 0.0},
        {"a": math.log(0.5)},  # two alternatives decode alike: the first (likelier) one stays
    ]
    prompt = len("The capital is")
    assert logprobs["text_offset"] == [prompt, prompt + 4, prompt + 4, prompt + 8]
    assert [entry["token_id"] for entry in logprobs["llmsample"]] == [10, 12, 14, 10]
    no_logprobs = openai_result_record(replace(RAW, logprobs=False), summary(), EVENTS)
    assert no_logprobs["response"]["body"]["choices"][0]["logprobs"] is None


def test_openai_error_record() -> None:
    record = openai_error_record(RequestError(5, "r9", "body.n: only one choice", code="invalid_request"))
    assert record["id"].startswith("batch_req_") and len(record["id"]) == len("batch_req_") + 24
    assert record == {
        "id": record["id"],
        "custom_id": "r9",
        "response": None,
        "error": {"code": "invalid_request", "message": "line 5: body.n: only one choice"},
    }
    assert openai_error_record(RequestError(5, "r9", "other text"))["id"] == record["id"]
    assert openai_error_record(RequestError(6, "r9", "x"))["id"] != record["id"]
    assert openai_error_record(RequestError(5, None, "x"))["id"] != record["id"]
    assert strict_loads(dumps(record)) == record


def test_ids_follow_the_request_not_the_run() -> None:
    base = openai_result_record(CHAT, summary(), EVENTS)["id"]
    assert openai_result_record(CHAT, summary(seed=99, elapsed_s=9.0), EVENTS[:1])["id"] == base
    assert openai_result_record(replace(CHAT, line=40), summary(), EVENTS)["id"] == base
    for changed in (
        replace(CHAT, custom_id="other"),
        replace(CHAT, prompt="Capital of Spain?"),
        replace(CHAT, overrides={"seed": 1}),
        replace(CHAT, preset="creative"),
        replace(CHAT, logprobs=True),
    ):
        assert openai_result_record(changed, summary(), EVENTS)["id"] != base


def test_ids_are_the_same_in_another_process() -> None:
    """No salted hash() or randomness: a rerun (another process) writes the same ids."""
    code = (
        "from llmsample.batch.requests import Request; from llmsample.batch.result_lines import request_digest; "
        "print(request_digest(Request(line=3, custom_id='q1', prompt='Capital of France?', overrides={'stop': ('a',)})))"
    )
    digests = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        digests.add(done.stdout.strip())
    assert digests == {request_digest(replace(CHAT, overrides={"stop": ("a",)}))}


def test_round_trip_from_input_lines() -> None:
    lines = [
        "Plain prompt",
        json.dumps({"custom_id": "ours", "prompt": "x", "temperature": 0}),
        json.dumps(
            {"custom_id": "oa", "method": "POST", "url": "/v1/completions", "body": {"prompt": "p", "logprobs": 1}}
        ),
        '{"custom_id": "bad", "prompt": "x", "top_p": 2}',
    ]
    out = []
    for item in read_requests(lines):
        if isinstance(item, RequestError):
            out += [dumps(error_record(item)), dumps(openai_error_record(item))]
        else:
            out += [
                dumps(result_record(item, summary(), EVENTS, "full")),
                dumps(openai_result_record(item, summary(), EVENTS)),
            ]
    records = [strict_loads(line) for line in out]
    assert [r["custom_id"] for r in records] == ["line-1", "line-1", "ours", "ours", "oa", "oa", "bad", "bad"]
    assert records[4]["line"] == 3 and records[5]["response"]["body"]["object"] == "text_completion"
    assert records[6]["error"]["message"].startswith("top_p: must be in (0, 1]")
    assert records[7]["error"]["message"].startswith("line 4: top_p")
