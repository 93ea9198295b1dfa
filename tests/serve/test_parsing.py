"""Request bodies to engine requests, without a server."""

from __future__ import annotations

import pytest

from llmsample.batch.requests import CHAT_URL, COMPLETIONS_URL
from llmsample.serve.api_errors import ApiError
from llmsample.serve.parsing import load_json, parse_body
from llmsample.serve.server import exposure_warning

PRESETS = frozenset({"balanced", "code"})
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def refused(body: object, url: str = CHAT_URL, strict: bool = False) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_body(body, url, PRESETS, strict)
    assert caught.value.status == 400
    return caught.value


def test_openai_keys_and_ours_together() -> None:
    body = {**CHAT, "temperature": 0.5, "top_k": 7, "dry_multiplier": 0.8, "preset": "code", "max_completion_tokens": 9}
    serve = parse_body({**body, "n": 2, "stream": True, "stream_options": {"include_usage": True}}, CHAT_URL, PRESETS)
    request = serve.request
    assert request.overrides == {"temperature": 0.5, "top_k": 7, "dry_multiplier": 0.8, "max_tokens": 9}
    assert request.preset == "code" and serve.n == 2 and serve.stream and serve.include_usage
    assert serve.max_tokens_key == "max_completion_tokens"


def test_the_newer_samplers_and_their_order_in_a_body() -> None:
    """llama-server's and text-generation-webui's names: the same keys, and ``samplers`` a list."""
    body = {**CHAT, "dynatemp_range": 0.5, "dynatemp_exponent": 2, "smoothing_factor": 0.3, "top_a": 0.1,
            "no_repeat_ngram_size": 2,
            "samplers": ["penalties", "dry", "top_k", "typ_p", "min_p", "top_a", "quadratic_sampling", "temperature"]}  # fmt: skip
    request = parse_body(body, CHAT_URL, PRESETS).request
    assert request.overrides["samplers"] == ("top_k", "typical_p", "min_p", "top_a", "smoothing", "temperature")
    assert request.overrides["dynatemp_exponent"] == 2.0 and request.overrides["no_repeat_ngram_size"] == 2
    error = refused({**CHAT, "samplers": ["top_k", "xtc", "temperature"]})
    assert "xtc samples a mixture" in str(error)
    error = refused({**body, "samplers": ["top_k", "temperature"]})  # smoothing and top-a would be dropped
    assert "samplers: smoothing is set but not listed" in str(error)


def test_null_means_not_given() -> None:
    serve = parse_body({**CHAT, "temperature": None, "n": None, "stream": None, "top_k": None}, CHAT_URL, PRESETS)
    assert serve.request.overrides == {} and serve.n == 1 and not serve.stream


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**CHAT, "tools": [{"type": "function"}]}, "tools[0]"),
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
    from llmsample.batch.result_lines import dumps
    from llmsample.serve.completion_bodies import Answer

    chat = url == CHAT_URL
    body = CHAT if chat else {"prompt": "hi"}
    serve = parse_body({**body, "stream": True, "stream_options": {"include_usage": usage}}, url, PRESETS)
    answer = Answer(serve, 'a "model"\n', "fp_0", chat, lambda token: b"")
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


def test_constraint_keys_are_read_as_a_batch_line_reads_them() -> None:
    for key, value in [("regex", "[ab]+"), ("choice", ["w3", "w4"]), ("json_schema", {"type": "object"}),
                       ("grammar", 'start: "w3"'), ("json", True)]:  # fmt: skip
        serve = parse_body({**CHAT, key: value}, CHAT_URL, PRESETS)
        assert serve.request.overrides["constraint"] is not None, key
        assert serve.warnings == ()
    assert refused({**CHAT, "regex": "a", "choice": ["b"]}).message.startswith("regex and choice")
    assert refused({**CHAT, "regex": "(", "max_tokens": 2}).param == "regex"
    both = {**CHAT, "regex": "a", "response_format": {"type": "json_object"}}
    assert refused(both).param == "regex"


