"""Other clients' keys through the real ``openai`` client's ``extra_body``, key by key as the
table of docs/serve-api.md has them, on a tiny byte-level model (it can spell any text, so a
constraint has something to constrain and a character can be split across tokens)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.constraints.conftest import make_byte_model
from tests.serve.conftest import TEMPLATE, Server, start_server

DOCS = Path(__file__).resolve().parents[2] / "docs" / "serve-api.md"
EOS_FIRST = {"1": 100}  # logit_bias: <eos> (id 1) is drawn at once unless something masks it
NO_EOS = {"1": -100}
CHAT, COMPLETION = "chat", "completion"
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def byte_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from transformers import AutoTokenizer

    path = make_byte_model(tmp_path_factory.mktemp("byte-chat"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(path)
    running = start_server(path, tmp_path_factory.mktemp("compat") / "stderr", "--batch-size", "4")
    yield running
    running.stop()


def create(server: Server, endpoint: str = CHAT, **kwargs: Any) -> Any:
    """A request as the client sends it: the model's id, a prompt, then ``kwargs``."""
    client = server.client()
    model = client.models.list().data[0].id
    if endpoint == CHAT:
        kwargs.setdefault("messages", [{"role": "user", "content": "hi"}])
        return client.chat.completions.create(model=model, **kwargs)
    kwargs.setdefault("prompt", "ab")
    return client.completions.create(model=model, **kwargs)


def text(answer: Any, index: int = 0) -> str:
    choice = answer.choices[index]
    return choice.message.content if answer.object == "chat.completion" else choice.text


