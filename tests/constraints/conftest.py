"""A tiny model whose tokenizer spells any text byte by byte (GPT-2's byte-level alphabet, no
merges): the word-level tiny models cannot write JSON, this one can."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import save_tiny_llama


def make_byte_model(path: Path, seed: int = 0, init: float = 0.5, layers: int = 2, hidden: int = 32) -> Path:
    """A random LlamaForCausalLM over ``<bos>``, ``<eos>``, ``<unk>`` and the 256 bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<bos>": 0, "<eos>": 1, "<unk>": 2}
    for char in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[char] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )
    return save_tiny_llama(path, tokenizer, len(vocab), seed, init, layers, hidden, positions=2048)


@pytest.fixture(scope="session")
def byte_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_byte_model(tmp_path_factory.mktemp("bytes"))


@pytest.fixture(scope="session")
def byte_lm(byte_model_dir: Path):
    from llmsample.models.loading import load_model

    return load_model(str(byte_model_dir), "cpu", "float32")
