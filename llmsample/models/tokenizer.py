"""Reading a tokenizer llmsample saved itself by the class it was saved with, when that is
transformers' generic one; transformers quieted before it reads one."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from llmsample.files import replace_whole

GENERIC = "TokenizersBackend"


def saved_tokenizer(source: str | Path, config: Any) -> Any:
    """The tokenizer of a folder llmsample wrote with ``AutoTokenizer``'s choice of class (a GGUF's
    kept folder). When that choice was transformers' generic class (``tokenizer.json`` read as it
    is, as for the default model), the class loads it directly: ``AutoTokenizer`` would import its
    class and config tables first, about a second of a start on a slow CPU. Not for a user's
    folder: there ``AutoTokenizer`` also reads the model's config, and for some model types
    (qwen2) loads their own class whatever the folder says. Any other class goes through it."""
    if saved_class(Path(source)) == GENERIC:
        record_added_tokens(Path(source))
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend.from_pretrained(str(source))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(source), config=config)


def saved_class(folder: Path) -> str | None:
    """The class a local folder's tokenizer was saved with; None without ``tokenizer.json``."""
    saved = folder / "tokenizer_config.json"
    if not (saved.is_file() and (folder / "tokenizer.json").is_file()):
        return None
    return json.loads(saved.read_text(encoding="utf-8")).get("tokenizer_class")


def record_added_tokens(folder: Path) -> None:
    """``tokenizer.json``'s added tokens kept in the folder's ``tokenizer_config.json`` as
    ``added_tokens_decoder`` (transformers' own key for them), once: without it every load parses
    the whole ``tokenizer.json`` in Python for those few tokens, and the Rust tokenizer then parses
    it again (0.2 s of a start on a loaded 2-core machine). The same tokens either way; a folder
    that cannot be written only costs its next start that time."""
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    if "added_tokens_decoder" in config:
        return
    added = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")).get("added_tokens") or []
    config["added_tokens_decoder"] = {str(token["id"]): {k: v for k, v in token.items() if k != "id"} for token in added}
    with contextlib.suppress(OSError):
        replace_whole(path, json.dumps(config, indent=2, ensure_ascii=False).encode())


def quiet_transformers() -> None:
    """Our own progress display replaces transformers' bars and warnings (the optional
    quantization libraries were silenced when :mod:`llmsample.models` was imported)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
