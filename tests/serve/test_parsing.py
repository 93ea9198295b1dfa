"""Request bodies to engine requests, without a server."""

from __future__ import annotations

import pytest

from llmsample.batch.requests import CHAT_URL, COMPLETIONS_URL
from llmsample.serve.errors import ApiError
from llmsample.serve.parsing import load_json, parse_body
from llmsample.serve.server import exposure_warning

PRESETS = frozenset({"balanced", "code"})
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def refused(body: object, url: str = CHAT_URL) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_body(body, url, PRESETS)
    assert caught.value.status == 400
    return caught.value


def test_openai_keys_and_ours_together() -> None:
    body = {**CHAT, "temperature": 0.5, "top_k": 7, "dry_multiplier": 0.8, "preset": "code", "max_completion_tokens": 9}
    serve = parse_body({**body, "n": 2, "stream": True, "stream_options": {"include_usage": True}}, CHAT_URL, PRESETS)
    request = serve.request
    assert request.overrides == {"temperature": 0.5, "top_k": 7, "dry_multiplier": 0.8, "max_tokens": 9}
    assert request.preset == "code" and serve.n == 2 and serve.stream and serve.include_usage
    assert serve.max_tokens_key == "max_completion_tokens"


def test_null_means_not_given() -> None:
    serve = parse_body({**CHAT, "temperature": None, "n": None, "stream": None, "top_k": None}, CHAT_URL, PRESETS)
    assert serve.request.overrides == {} and serve.n == 1 and not serve.stream


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**CHAT, "top_kk": 3}, "top_kk"),
        ({**CHAT, "tools": [{"type": "function"}]}, "tools"),
        ({**CHAT, "n": 17}, "n"),
        ({**CHAT, "n": True}, "n"),
        ({**CHAT, "stream": "yes"}, "stream"),
        ({**CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
        ({**CHAT, "llmsample": {"tokens": "all"}}, "llmsample"),
        ({**CHAT, "preset": "nope"}, "preset"),
        ({**CHAT, "top_k": -1}, "top_k"),
        ({**CHAT, "max_tokens": 3, "max_completion_tokens": 3}, None),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"prompt": "x"}, "prompt"),
    ],
)
def test_bad_bodies_name_the_parameter(body: dict, param: str | None) -> None:
    assert refused(body).param == param


def test_completions_take_their_own_keys() -> None:
    assert refused({"prompt": "w3", "top_logprobs": 2}, COMPLETIONS_URL).param == "top_logprobs"
    serve = parse_body({"prompt": "w3", "logprobs": 3, "min_p": 0.1}, COMPLETIONS_URL, PRESETS)
    assert serve.request.raw and serve.request.top_logprobs == 3 and serve.request.overrides == {"min_p": 0.1}


@pytest.mark.parametrize("raw", [b"{", b'{"a": NaN}', b"\xff", b'{"a": Infinity}'])
def test_bad_json(raw: bytes) -> None:
    with pytest.raises(ApiError) as caught:
        load_json(raw)
    assert caught.value.status == 400


def test_exposure_warning() -> None:
    assert exposure_warning("127.0.0.1", None) is None
    assert exposure_warning("0.0.0.0", "key") is None
    warning = exposure_warning("0.0.0.0", None)
    assert warning is not None and "--api-key" in warning
    assert exposure_warning("::", None) is not None


@pytest.mark.parametrize("url", [CHAT_URL, COMPLETIONS_URL])
@pytest.mark.parametrize("usage", [False, True])
def test_a_plain_token_chunk_is_the_dumped_chunk(url: str, usage: bool) -> None:
    """Plain token chunks are made from a template per choice: the same bytes as dumping the chunk."""
    from llmsample.batch.responses import dumps
    from llmsample.serve.responses import Answer

    chat = url == CHAT_URL
    body = CHAT if chat else {"prompt": "hi"}
    serve = parse_body({**body, "stream": True, "stream_options": {"include_usage": usage}}, url, PRESETS)
    answer = Answer(serve, 'a "model"\n', "fp_0", chat)
    assert answer.plain
    for index in (0, 3):
        for text in ("", "a", ' "quoted" \\ back\nslash\t', "é漢😀", "\u2028\x00\x1f", "\ud800"):
            choice = {"index": index, **({"delta": {"content": text}} if chat else {"text": text})}
            head = {"id": answer.object_id, "object": "chat.completion.chunk" if chat else "text_completion",
                    "created": answer.created, "model": 'a "model"\n', "system_fingerprint": "fp_0"}  # fmt: skip
            record = {**head, "choices": [{**choice, "logprobs": None, "finish_reason": None}]}
            if usage:
                record["usage"] = None
            assert answer.text_chunk(index, text) == f"data: {dumps(record)}\n\n"
