"""A batch OpenAI completion line that scores its prompt, as lm-evaluation-harness asks a server:
``echo`` with ``logprobs`` answers the prompt's tokens with their log probabilities (the first
null) before the generated ones, and ``max_tokens: 0`` generates nothing; on a tiny model, each
figure against a full forward pass of transformers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from llmsample.api.local import LocalEngine
from llmsample.batch.requests import Request, RequestError, read_requests
from llmsample.batch.run import run_batch
from llmsample.batch.settings import BatchSettings

PROMPT = "w3 w4 w5 w6 w7"


def line(custom_id: str, url: str = "/v1/completions", **body: object) -> str:
    """An OpenAI Batch line; a key given as None is left out (a chat body has no prompt)."""
    body = {key: value for key, value in {"prompt": PROMPT, **body}.items() if value is not None}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def parsed(*lines: str) -> list[Request | RequestError]:
    return list(read_requests(lines))


def test_echo_and_max_tokens_zero_are_read_on_completion_lines() -> None:
    scoring, plain, zero_chat, echo_chat, bad_echo = parsed(
        line("a", echo=True, logprobs=2, max_tokens=0),
        line("b", max_tokens=3),
        line("c", url="/v1/chat/completions", messages=[{"role": "user", "content": "hi"}], prompt=None, max_tokens=0),
        line("d", url="/v1/chat/completions", messages=[{"role": "user", "content": "hi"}], prompt=None, echo=True),
        line("e", echo=1),
    )
    assert isinstance(scoring, Request) and scoring.echo and scoring.prompt_only and scoring.top_logprobs == 2
    assert "max_tokens" not in scoring.overrides
    assert isinstance(plain, Request) and not plain.echo and not plain.prompt_only
    assert isinstance(zero_chat, RequestError) and "max_tokens" in zero_chat.message  # chat generates something
    assert isinstance(echo_chat, RequestError) and "echo" in echo_chat.message
    assert isinstance(bad_echo, RequestError) and "body.echo: expected true or false" in bad_echo.message


def run(lm, *lines: str, fmt: str = "openai") -> list[dict]:
    out: list[dict] = []
    settings = BatchSettings(fmt=fmt, tokens="none", batch_size=2)  # type: ignore[arg-type]
    outcome = run_batch(LocalEngine(lambda: lm), parsed(*lines), frozenset(), settings, out.append)
    assert outcome.failed == 0
    return out


def full_logprobs(model_dir: Path, ids: list[int]) -> torch.Tensor:
    """Row i: the log probabilities after ``ids[: i + 1]``, from one forward pass of transformers."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].log_softmax(-1)


def test_echoed_prompt_logprobs_are_the_models_and_max_tokens_zero_generates_nothing(tiny_lm, tiny_model_dir) -> None:
    records = run(
        tiny_lm,
        line("score", echo=True, logprobs=2, max_tokens=0),
        line("score+1", echo=True, logprobs=1, max_tokens=1, temperature=0),
        line("echo-only", echo=True, max_tokens=0),
        line("nothing", max_tokens=0, logprobs=1),
    )
    assert [r["custom_id"] for r in records] == ["score", "score+1", "echo-only", "nothing"]
    bodies = {r["custom_id"]: r["response"]["body"] for r in records}
    ids = tiny_lm.tokenizer(PROMPT)["input_ids"]
    want = full_logprobs(tiny_model_dir, ids)

    choice = bodies["score"]["choices"][0]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    assert bodies["score"]["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)}
    columns = choice["logprobs"]
    assert "".join(columns["tokens"]) == tiny_lm.tokenizer.decode(ids)
    assert columns["token_logprobs"][0] is None and columns["top_logprobs"][0] is None
    for i, token in enumerate(ids[1:], 1):
        assert columns["token_logprobs"][i] == pytest.approx(want[i - 1, token].item(), abs=1e-4)
        top = columns["top_logprobs"][i]
        likeliest = want[i - 1].topk(2)
        assert [top[tiny_lm.token_text(t)] for t in likeliest.indices.tolist()] == pytest.approx(
            likeliest.values.tolist(), abs=1e-4
        )
        assert top[tiny_lm.token_text(token)] == columns["token_logprobs"][i]  # the token itself, as OpenAI lists it
        greedy = token == likeliest.indices[0].item()
        assert (columns["token_logprobs"][i] == max(top.values())) == greedy  # lm-eval's is_greedy reads this
    assert columns["text_offset"] == [0, 2, 5, 8, 11]

    one = bodies["score+1"]["choices"][0]
    assert one["logprobs"]["token_logprobs"][: len(ids)] == pytest.approx(columns["token_logprobs"])
    assert len(one["logprobs"]["tokens"]) == len(ids) + 1  # the prompt's, then the one generated
    assert one["text"] == PROMPT + one["logprobs"]["tokens"][-1]
    assert one["logprobs"]["text_offset"][-1] == len(PROMPT)
    greedy = int(want[-1].argmax())
    assert one["logprobs"]["llmsample"][-1]["token_id"] == greedy
    assert math.isclose(one["logprobs"]["token_logprobs"][-1], want[-1, greedy].item(), abs_tol=1e-4)

    assert bodies["echo-only"]["choices"][0]["text"] == PROMPT and bodies["echo-only"]["choices"][0]["logprobs"] is None
    nothing = bodies["nothing"]["choices"][0]
    assert nothing["text"] == "" and nothing["logprobs"]["tokens"] == [] and nothing["finish_reason"] == "length"


def test_max_tokens_zero_in_our_records(tiny_lm) -> None:
    """``--format jsonl``: the line's record says nothing was generated, between the others in order."""
    records = run(tiny_lm, line("a", max_tokens=2), line("b", max_tokens=0, echo=True), line("c"), fmt="jsonl")
    assert [r["custom_id"] for r in records] == ["a", "b", "c"]
    assert (records[1]["text"], records[1]["tokens"], records[1]["stop_reason"]) == ("", 0, "length")
    assert records[1]["prompt_tokens"] == 5
