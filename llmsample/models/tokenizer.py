"""Reading a saved tokenizer by the class it was saved with, when that is transformers' generic one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GENERIC = "TokenizersBackend"


def saved_tokenizer(source: str | Path, config: Any = None) -> Any:
    """The tokenizer of a local folder or hub id. When transformers chose its generic class for
    it (``tokenizer.json`` read as it is, as for the default model), that class loads it directly:
    ``AutoTokenizer`` would import its class and config tables and read the model's config
    first, 0.7-1.2 s of a start on a slow CPU. Any other class, or a hub id, goes through it."""
    if saved_class(Path(source)) == GENERIC:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend.from_pretrained(str(source))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(source), **({} if config is None else {"config": config}))


def saved_class(folder: Path) -> str | None:
    """The class a local folder's tokenizer was saved with; None without ``tokenizer.json``."""
    saved = folder / "tokenizer_config.json"
    if not (saved.is_file() and (folder / "tokenizer.json").is_file()):
        return None
    return json.loads(saved.read_text()).get("tokenizer_class")
