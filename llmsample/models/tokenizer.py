"""Reading a tokenizer llmsample saved itself by the class it was saved with, when that is
transformers' generic one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GENERIC = "TokenizersBackend"


def saved_tokenizer(source: str | Path, config: Any) -> Any:
    """The tokenizer of a folder llmsample wrote with ``AutoTokenizer``'s choice of class (a GGUF's
    kept folder). When that choice was transformers' generic class (``tokenizer.json`` read as it
    is, as for the default model), the class loads it directly: ``AutoTokenizer`` would import its
    class and config tables first, about a second of a start on a slow CPU. Not for a user's
    folder: there ``AutoTokenizer`` also reads the model's config, and for some model types
    (qwen2) loads their own class whatever the folder says. Any other class goes through it."""
    if saved_class(Path(source)) == GENERIC:
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