def test_unknown_keys_are_ignored_with_a_warning_unless_strict() -> None:
    serve = parse_body({**CHAT, "top_kk": 3, "metadata": {"a": "b"}}, CHAT_URL, PRESETS)
    assert serve.warnings == (
        "top_kk: ignored (unknown parameter; did you mean 'top_k'?)",
        "metadata: ignored (this server stores no requests)",
    )
    assert serve.request.overrides == {}
    error = refused({**CHAT, "top_kk": 3}, strict=True)
    assert error.param == "top_kk" and error.code == "unknown_parameter" and "did you mean 'top_k'" in error.message
    assert refused({**CHAT, "store": True}, strict=True).param == "store"


def test_other_servers_names_and_values() -> None:
    body = {**CHAT, "n_predict": 7, "repeat_penalty": 1.1, "seed": -1, "guided_regex": "w3+"}
    serve = parse_body(body, CHAT_URL, PRESETS, strict=True)
    assert serve.request.overrides["max_tokens"] == 7 and serve.request.overrides["repetition_penalty"] == 1.1
    assert "seed" not in serve.request.overrides and "constraint" in serve.request.overrides
    assert serve.max_tokens_key == "max_tokens" and not serve.unlimited
    unlimited = parse_body({**CHAT, "max_tokens": -1}, CHAT_URL, PRESETS)
    assert unlimited.unlimited and unlimited.max_tokens_key is None and "max_tokens" not in unlimited.request.overrides
    assert refused({**CHAT, "n_predict": 3, "max_tokens": 3}).param == "n_predict"


def test_a_message_name_is_dropped_with_a_warning() -> None:
    body = {"messages": [{"role": "user", "content": "hi", "name": "alice"}]}
    serve = parse_body(body, CHAT_URL, PRESETS)
    assert serve.request.messages == [{"role": "user", "content": "hi"}]
    assert serve.warnings == ("messages[0].name: ignored (the chat template gets each message's role and content)",)
    assert refused(body, strict=True).param == "messages[0].name"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**CHAT, "tools": []}, "tools"),
        ({**CHAT, "chat_template_kwargs": {"enable_thinking": False}}, "chat_template_kwargs"),
        ({"prompt": "w3", "suffix": "w4"}, "suffix"),
        ({"prompt": "w3", "best_of": 2}, "best_of"),
        ({"prompt": [1, "w3"]}, "prompt"),
        ({"prompt": 3}, "prompt"),
        ({"prompt": [[1], []]}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": ["w3"] * 5, "n": 4}, "prompt"),
        ({**CHAT, "stop_token_ids": [-1]}, "stop_token_ids"),
        ({**CHAT, "ignore_eos": 1}, "ignore_eos"),
    ],
)
def test_what_would_change_the_answer_is_refused(body: dict, param: str) -> None:
    url = COMPLETIONS_URL if "prompt" in body else CHAT_URL
    assert refused(body, url).param == param


def test_completion_prompts_and_vllm_keys() -> None:
    body = {"prompt": ["w3", "w4 w5"], "n": 2, "best_of": 2, "echo": True, "ignore_eos": True,
            "stop_token_ids": [5], "include_stop_str_in_output": True}  # fmt: skip
    serve = parse_body(body, COMPLETIONS_URL, PRESETS)
    assert [request.prompt for request in serve.requests] == ["w3", "w4 w5"] and serve.n == 2
    assert serve.token_prompts == (None, None)
    ids = parse_body({"prompt": [3, 4]}, COMPLETIONS_URL, PRESETS)
    assert ids.token_prompts == ((3, 4),) and ids.request.prompt == ""
    several = parse_body({"prompt": [[3], "w4", [5, 6]]}, COMPLETIONS_URL, PRESETS)
    assert several.token_prompts == ((3,), None, (5, 6))
    assert serve.echo and serve.ignore_eos and serve.stop_ids == (5,) and serve.keep_stop and serve.warnings == ()
    streamed = parse_body({"prompt": "w3", "stream": True, "stream_options": {"continuous_usage_stats": True}},
                          COMPLETIONS_URL, PRESETS)  # fmt: skip
    assert streamed.warnings == ("stream_options.continuous_usage_stats: ignored (usage comes in the last chunk only)",)
    strict = {"prompt": "w3", "stream": True, "stream_options": {"continuous_usage_stats": True}}
    assert refused(strict, COMPLETIONS_URL, strict=True).param == "stream_options"