# (the label its row of the docs' table starts with, the outcome, the endpoint, the request,
# the warning's or the error's parameter)
KEYS: list[tuple[str, str, str, dict[str, Any], str | None]] = [
    ("`regex`", "implemented", CHAT, {"extra_body": {"regex": "[a-c]{3}"}}, None),
    ("`choice`", "implemented", CHAT, {"extra_body": {"choice": ["yes", "no"]}}, None),
    ("`json_schema`", "implemented", CHAT, {"extra_body": {"json_schema": {"type": "boolean"}}}, None),
    ("`grammar`", "implemented", CHAT, {"extra_body": {"grammar": 'start: "a" "b"+'}}, None),
    ("`json`", "implemented", COMPLETION, {"extra_body": {"json": True}}, None),
    ("`guided_regex`", "implemented", CHAT, {"extra_body": {"guided_regex": "[a-c]{3}"}}, None),
    ("`guided_choice`", "implemented", CHAT, {"extra_body": {"guided_choice": ["yes", "no"]}}, None),
    ("`guided_json`", "implemented", CHAT, {"extra_body": {"guided_json": {"type": "boolean"}}}, None),
    ("`guided_grammar`", "implemented", CHAT, {"extra_body": {"guided_grammar": 'start: "a" "b"+'}}, None),
    ("`n_predict`", "implemented", COMPLETION, {"extra_body": {"n_predict": 3}}, None),
    ("`repeat_penalty`", "implemented", CHAT, {"extra_body": {"repeat_penalty": 1.2}}, None),
    ("`seed: -1`", "implemented", CHAT, {"extra_body": {"seed": -1}}, None),
    ("`max_tokens: -1`", "implemented", CHAT, {"extra_body": {"max_tokens": -1, "regex": "[a-c]{3}"}}, None),
    ("`ignore_eos`", "implemented", CHAT, {"extra_body": {"ignore_eos": True}}, None),
    ("`stop_token_ids`", "implemented", CHAT, {"extra_body": {"stop_token_ids": [1]}}, None),
    ("`include_stop_str_in_output`", "implemented", CHAT, {"extra_body": {"include_stop_str_in_output": True}}, None),
    ("`echo`", "implemented", COMPLETION, {"extra_body": {"echo": True}}, None),
    ("`max_tokens: 0`", "implemented", COMPLETION, {"extra_body": {"max_tokens": 0, "echo": True}}, None),
    ("`best_of` (equal to `n`)", "implemented", COMPLETION, {"extra_body": {"best_of": 1}}, None),
    ('`prompt: ["...", "..."]`', "implemented", COMPLETION, {"prompt": ["ab", "cd"]}, None),
    ("`prompt: [[ids]]`", "implemented", COMPLETION, {"prompt": [[70, 71], [72]]}, None),
    (
        "`messages[].name`",
        "ignored",
        CHAT,
        {"messages": [{"role": "user", "content": "hi", "name": "al"}]},
        "messages[0].name",
    ),
    (
        "`stream_options.continuous_usage_stats`",
        "ignored",
        CHAT,
        {"stream": True, "extra_body": {"stream_options": {"continuous_usage_stats": True}}},
        "stream_options.continuous_usage_stats",
    ),
    ("`metadata`", "ignored", CHAT, {"extra_body": {"metadata": {"run": "1"}}}, "metadata"),
    ("`store`", "ignored", CHAT, {"extra_body": {"store": False}}, "store"),
    ("`service_tier`", "ignored", CHAT, {"extra_body": {"service_tier": "auto"}}, "service_tier"),
    ("`prompt_cache_key`", "ignored", CHAT, {"extra_body": {"prompt_cache_key": "k"}}, "prompt_cache_key"),
    ("`reasoning_effort`", "ignored", CHAT, {"extra_body": {"reasoning_effort": "low"}}, "reasoning_effort"),
    ("`cache_prompt`", "ignored", COMPLETION, {"extra_body": {"cache_prompt": True}}, "cache_prompt"),
    ("`skip_special_tokens`", "ignored", CHAT, {"extra_body": {"skip_special_tokens": True}}, "skip_special_tokens"),
    (
        "`guided_decoding_backend`",
        "ignored",
        CHAT,
        {"extra_body": {"guided_decoding_backend": "xgrammar"}},
        "guided_decoding_backend",
    ),
    ("any other unknown key", "ignored", CHAT, {"extra_body": {"frobnicate": 1}}, "frobnicate"),
    ("`tools`", "implemented", CHAT, {"tools": [TOOL]}, None),
    ("`tool_choice`", "implemented", CHAT, {"tools": [TOOL], "tool_choice": "none"}, None),
    ("`parallel_tool_calls`", "implemented", CHAT, {"tools": [TOOL], "parallel_tool_calls": False}, None),
    ("`functions`", "refused", CHAT, {"extra_body": {"functions": [TOOL["function"]]}}, "functions"),
    ("`function_call`", "refused", CHAT, {"extra_body": {"function_call": "auto"}}, "function_call"),
    ("`suffix`", "refused", COMPLETION, {"extra_body": {"suffix": "z"}}, "suffix"),
    ("`best_of` (more than `n`)", "refused", COMPLETION, {"extra_body": {"best_of": 3}}, "best_of"),
    (
        "`chat_template_kwargs`",
        "refused",
        CHAT,
        {"extra_body": {"chat_template_kwargs": {"x": 1}}},
        "chat_template_kwargs",
    ),
    ("`use_beam_search`", "refused", CHAT, {"extra_body": {"use_beam_search": True}}, "use_beam_search"),
    ("`length_penalty`", "refused", CHAT, {"extra_body": {"length_penalty": 1.0}}, "length_penalty"),
]


