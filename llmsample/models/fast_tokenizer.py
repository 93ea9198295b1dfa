"""The tokenizer of a GGUF's kept folder read with ``tokenizers`` alone: what a llama.cpp run asks
of a tokenizer (ids, texts, pieces, the vocabulary, special tokens, the chat template), answered
as transformers' ``TokenizersBackend`` answers it, without importing transformers' package
(0.6 s of a 2.6 s cold start: its ``__init__`` reads every model folder's ``__all__``).

Only for a folder whose every setting is one this class reproduces exactly (:func:`fast_tokenizer`
says None otherwise, and the caller loads transformers' class): ``tokenizer.json`` as
transformers saved it (its special tokens already added, no padding or truncation kept), and a
``tokenizer_config.json`` holding no key outside :data:`KNOWN`. Proven equal to transformers' own
tokenizer of the same folder in tests/models/test_fast_tokenizer.py."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmsample.models.chat_template import render

NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
KNOWN = frozenset({
    *NAMED, "tokenizer_class", "backend", "added_tokens_decoder", "chat_template", "clean_up_tokenization_spaces",
    "model_max_length", "is_local", "local_files_only", "split_special_tokens", "padding_side", "truncation_side",
    "name_or_path", "model_input_names",
})  # fmt: skip
"""``tokenizer_config.json`` keys that change nothing here, or that this class reads."""
TRANSFORMERS_ONLY = frozenset({
    "chat_template", "continue_final_message", "sanitize_control_tokens", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
})  # fmt: skip
"""``apply_chat_template`` arguments transformers acts on: here they would silently become template
variables, so they are refused."""


class FastTokenizer:
    """``tokenizers.Tokenizer`` behind the part of transformers' tokenizer interface llmsample uses."""

    def __init__(self, backend: Any, settings: dict[str, Any], chat_template: str | None) -> None:
        self._tokenizer = backend
        self.chat_template = chat_template
        self.clean_up_tokenization_spaces = bool(settings.get("clean_up_tokenization_spaces", False))
        self.special_tokens_map = {name: settings[name] for name in NAMED if settings.get(name) is not None}

    @property
    def backend_tokenizer(self) -> Any:
        """The Rust tokenizer (llguidance's tables and the token-bytes table read its decoder)."""
        return self._tokenizer

    def __getattr__(self, name: str) -> Any:
        """``eos_token``, ``eos_token_id`` and the other named special tokens (None when unset)."""
        base = name.removesuffix("_id")
        if base not in NAMED:
            raise AttributeError(f"{type(self).__name__} has no attribute {name}")
        token = self.__dict__.get("special_tokens_map", {}).get(base)
        if token is None or base == name:
            return token
        return self.convert_tokens_to_ids(token)

    @property
    def all_special_tokens(self) -> list[str]:
        return list(dict.fromkeys(self.special_tokens_map.values()))

    @property
    def all_special_ids(self) -> list[int]:
        return self.convert_tokens_to_ids(self.all_special_tokens)

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        return self._tokenizer.get_added_tokens_decoder()

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def __bool__(self) -> bool:
        return True

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        """``{"input_ids": ids}`` of one text, as ``tokenizer(text)["input_ids"]``."""
        return {"input_ids": self.encode(text, add_special_tokens=add_special_tokens)}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"{type(self).__name__} encodes one text, not {type(text).__name__}")
        return self._tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, token_ids: int | Sequence[int], skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool | None = None) -> str:  # fmt: skip
        ids = [token_ids] if isinstance(token_ids, int) else [int(i) for i in token_ids]
        text = self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        clean = (
            self.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None else clean_up_tokenization_spaces
        )
        if clean and type(self._tokenizer.model).__name__ != "BPE":  # transformers skips it for BPE
            text = clean_up_tokenization(text)
        return text

    def batch_decode(self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool = False,
                     clean_up_tokenization_spaces: bool | None = None) -> list[str]:  # fmt: skip
        return [self.decode(ids, skip_special_tokens, clean_up_tokenization_spaces) for ids in sequences]

    def convert_ids_to_tokens(self, ids: int | Sequence[int], skip_special_tokens: bool = False) -> Any:
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        skip = set(self.all_special_ids) if skip_special_tokens else set()
        return [self._tokenizer.id_to_token(int(i)) for i in ids if int(i) not in skip]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> Any:
        """A token's id; one not in the vocabulary is the unknown token's (None without one)."""
        if isinstance(tokens, str):
            found = self._tokenizer.token_to_id(tokens)
            return found if found is not None else self.unk_token_id
        return [self.convert_tokens_to_ids(token) for token in tokens]

    def apply_chat_template(self, conversation: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                            documents: list[dict[str, Any]] | None = None, add_generation_prompt: bool = False,
                            tokenize: bool = True, **kwargs: Any) -> str | list[int]:  # fmt: skip
        """One conversation through the template, as transformers renders it; ``tokenize``: its ids
        (no special tokens added), else its text."""
        if refused := TRANSFORMERS_ONLY & kwargs.keys():
            raise TypeError(f"{type(self).__name__}.apply_chat_template: {sorted(refused)} "
                            "are transformers' arguments, not template variables; load transformers' tokenizer")  # fmt: skip
        if self.chat_template is None:
            raise ValueError("Cannot use chat template functions because tokenizer.chat_template is not set")
        if not conversation:
            raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
        text = render(self.chat_template, conversation, tools, documents, add_generation_prompt,
                      **{**self.special_tokens_map, **kwargs})  # fmt: skip
        return self.encode(text, add_special_tokens=False) if tokenize else text


