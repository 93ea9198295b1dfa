"""What the model cache holds and what each entry was made from: a checkpoint converted from a
GGUF (the default model's, or one given to the transformers backend), a GGUF written from a
checkpoint or rewritten at another weight type, and a GGUF's kept tokenizer and config. Each is
written with the file it came from (:func:`record_source`), so ``llmsample models`` can say
which file a run's model was derived from and what it costs on disk."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SOURCE_FILE = "llmsample-source.json"


@dataclass(frozen=True)
class Artefact:
    kind: str  # checkpoint (safetensors), gguf, or sidecar (a GGUF's tokenizer and config)
    path: Path
    bytes: int
    made: str  # what it is, in words: "F16 GGUF", "safetensors (bfloat16)"...
    source: str | None  # the file it was made from (None: made before llmsample kept it)


def record_source(folder: Path, source: Path | str, made: str) -> None:
    """Keep beside an entry (in its staging folder, before it is renamed into place) what it was
    made from and what it is."""
    (folder / SOURCE_FILE).write_text(json.dumps({"from": str(source), "made": made}) + "\n", encoding="utf-8")


def artefacts(root: Path) -> list[Artefact]:
    """Every complete entry of the cache at ``root``, by name (staging folders left out)."""
    from llmsample.models.gguf_to_hf import is_complete_checkpoint
    from llmsample.models.hf_to_gguf import is_complete_gguf

    found = []
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if not path.is_dir() or ".partial-" in path.name or path.name.startswith(".staging"):
            continue
        if path.name.startswith(".gguf-"):
            kind, made = "sidecar", "tokenizer and config"
        elif is_complete_gguf(path):
            kind, made = "gguf", f"{path.name.rpartition('-')[2]} GGUF"
        elif is_complete_checkpoint(path):
            kind, made = "checkpoint", "safetensors"
        else:
            continue
        source, made = _recorded(path, made)
        found.append(Artefact(kind, path, _size(path), made, source))
    return found


def _recorded(path: Path, made: str) -> tuple[str | None, str]:
    try:
        data = json.loads((path / SOURCE_FILE).read_text(encoding="utf-8"))
        return str(data["from"]), str(data.get("made") or made)
    except (OSError, ValueError, KeyError, TypeError):
        return None, made


def _size(path: Path) -> int:
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())
