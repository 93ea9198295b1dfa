"""Input lines to requests: every format, every kind of bad line, and no torch on the way."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmsample.batch.requests import MAX_NESTING, SAMPLING_KEYS, TOO_DEEP, Request, RequestError, read_requests
from llmsample.sampling.config import SamplingConfig

REPO = Path(__file__).resolve().parents[2]


def one(line: str | bytes, **kwargs: object) -> Request | RequestError:
    [item] = list(read_requests([line], **kwargs))
    return item


def error(line: str | bytes) -> RequestError:
    item = one(line)
    assert isinstance(item, RequestError), item
    return item


def openai(body: dict, url: str = "/v1/chat/completions", **top: object) -> str:
    return json.dumps({"custom_id": "r1", "method": "POST", "url": url, "body": body, **top})


CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}]}


def test_plain_lines_skip_blanks_and_keep_physical_line_numbers() -> None:
    items = list(read_requests(["\ufeffFirst prompt\n", "\n", "   \r\n", "  indented stays \r\n", "last"]))
    assert items == [
        Request(line=1, custom_id="line-1", prompt="First prompt"),
        Request(line=4, custom_id="line-4", prompt="  indented stays "),
        Request(line=5, custom_id="line-5", prompt="last"),
    ]
    assert items[0].endpoint == "chat"
    assert items[0].chat_messages() == [{"role": "user", "content": "First prompt"}]


def test_bytes_and_str_lines_read_alike() -> None:
    text = ['{"prompt": "héllo", "seed": 3}\n', "plain\n"]
    assert list(read_requests(line.encode() for line in text)) == list(read_requests(text))


def test_our_json_line_with_every_field() -> None:
    line = json.dumps(
        {
            "custom_id": "q-1",
            "prompt": "Write a haiku",
            "system": "Be brief.",
            "preset": "creative",
            "temperature": 1,
            "top_k": 40,
            "top_p": 0.9,
            "min_p": 0.05,
            "frequency_penalty": 0.2,
            "presence_penalty": -0.3,
            "repetition_penalty": 1.1,
            "max_tokens": 64,
            "stop": "\n\n",
            "seed": 7,
            "typical_p": 0.9,
            "top_n_sigma": 1.5,
            "xtc_threshold": 0.1,
            "xtc_probability": 0.5,
            "dry_multiplier": 0.8,
            "dry_base": 1.75,
            "dry_allowed_length": 2,
            "dry_penalty_last_n": 512,
            "dry_sequence_breakers": ["\n"],
            "logit_bias": {"50256": -100},
            "ban": ["As an AI"],
            "min_tokens": 4,
            "no_repeat_ngram_size": 3,
            "dynatemp_range": 0.5,
            "dynatemp_exponent": 1.5,
            "smoothing_factor": 0.3,
            "smoothing_curve": 2,
            "epsilon_cutoff": 0.0003,
            "eta_cutoff": 0.0003,
            "top_h": 0.4,
            "top_a": 0.1,
            "p_less": True,
            "samplers": "top_k;typ_p;top_p;min_p;epsilon_cutoff;eta;top_h;top_a;p_less;smoothing;temperature;top_n_sigma;xtc",
            "reasoning_budget": 16,
        }
    )
    request = one(line)
    assert isinstance(request, Request)
    assert (request.custom_id, request.line, request.preset, request.system, request.raw) == (
        "q-1",
        1,
        "creative",
        "Be brief.",
        False,
    )
    # Normalised as SamplingConfig stores them: floats, and stop as a tuple.
    assert request.overrides["temperature"] == 1.0 and isinstance(request.overrides["temperature"], float)
    assert request.overrides["stop"] == ("\n\n",)
    assert request.overrides["samplers"][:3] == ("top_k", "typical_p", "top_p")
    carried = {"mirostat", "mirostat_tau", "mirostat_eta", "adaptive_target", "adaptive_decay"}  # exclusive
    assert set(request.overrides) == set(SAMPLING_KEYS) - carried
    mirostat = one(json.dumps({"prompt": "w", "mirostat": 2, "mirostat_tau": 4, "mirostat_eta": 0.2}))
    adaptive = one(json.dumps({"prompt": "w", "adaptive_target": 0.5, "adaptive_decay": 0.8}))
    assert {**mirostat.overrides, **adaptive.overrides} == {"mirostat": 2, "mirostat_tau": 4.0, "mirostat_eta": 0.2,
                                                            "adaptive_target": 0.5, "adaptive_decay": 0.8}  # fmt: skip
    assert request.chat_messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Write a haiku"},
    ]
    assert not request.openai and not request.logprobs


def test_sampling_keys_are_the_configs_without_description() -> None:
    assert set(SAMPLING_KEYS) == set(SamplingConfig.keys()) - {"description"}


def test_raw_prompt_is_a_completion_and_may_be_empty() -> None:
    request = one('{"prompt": "", "raw": true}')
    assert isinstance(request, Request) and request.raw and request.endpoint == "completion"


def test_null_means_not_given() -> None:
    request = one('{"prompt": "x", "temperature": null, "seed": null, "custom_id": null, "preset": null}')
    assert request == Request(line=1, custom_id="line-1", prompt="x")


def test_messages_roles_and_text_parts() -> None:
    line = json.dumps(
        {
            "messages": [
                {"role": "developer", "content": "Rules."},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": ""},
            ]
        }
    )
    request = one(line)
    assert isinstance(request, Request)
    assert request.messages == [
        {"role": "system", "content": "Rules."},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": ""},
    ]
    assert request.chat_messages() is request.messages


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt": "x"', "invalid JSON: Expecting ',' delimiter"),
        ("{not json}", "invalid JSON"),
        ('{"prompt": "x"} {}', "invalid JSON: Extra data"),
        ('{"prompt": "x", "temperature": NaN}', "NaN is not a JSON number"),
        ('{"prompt": "x", "temperature": -Infinity}', "-Infinity is not a JSON number"),
        ('{"prompt": "a", "prompt": "b"}', "the key 'prompt' appears twice"),
        ('{"prompt": "\\ud800 x"}', "lone UTF-16 surrogate (\\ud800)"),
        ('{"temperature": 1}', "give exactly one of prompt"),
        ('{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}', "give exactly one of prompt"),
        ('{"prompt": 5}', "prompt: expected a string, got 5"),
        ('{"prompt": "   "}', "prompt: empty"),
        ('{"prompt": "x", "raw": "yes"}', "raw: expected true or false, got 'yes'"),
        ('{"prompt": "x", "system": 1}', "system: expected a string"),
        ('{"prompt": "x", "raw": true, "system": "s"}', "system: needs the chat template"),
        ('{"prompt": "x", "preset": ""}', "preset: expected a preset name"),
        ('{"prompt": "x", "temperature": -1}', "temperature: must be >= 0"),
        ('{"prompt": "x", "temperature": 1e999}', "temperature: must be finite"),
        ('{"prompt": "x", "temperature": "hot"}', "temperature: expected a number, got 'hot'"),
        ('{"prompt": "x", "top_k": 1.5}', "top_k: expected an integer, got 1.5"),
        ('{"prompt": "x", "top_p": 0}', "top_p: must be in (0, 1]"),
        ('{"prompt": "x", "min_p": 2}', "min_p: must be in [0, 1]"),
        ('{"prompt": "x", "presence_penalty": 3}', "presence_penalty: must be in [-2, 2]"),
        ('{"prompt": "x", "repetition_penalty": 0}', "repetition_penalty: must be > 0"),
        ('{"prompt": "x", "max_tokens": 0}', "max_tokens: must be an integer >= 1"),
        ('{"prompt": "x", "max_tokens": true}', "max_tokens: expected an integer, got True"),
        ('{"prompt": "x", "stop": ""}', "stop: stop strings must not be empty"),
        ('{"prompt": "x", "stop": [1]}', "stop: expected a string or a list of strings"),
        ('{"prompt": "x", "seed": -1}', "seed: must be an integer in [0, 2^63)"),
        ('{"prompt": "x", "temprature": 1}', "temprature: unknown key (did you mean 'temperature'?); allowed keys: "),
        ('{"prompt": "x", "description": "d"}', "description: unknown key"),
        ('{"prompt": "x", "typo": null}', "typo: unknown key"),
        ('{"messages": []}', "messages: expected a non-empty list"),
        ('{"messages": "hi"}', "messages: expected a non-empty list"),
        ('{"messages": ["hi"]}', "messages[0]: expected an object with role and content"),
        ('{"messages": [{"role": "robot", "content": "x"}]}', "messages[0].role: expected one of system, developer"),
        ('{"messages": [{"role": "user", "content": "x", "name": "n"}]}', "messages[0].name: unknown key"),
        ('{"messages": [{"role": "user"}]}', "messages[0].content: expected a string or a list of text parts"),
        (
            '{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}',
            "messages[0].content[0]: only",
        ),
        ('{"messages": [{"role": "user", "content": "x"}], "system": "s"}', "system: only goes with prompt"),
        ('{"messages": [{"role": "user", "content": "x"}], "raw": true}', "raw: only goes with prompt"),
    ],
)
def test_bad_our_lines(line: str, message: str) -> None:
    assert message in error(line).message


def test_error_carries_the_custom_id_once_it_is_read() -> None:
    assert error('{"custom_id": "a", "prompt": "x", "top_k": -1}').custom_id == "a"
    assert error('{"prompt": "x", "top_k": -1}').custom_id == "line-1"
    assert error('{"custom_id": "a", "prompt": "\\udfff"}').custom_id == "a"
    bad_id = error('{"custom_id": 7, "prompt": "x"}')
    assert (bad_id.custom_id, bad_id.message) == (None, "custom_id: expected a non-empty string, got 7")
    assert error('{"custom_id": "\\ud800", "prompt": "x"}').custom_id is None
    assert error("{oops").custom_id is None


def test_openai_chat_line() -> None:
    body = {
        **CHAT,
        "temperature": 0.2,
        "top_p": 0.5,
        "max_completion_tokens": 32,
        "stop": ["END", "###"],
        "seed": 11,
        "frequency_penalty": 0.1,
        "presence_penalty": 0.4,
        "logprobs": True,
        "top_logprobs": 3,
        "n": 1,
    }
    request = one(openai(body))
    assert request == Request(
        line=1,
        custom_id="r1",
        messages=[{"role": "user", "content": "Hi"}],
        overrides={
            "temperature": 0.2,
            "top_p": 0.5,
            "max_tokens": 32,
            "stop": ("END", "###"),
            "seed": 11,
            "frequency_penalty": 0.1,
            "presence_penalty": 0.4,
        },
        openai=True,
        logprobs=True,
        top_logprobs=3,
    )
    assert request.endpoint == "chat"


def test_openai_chat_logprobs_without_top_and_nulls() -> None:
    request = one(openai({**CHAT, "logprobs": True, "temperature": None, "top_logprobs": None}))
    assert isinstance(request, Request)
    assert (request.logprobs, request.top_logprobs, request.overrides) == (True, 0, {})
    plain = one(openai(dict(CHAT)))
    assert isinstance(plain, Request) and not plain.logprobs


def test_openai_completion_line_is_raw_with_legacy_logprobs() -> None:
    body = {"model": "m", "prompt": "Once upon", "max_tokens": 5, "stop": "\n", "logprobs": 3}
    request = one(openai(body, url="/v1/completions"))
    assert request == Request(
        line=1,
        custom_id="r1",
        prompt="Once upon",
        raw=True,
        overrides={"max_tokens": 5, "stop": ("\n",)},
        openai=True,
        logprobs=True,
        top_logprobs=3,
    )
    assert request.endpoint == "completion"
    zero = one(openai({"prompt": "x", "logprobs": 0}, url="/v1/completions"))
    assert isinstance(zero, Request) and (zero.logprobs, zero.top_logprobs) == (True, 0)


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (openai({**CHAT, "user": "u"}), "body.user: unknown key; allowed keys: messages, model"),
        (openai({**CHAT, "tools": "f"}), "body.tools: expected a non-empty list"),
        (openai({**CHAT, "tool_choice": "required"}), "body.tool_choice: needs body.tools"),
        (openai({**CHAT, "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}}),
         "body.tool_choice: 'g' is not one of the tools offered (f)"),
        (openai({"messages": [{"role": "tool", "content": "x", "name": "f"}]}),
         "body.messages[0].name: unknown key; allowed keys: role, content, tool_call_id"),
        (openai({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}]}),
         "body.messages[0].tool_calls[0].function.arguments: not JSON text"),
        (openai({**CHAT, "temprature": 1}), "(did you mean 'temperature'?)"),
        (
            openai({**CHAT, "prompt": "x"}),
            "body.prompt: not a key of /v1/chat/completions (it belongs to /v1/completions)",
        ),
        (openai({"prompt": "x", "top_logprobs": 2}, url="/v1/completions"), "body.top_logprobs: not a key of"),
        (openai(CHAT, extra=1), "extra: unknown key; allowed keys: custom_id, method, url, body"),
        (openai(CHAT, method="GET"), "method: expected \"POST\", got 'GET'"),
        (openai(CHAT, url="/v1/embeddings"), "url: expected '/v1/chat/completions' or '/v1/completions'"),
        (
            json.dumps({"custom_id": "r1", "method": "POST", "url": "/v1/completions", "body": []}),
            "body: expected an object",
        ),
        (openai({**CHAT, "n": 2}), "body.n: only one choice per request is supported (n = 1), got 2"),
        (openai({**CHAT, "n": True}), "body.n: only one choice"),
        (openai({**CHAT, "max_tokens": 5, "max_completion_tokens": 5}), "give max_tokens or max_completion_tokens"),
        (openai({**CHAT, "max_completion_tokens": 0}), "body.max_completion_tokens: must be an integer >= 1"),
        (openai({**CHAT, "max_tokens": 0}), "body.max_tokens: must be an integer >= 1"),
        (openai({**CHAT, "top_p": 0}), "body.top_p: must be in (0, 1]"),
        (openai({**CHAT, "stop": 3}), "body.stop: expected a string or a list of strings"),
        (openai({**CHAT, "logprobs": 1}), "body.logprobs: expected true or false, got 1"),
        (openai({**CHAT, "logprobs": True, "top_logprobs": 21}), "body.top_logprobs: expected an integer in 0..20"),
        (openai({**CHAT, "top_logprobs": 2}), 'body.top_logprobs: needs "logprobs": true'),
        (openai({**CHAT, "logprobs": False, "top_logprobs": 2}), "needs"),
        (
            openai({"prompt": "x", "logprobs": True}, url="/v1/completions"),
            "body.logprobs: expected an integer in 0..5",
        ),
        (openai({"prompt": "x", "logprobs": 6}, url="/v1/completions"), "body.logprobs: expected an integer in 0..5"),
        (openai({"prompt": ["a", "b"]}, url="/v1/completions"), "body.prompt: expected one string (got ['a', 'b'])"),
        (openai({"model": "m"}, url="/v1/completions"), "body.prompt: expected one string (missing)"),
        (openai({"model": "m"}), "body.messages: missing"),
        (openai({"messages": [{"role": "robot", "content": "x"}]}), "body.messages[0].role: expected one of"),
    ],
)
def test_bad_openai_lines(line: str, message: str) -> None:
    bad = error(line)
    assert message in bad.message
    assert bad.custom_id == "r1"


def test_openai_line_needs_a_custom_id() -> None:
    line = json.dumps({"method": "POST", "url": "/v1/chat/completions", "body": CHAT})
    bad = error(line)
    assert (bad.custom_id, bad.message) == (
        None,
        "custom_id: missing; every OpenAI Batch line needs a unique string custom_id",
    )


def test_invalid_utf8_is_one_error_and_reading_goes_on() -> None:
    items = list(read_requests([b"ok\n", b"caf\xe9\n", b'{"prompt": "\xff"}\n', b"after\n"]))
    assert [type(item).__name__ for item in items] == ["Request", "RequestError", "RequestError", "Request"]
    assert items[1] == RequestError(2, None, "not valid UTF-8 (invalid continuation byte at byte 3 of the line)")
    assert items[3].line == 4


@pytest.mark.parametrize("depth", [3000, 990, MAX_NESTING])
def test_a_line_nested_too_deeply_is_its_error_and_reading_goes_on(depth: int) -> None:
    """3000 levels stop Python's JSON reader, 990 and MAX_NESTING (with the object around them)
    the check that counts the levels: the line's error, whatever the stack beneath the reader."""
    deep = json.dumps({"custom_id": "d", "prompt": "hi", "stop": "X"}).replace('"X"', "[" * depth + "]" * depth)
    items = list(read_requests(["before", deep, "after"]))
    assert items[1] == RequestError(2, None, TOO_DEEP)
    shallow = json.dumps({"custom_id": "s", "prompt": "hi", "stop": "X"}).replace('"X"', "[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1))
    assert next(iter(read_requests([shallow]))).message.startswith("stop: expected")  # read, then refused for itself
    assert [item.prompt for item in (items[0], items[2])] == ["before", "after"]


def test_duplicate_custom_ids() -> None:
    lines = [
        '{"custom_id": "a", "prompt": "x"}',
        '{"custom_id": "a", "prompt": "y"}',
        '{"custom_id": "line-4", "prompt": "z"}',
        "plain text whose automatic id is taken",
        '{"custom_id": "b", "prompt": "x", "top_k": -1}',
        '{"custom_id": "b", "prompt": "fine"}',
        '{"custom_id": "a", "prompt": "third"}',
    ]
    items = list(read_requests(lines))
    assert [(item.line, item.custom_id, type(item).__name__) for item in items] == [
        (1, "a", "Request"),
        (2, "a", "RequestError"),
        (3, "line-4", "Request"),
        (4, "line-4", "RequestError"),
        (5, "b", "RequestError"),
        (6, "b", "RequestError"),
        (7, "a", "RequestError"),
    ]
    assert items[1].message == "custom_id 'a' is already used on line 1"
    assert items[3].message == "custom_id 'line-4' is already used on line 3"
    assert items[5].message == "custom_id 'b' is already used on line 5"
    assert items[6].message == "custom_id 'a' is already used on line 1"


def test_known_presets() -> None:
    line = '{"prompt": "x", "preset": "creativ"}'
    assert isinstance(one(line), Request)  # unchecked without the names
    bad = one(line, known_presets={"creative", "balanced"})
    assert isinstance(bad, RequestError)
    assert bad.message == "preset: unknown preset 'creativ'; choose one of: balanced, creative"
    assert isinstance(one('{"prompt": "x", "preset": "creative"}', known_presets={"creative"}), Request)


def test_a_plain_line_starting_with_a_brace_is_json() -> None:
    assert error("  {like this").message.startswith("invalid JSON")
    assert isinstance(one("[not an object] is plain text"), Request)


def test_the_batch_package_imports_without_torch() -> None:
    """Every module of the package but ``run`` (which drives the engine), imported where
    ``import torch`` fails."""
    code = """
import importlib, json, pkgutil, sys
sys.modules["torch"] = None  # any `import torch` now raises ImportError
import llmsample.batch
names = sorted(module.name for module in pkgutil.iter_modules(llmsample.batch.__path__) if module.name != "run")
for name in names:
    importlib.import_module("llmsample.batch." + name)
from llmsample.batch.requests import read_requests
[request] = read_requests(['{"prompt": "x", "temperature": 0.5}'])
heavy = sorted(name for name in ("transformers", "numpy") if name in sys.modules)
print(json.dumps({"modules": names, "custom_id": request.custom_id, "heavy": heavy}))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert "requests" in result["modules"]
    assert (result["custom_id"], result["heavy"]) == ("line-1", [])