def clean_up_tokenization(text: str) -> str:
    """transformers' ``clean_up_tokenization``: the spaces WordPiece put before punctuation."""
    for spaced, joined in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                           (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):  # fmt: skip
        text = text.replace(spaced, joined)
    return text


def fast_tokenizer(folder: Path) -> FastTokenizer | None:
    """The folder's tokenizer as a :class:`FastTokenizer`, or None where transformers' class would
    do anything this one does not: another class, settings outside :data:`KNOWN`, split special
    tokens, a ``tokenizer.json`` with padding, truncation or no post-processor (transformers
    rebuilds those), a special token the file lacks (transformers adds it), more than one chat
    template, or a vocabulary over 100,000 tokens (transformers patches some Mistral ones)."""
    try:
        settings = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not (isinstance(settings, dict) and settings.get("tokenizer_class") == "TokenizersBackend"):
        return None
    template = chat_template(folder, settings)
    if set(settings) - KNOWN or settings.get("split_special_tokens") or template is False:
        return None
    named = [settings.get(name) for name in NAMED if settings.get(name) is not None]
    if not all(isinstance(token, str) for token in named):
        return None
    from tokenizers import Tokenizer

    try:
        backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception:  # tokenizers raises a bare Exception for a file it cannot read
        return None
    if backend.padding is not None or backend.truncation is not None or backend.post_processor is None:
        return None
    if backend.get_vocab_size(with_added_tokens=False) > 100_000:
        return None
    added = {token.content: (index, token) for index, token in backend.get_added_tokens_decoder().items()}
    if not all(token in added and added[token][1].special for token in named):
        return None
    recorded = settings.get("added_tokens_decoder") or {}
    if any(not same_token(added.get(token.get("content")), int(index), token) for index, token in recorded.items()):
        return None
    backend.encode_special_tokens = False
    return FastTokenizer(backend, settings, template or None)


def chat_template(folder: Path, settings: dict[str, Any]) -> str | bool | None:
    """The folder's one chat template (``chat_template.jinja``, else the config's string); None
    without one; False where there are several or a named set (transformers picks among them)."""
    if (folder / "additional_chat_templates").exists() or (folder / "chat_template.json").exists():
        return False
    path = folder / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    template = settings.get("chat_template") if isinstance(settings, dict) else None
    return template if isinstance(template, str) or template is None else False


def same_token(found: tuple[int, Any] | None, index: int, recorded: dict[str, Any]) -> bool:
    """Whether ``tokenizer.json`` holds a recorded added token as it is recorded: transformers
    would add one that differs."""
    if found is None or found[0] != index:
        return False
    return all(getattr(found[1], key, None) == value for key, value in recorded.items() if key != "content")
