"""The real ``openai`` client against a running server: OpenAI's shapes, whole and streamed."""

from __future__ import annotations

import math

import pytest

from tests.serve.conftest import NO_EOS, Server

MESSAGES = [{"role": "user", "content": "w3 w4 w5"}]


def chat(server: Server, model_id: str, **kwargs: object):
    return server.client().chat.completions.create(model=model_id, messages=MESSAGES, **kwargs)


def test_chat_completion_shape(server: Server, model_id: str) -> None:
    answer = chat(server, model_id, max_tokens=6, seed=3, extra_body={"logit_bias": NO_EOS})
    assert answer.object == "chat.completion"
    assert answer.id.startswith("chatcmpl-")
    assert answer.model == model_id
    assert answer.system_fingerprint.startswith("fp_")
    [choice] = answer.choices
    assert choice.index == 0 and choice.message.role == "assistant"
    assert choice.finish_reason == "length"
    assert choice.logprobs is None
    assert answer.usage.completion_tokens == 6
    assert answer.usage.prompt_tokens == 3
    assert answer.usage.total_tokens == 9


def test_chat_stream_is_the_whole_answer_in_chunks(server: Server, model_id: str) -> None:
    whole = chat(server, model_id, max_tokens=8, seed=11)
    chunks = list(chat(server, model_id, max_tokens=8, seed=11, stream=True, stream_options={"include_usage": True}))
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishing = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishing == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_whole_and_streamed(server: Server, model_id: str) -> None:
    client = server.client()
    whole = client.completions.create(model=model_id, prompt="w7 w8", max_tokens=5, seed=5)
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    streamed = list(client.completions.create(model=model_id, prompt="w7 w8", max_tokens=5, seed=5, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text
    assert streamed[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_chat_logprobs_are_the_raw_models(server: Server, model_id: str) -> None:
    answer = chat(
        server, model_id, max_tokens=5, seed=2, logprobs=True, top_logprobs=3, extra_body={"logit_bias": NO_EOS}
    )
    content = answer.choices[0].logprobs.content
    assert len(content) == 5
    assert "".join(entry.token for entry in content) == answer.choices[0].message.content
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert bytes(entry.bytes) == entry.token.encode()
        ours = entry.model_extra["llmsample"]
        assert math.isclose(entry.logprob, math.log(ours["model_prob"]), rel_tol=1e-6)


def test_streamed_logprobs_match_the_whole(server: Server, model_id: str) -> None:
    kwargs = {"max_tokens": 4, "seed": 8, "logprobs": True, "top_logprobs": 2}
    whole = chat(server, model_id, **kwargs).choices[0].logprobs.content
    chunks = chat(server, model_id, stream=True, **kwargs)
    streamed = [entry for c in chunks if c.choices and c.choices[0].logprobs for entry in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in whole]


def test_completion_logprobs_legacy_columns(server: Server, model_id: str) -> None:
    answer = server.client().completions.create(model=model_id, prompt="w3", max_tokens=4, seed=1, logprobs=2)
    logprobs = answer.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 4
    assert logprobs.text_offset[0] == len("w3")
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)


def test_seed_reproduces_and_n_is_consecutive_seeds(server: Server, model_id: str) -> None:
    kwargs = {"max_tokens": 6, "extra_body": {"logit_bias": NO_EOS}}
    first = chat(server, model_id, seed=21, **kwargs).choices[0].message.content
    assert chat(server, model_id, seed=21, **kwargs).choices[0].message.content == first
    several = chat(server, model_id, seed=21, n=3, **kwargs)
    assert [c.index for c in several.choices] == [0, 1, 2]
    assert several.usage.completion_tokens == 18 and several.usage.prompt_tokens == 3
    assert several.choices[0].message.content == first
    assert several.choices[2].message.content == chat(server, model_id, seed=23, **kwargs).choices[0].message.content


def test_n_streams_every_choice(server: Server, model_id: str) -> None:
    chunks = list(chat(server, model_id, seed=4, n=2, max_tokens=3, stream=True))
    texts = ["", ""]
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] += choice.delta.content or ""
    whole = chat(server, model_id, seed=4, n=2, max_tokens=3)
    assert texts == [c.message.content for c in whole.choices]


def test_llmsample_keys_and_per_token_records(server: Server, model_id: str) -> None:
    answer = chat(server, model_id, max_tokens=4, seed=9, extra_body={"top_k": 1, "llmsample": {"tokens": "full"}})
    greedy = chat(server, model_id, max_tokens=4, seed=1, temperature=0)
    assert answer.choices[0].message.content == greedy.choices[0].message.content
    ours = answer.choices[0].model_extra["llmsample"]
    assert ours["seed"] == 9 and ours["stop_reason"] in ("eos", "length")
    records = ours["tokens"]
    assert len(records) == answer.usage.completion_tokens
    assert {"token_id", "prob", "model_prob", "model_rank", "entropy", "top", "removed", "source"} <= records[0].keys()
    assert records[0]["prob"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}, "chat_template_kwargs"),
        ({"temperature": -1}, "temperature"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"n": 0}, "n"),
        ({"max_tokens": 5000}, "max_tokens"),
        ({"extra_body": {"preset": "no-such-preset"}}, "preset"),
    ],
)
def test_bad_requests_are_the_clients_bad_request_error(
    server: Server, model_id: str, kwargs: dict, param: str
) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as caught:
        chat(server, model_id, **kwargs)
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == param
    assert param in caught.value.body["message"]


def test_unknown_model_is_not_found(server: Server) -> None:
    import openai

    with pytest.raises(openai.NotFoundError) as caught:
        server.client().chat.completions.create(model="gpt-nope", messages=MESSAGES)
    assert caught.value.body["param"] == "model" and "gpt-nope" in caught.value.body["message"]


def test_models_lists_the_one_model(server: Server, model_id: str) -> None:
    assert [m.id for m in server.client().models.list()] == [model_id]
