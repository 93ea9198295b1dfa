"""Each token's own bytes (OpenAI's ``logprobs`` ``bytes``): a text's tokens, joined, give back its
UTF-8, also where a character is split across tokens (the default model's byte-level BPE, a
SentencePiece vocabulary's byte-fallback tokens ``<0xNN>``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llmsample.models.token_bytes import TokenBytes
from tests.conftest import TEST_HOME

TEXT = "Hello wörld, é漢😀 café\n\tend"


def own_bytes(tokenizer: Any, text: str = TEXT) -> list[bytes | None]:
    table = TokenBytes(tokenizer)
    return [table(token) for token in tokenizer(text, add_special_tokens=False)["input_ids"]]


def splits_a_character(pieces: list[bytes | None]) -> bool:
    try:
        for piece in pieces:
            (piece or b"").decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def test_the_default_models_byte_level_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmsample.models.gguf_to_hf import default_model_path
    from llmsample.models.tokenizer import saved_tokenizer

    monkeypatch.setenv("LLMSAMPLE_HOME", str(TEST_HOME))
    tokenizer = saved_tokenizer(Path(default_model_path()), None)
    pieces = own_bytes(tokenizer)
    assert b"".join(piece or b"" for piece in pieces) == TEXT.encode()
    assert splits_a_character(pieces)  # "漢" and "😀" span tokens: their parts are no text alone
    assert TokenBytes(tokenizer)(tokenizer.convert_tokens_to_ids("<|im_end|>")) == b"<|im_end|>"


def sentencepiece_tokenizer() -> Any:
    """A Llama-style vocabulary: letters with ``▁`` for a space, anything else as ``<0xNN>`` bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{byte:02X}>": 3 + byte for byte in range(256)}
    for char in "▁abcdefghijklmnopqrstuvwxyzH,":
        vocab[char] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def test_byte_fallback_tokens_are_one_byte_each() -> None:
    tokenizer = sentencepiece_tokenizer()
    pieces = own_bytes(tokenizer)
    assert b"".join(piece or b"" for piece in pieces) == b" " + TEXT.encode()  # decoding strips the leading "▁"
    assert [piece for piece in pieces if piece and piece[0] >= 0x80][:2] == [b"\xc3", b"\xb6"]  # "ö", byte by byte
    assert splits_a_character(pieces)
    assert TokenBytes(tokenizer)(2) == b"</s>"


def test_a_word_level_vocabulary_has_no_bytes_of_its_own(tiny_model_dir: Path) -> None:
    """Its decoder puts the spaces between words: the caller keeps each token's text."""
    from transformers import AutoTokenizer

    assert set(own_bytes(AutoTokenizer.from_pretrained(tiny_model_dir), "w3 w4")) == {None}
