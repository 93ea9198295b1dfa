"""What a model cache entry was made from, kept beside it when it is written (in its staging
folder, before the rename that makes it an entry) and read back by ``llmsample models``."""

from __future__ import annotations

import json
from pathlib import Path

SOURCE_FILE = "llmsample-source.json"


def record_source(folder: Path, source: Path | str, made: str) -> None:
    """Keep in ``folder`` the file it is made from and what it is (``F16 GGUF``, ...)."""
    (folder / SOURCE_FILE).write_text(json.dumps({"from": str(source), "made": made}) + "\n", encoding="utf-8")


def recorded_source(folder: Path) -> tuple[str, str] | None:
    """The file ``folder`` was made from and what it is; None for an entry written before this
    was kept (or whose record is unreadable)."""
    try:
        data = json.loads((folder / SOURCE_FILE).read_text(encoding="utf-8"))
        return str(data["from"]), str(data["made"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