def table_rows() -> list[tuple[str, str]]:
    """The docs' table: (the key cell, the outcome) of every row."""
    section = DOCS.read_text().split("## Other clients' keys", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    return [(cells[0].removeprefix("| "), cells[2]) for cells in rows[1:]]


def test_the_docs_table_is_the_tested_one() -> None:
    rows = table_rows()
    for label, outcome, *_ in KEYS:
        matching = [row_outcome for cell, row_outcome in rows if cell == label or f"{label}," in f"{cell},"]
        assert matching == [outcome], label
    covered = {cell for cell, _ in rows for label, *_ in KEYS if cell == label or f"{label}," in f"{cell},"}
    assert covered == {cell for cell, _ in rows}


@pytest.mark.parametrize(("label", "outcome", "endpoint", "kwargs", "param"), KEYS, ids=[k[0] for k in KEYS])
def test_each_key_as_the_table_says(
    byte_server: Server, label: str, outcome: str, endpoint: str, kwargs: dict, param: str | None
) -> None:
    import openai

    kwargs = {"max_tokens": 4, "seed": 1, **kwargs}
    if "max_tokens" in kwargs.get("extra_body", {}) or "n_predict" in kwargs.get("extra_body", {}):
        del kwargs["max_tokens"]
    if outcome == "refused":
        with pytest.raises(openai.BadRequestError) as caught:
            create(byte_server, endpoint, **kwargs)
        assert caught.value.body["param"] == param and param in caught.value.body["message"]
        return
    answer = create(byte_server, endpoint, **kwargs)
    first = next(iter(answer)) if kwargs.get("stream") else answer
    warnings = (first.model_extra or {}).get("warnings", [])
    if outcome == "implemented":
        assert warnings == []
    else:
        assert [w.split(":")[0] for w in warnings] == [param]


def test_ignored_keys_are_logged_and_strict_api_refuses_them(byte_server: Server, tmp_path: Path) -> None:
    import openai

    create(byte_server, max_tokens=2, extra_body={"metadata": {"run": "7"}, "store": True})
    deadline = time.monotonic() + 30  # the request's line is written once its answer has gone out
    noted = r"POST /v1/chat/completions 200 .* s warnings: metadata, store$"
    while not re.search(noted, byte_server.log.read_text(), re.MULTILINE):
        assert time.monotonic() < deadline, byte_server.log.read_text()
        time.sleep(0.05)
    strict = start_server(make_byte_model(tmp_path / "model"), tmp_path / "stderr", "--strict-api")
    try:
        with pytest.raises(openai.BadRequestError) as caught:
            create(strict, COMPLETION, max_tokens=2, extra_body={"temprature": 0.5})
        assert caught.value.body["code"] == "unknown_parameter"
        assert caught.value.body["message"] == "temprature: unknown parameter; did you mean 'temperature'?"
        answer = create(strict, COMPLETION, extra_body={"n_predict": 2, "guided_regex": "[ab]+"})
        assert re.fullmatch("[ab]+", answer.choices[0].text)
    finally:
        strict.stop()


def test_constraint_keys_constrain(byte_server: Server) -> None:
    for extra in ({"regex": "[a-c]{3}-[0-9]{2}"}, {"guided_regex": "[a-c]{3}-[0-9]{2}"}):
        answer = create(byte_server, max_tokens=10, seed=3, extra_body=extra)
        assert re.fullmatch("[a-c]{3}-[0-9]{2}", text(answer)) and answer.choices[0].finish_reason == "stop"
    for key in ("choice", "guided_choice"):
        answer = create(byte_server, max_tokens=10, seed=4, n=3, extra_body={key: ["yes", "no"]})
        assert {text(answer, i) for i in range(3)} <= {"yes", "no"}
    grammar = create(byte_server, COMPLETION, max_tokens=10, extra_body={"grammar": 'start: "a" "b"+'})
    assert re.fullmatch("ab+", text(grammar))
    schema = create(byte_server, max_tokens=10, extra_body={"guided_json": {"type": "boolean"}})
    assert text(schema) in ("true", "false")


def test_llama_server_names_and_values(byte_server: Server) -> None:
    assert (
        create(byte_server, COMPLETION, extra_body={"n_predict": 3, "logit_bias": NO_EOS}).usage.completion_tokens == 3
    )
    random = create(byte_server, max_tokens=2, extra_body={"seed": -1, "llmsample": {"tokens": "ids"}})
    assert random.choices[0].model_extra["llmsample"]["seed"] >= 0
    # the default max_tokens (256) would cut 300 letters short; -1 lets the regex end them
    unlimited = create(byte_server, COMPLETION, extra_body={"max_tokens": -1, "regex": "[a-c]{300}"})
    assert len(unlimited.choices[0].text) == 300 and unlimited.choices[0].finish_reason == "stop"


def test_vllm_ends(byte_server: Server) -> None:
    body = {"max_tokens": 5, "extra_body": {"logit_bias": EOS_FIRST}}
    assert create(byte_server, **body).usage.completion_tokens == 1
    ignoring = create(byte_server, max_tokens=5, extra_body={"logit_bias": EOS_FIRST, "ignore_eos": True})
    assert ignoring.usage.completion_tokens == 5 and ignoring.choices[0].finish_reason == "length"
    [b_id] = httpx.post(byte_server.url + "/tokenize", json={"prompt": "b", "add_special_tokens": False}).json()[
        "tokens"
    ]
    cut = create(byte_server, max_tokens=8, extra_body={"choice": ["abcd"], "stop_token_ids": [b_id]})
    assert text(cut) == "a" and cut.choices[0].finish_reason == "stop"
    kept = create(
        byte_server, max_tokens=8, stop=["c"], extra_body={"choice": ["abcd"], "include_stop_str_in_output": True}
    )
    assert text(kept) == "abc" and kept.choices[0].finish_reason == "stop"
    assert text(create(byte_server, max_tokens=8, stop=["c"], extra_body={"choice": ["abcd"]})) == "ab"


def test_echo_and_a_list_of_prompts(byte_server: Server) -> None:
    echoed = create(byte_server, COMPLETION, prompt="xy", max_tokens=3, seed=2, echo=True)
    plain = create(byte_server, COMPLETION, prompt="xy", max_tokens=3, seed=2)
    assert text(echoed) == "xy" + text(plain)
    streamed = create(byte_server, COMPLETION, prompt="xy", max_tokens=3, seed=2, echo=True, stream=True)
    assert "".join(chunk.choices[0].text for chunk in streamed) == text(echoed)
    several = create(byte_server, COMPLETION, prompt=["ab", "cde"], n=2, max_tokens=3, seed=5, best_of=2)
    assert [choice.index for choice in several.choices] == [0, 1, 2, 3]
    second = create(byte_server, COMPLETION, prompt="cde", n=2, max_tokens=3, seed=5)
    assert [text(several, 2), text(several, 3)] == [text(second, 0), text(second, 1)]
    assert text(several, 0) == text(create(byte_server, COMPLETION, prompt="ab", max_tokens=3, seed=5))
    assert several.usage.prompt_tokens == 2 + 3 and several.usage.completion_tokens == 12


def test_token_id_prompts(byte_server: Server) -> None:
    import openai

    ids = httpx.post(byte_server.url + "/tokenize", json={"prompt": "ab"}).json()["tokens"]
    by_text = create(byte_server, COMPLETION, prompt="ab", max_tokens=4, seed=6)
    by_ids = create(byte_server, COMPLETION, prompt=ids, max_tokens=4, seed=6, echo=True)
    assert text(by_ids) == "ab" + text(by_text) and by_ids.usage.prompt_tokens == by_text.usage.prompt_tokens
    both = create(byte_server, COMPLETION, prompt=[ids, "ab"], max_tokens=4, seed=6)
    assert text(both, 0) == text(both, 1) == text(by_text)
    with pytest.raises(openai.BadRequestError) as caught:
        create(byte_server, COMPLETION, prompt=[10**6], max_tokens=4)
    assert caught.value.body["param"] == "prompt" and "past the vocabulary" in caught.value.body["message"]


def test_warnings_come_once_at_the_start_of_a_stream(byte_server: Server) -> None:
    chunks = list(create(byte_server, COMPLETION, max_tokens=4, stream=True, extra_body={"store": True}))
    warned = [chunk.model_extra.get("warnings") for chunk in chunks]
    assert warned[0] == ["store: ignored (this server stores no requests)"] and not any(warned[1:])


def test_logprobs_bytes_are_each_tokens_own(byte_server: Server) -> None:
    """Byte-level tokens one byte each: "é" and "漢" are split across tokens, and each entry's
    bytes are its one byte (today's were the released text's: ``[]`` then the whole character)."""
    answer = create(byte_server, max_tokens=8, logprobs=True, top_logprobs=3, extra_body={"choice": ["é漢"]})
    content = answer.choices[0].logprobs.content
    assert text(answer) == "é漢" and "".join(entry.token for entry in content) == "é漢"
    assert [entry.token for entry in content] == ["", "é", "", "", "漢", ""]
    assert [entry.bytes for entry in content] == [[0xC3], [0xA9], [0xE6], [0xBC], [0xA2], []]  # the last: <eos>
    assert bytes(b for entry in content for b in entry.bytes) == "é漢".encode()
    for entry in content[:-1]:
        for alternative in entry.top_logprobs:  # every alternative a byte of its own, or a special token
            assert len(alternative.bytes) == 1 or alternative.token in ("<bos>", "<eos>", "<unk>")
            if len(alternative.bytes) == 1 and alternative.bytes[0] >= 0x80:
                assert alternative.token == "\ufffd"
