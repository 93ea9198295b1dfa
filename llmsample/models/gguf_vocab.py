"""A Hugging Face tokenizer written into a GGUF as llama.cpp reads it, and proven equal: the
pre-tokenizer name llama.cpp needs (``tokenizer.ggml.pre``) is not in the checkpoint, so each name
llama.cpp knows for byte-level BPE is tried on a metadata-only file until llama.cpp's ids equal
transformers' on a probe of awkward texts; none equal is a tokenizer we do not convert."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any

PRE_NAMES = ("smollm", "llama-bpe", "qwen2", "gpt-2", "default", "starcoder", "deepseek-llm", "olmo", "tekken")
"""llama.cpp's byte-level BPE pre-tokenizers, most common in small chat models first."""

PROBE = (
    "The capital of France is Paris.",
    "  leading spaces, tabs\tand\nnew lines\n\n   \n",
    "def mean(values):\n    return sum(values) / len(values)\n",
    "Ünïcödé: naïve café, 東京, emoji 🙂🦙 and numbers 1234567.89, 3..3 3...3 33333333",
    "I've been 'told he's there, 'RE you sure? We'Ve a'lL ------======= нещо на Български",
)


def tokenizer_kind(folder: Path) -> str | None:
    """``gpt2`` (byte-level BPE), ``llama`` (sentencepiece-style BPE with byte fallback) or None:
    a tokenizer llama.cpp has no model for (word-level, unigram...)."""
    try:
        spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return None
    if "ByteLevel" in json.dumps(spec.get("pre_tokenizer")):
        return "gpt2"
    return "llama" if model.get("byte_fallback") else None


def add_tokenizer(writer: Any, folder: Path, tokenizer: Any, vocab_size: int, pre: str) -> None:
    """Tokens by id (ids the tokenizer lacks as unused padding, so the vocabulary is the
    embedding's size), their types, merges, special ids, add-BOS and the chat template."""
    import gguf

    kind = tokenizer_kind(folder)
    if kind == "llama":
        tokens, scores, types = zip(*gguf.LlamaHfVocab(folder).all_tokens(), strict=True)
        tokens, scores, types = list(tokens), list(scores), list(types)
        for i in range(len(tokens), vocab_size):
            tokens.append(f"[PAD{i}]".encode())
            scores.append(-1000.0)
            types.append(gguf.TokenType.UNUSED)
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_scores(scores)
    else:
        tokens, types = bpe_tokens(tokenizer, vocab_size)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(folder, load_merges=kind == "gpt2", n_vocab=len(tokens)).add_to_gguf(writer, quiet=True)


def bpe_tokens(tokenizer: Any, vocab_size: int) -> tuple[list[str], list[int]]:
    """Byte-level tokens in id order: special added tokens are control tokens, other added
    tokens user-defined (matched whole before BPE), as llama.cpp's own converter types them."""
    import gguf

    by_id = {i: t for t, i in tokenizer.get_vocab().items()}
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
    return tokens, types


def llama_cpp_ids(path: Path, texts: tuple[str, ...]) -> list[list[int]] | None:
    """llama.cpp's ids for ``texts`` from the vocabulary in ``path`` (no BOS, special tokens
    parsed); None where llama.cpp refuses the file (a pre-tokenizer name it does not know)."""
    from llmsample.models.llamacpp_lib import silence_llama_cpp

    lib = silence_llama_cpp()
    lib.llama_backend_init()
    params = lib.llama_model_default_params()
    params.vocab_only = True
    handle = lib.llama_model_load_from_file(str(path).encode(), params)
    if not handle:
        return None
    try:
        vocab = lib.llama_model_get_vocab(handle)
        result = []
        for text in texts:
            data = text.encode()
            out = (lib.llama_token * (len(data) + 8))()
            n = lib.llama_tokenize(vocab, data, len(data), out, len(data) + 8, False, True)
            result.append(list(out[: max(n, 0)]))
        return result
    finally:
        lib.llama_model_free(ctypes.c_void_p(handle) if isinstance(handle, int) else handle)


def probe_texts(tokenizer: Any) -> tuple[str, ...]:
    """The probe, and the chat template applied to one turn where there is one (special tokens)."""
    texts = PROBE
    if getattr(tokenizer, "chat_template", None):
        try:
            turn = tokenizer.apply_chat_template([{"role": "user", "content": "Hi there 12"}], tokenize=False)
            texts = (*texts, turn)
        except Exception:  # a template that needs more than one plain turn: the probe stays plain
            pass
    return texts


def matching_pre(write_vocab: Any, scratch: Path, folder: Path, tokenizer: Any) -> str | None:
    """The first pre-tokenizer name under which llama.cpp's ids equal transformers' on the probe
    (``write_vocab(path, pre)`` writes a metadata-only GGUF); None when no name does."""
    texts = probe_texts(tokenizer)
    want = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    names = PRE_NAMES if tokenizer_kind(folder) == "gpt2" else ("default",)
    for name in names:
        path = scratch / f"vocab-{name}.gguf"
        write_vocab(path, name)
        try:
            if llama_cpp_ids(path, texts) == want:
                return name
        finally:
            path.unlink(missing_ok=True)
    return None
