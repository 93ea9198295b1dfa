"""A tiny model whose tokenizer spells any text byte by byte (GPT-2's byte-level alphabet, no
merges): the word-level tiny models cannot write JSON, this one can."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


def make_byte_model(path: Path, seed: int = 0, init: float = 0.5, layers: int = 2, hidden: int = 32) -> Path:
    """A random LlamaForCausalLM over ``<bos>``, ``<eos>``, ``<unk>`` and the 256 bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<bos>": 0, "<eos>": 1, "<unk>": 2}
    for char in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[char] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=0,
        eos_token_id=1,
        initializer_range=init,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = 1
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def byte_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_byte_model(tmp_path_factory.mktemp("bytes"))


@pytest.fixture(scope="session")
def byte_lm(byte_model_dir: Path):
    from llmsample.models.loading import load_model

    return load_model(str(byte_model_dir), "cpu", "float32")
