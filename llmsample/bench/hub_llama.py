"""A small Llama in the hub's format, written by the llama.cpp benchmark: a config, its weights
in safetensors and the default model's tokenizer, as a user's checkpoint folder holds them. Our
loop runs it on llama.cpp through the GGUF ``--backend llama.cpp`` writes from it
(:mod:`llmsample.models.hf_to_gguf`), against transformers' ``generate`` on the folder itself."""

from __future__ import annotations

from pathlib import Path

import torch

SHAPE = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)
"""About 16M parameters, two thirds of them the 49k-token embedding (tied): what a step costs
is then the vocabulary's rows as much as the layers, as in the default model."""


def write_small_llama(folder: Path, seed: int = 0) -> Path:
    """The checkpoint in ``folder`` (bfloat16, random weights of a fixed seed, so its GGUF is
    converted once and found in the model cache afterwards)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from llmsample.models.gguf_to_hf import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    config = LlamaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **SHAPE,  # type: ignore[arg-type]
    )  # fmt: skip
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
