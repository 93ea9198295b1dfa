"""What the model cache holds and what each entry was made from: a checkpoint converted from a
GGUF (the default model's, or one given to the transformers backend), a GGUF written from a
checkpoint or rewritten at another weight type, and a GGUF's kept tokenizer and config. Each is
written with the file it came from (:mod:`llmsample.models.provenance`), so ``llmsample
models`` can say which file a run's model was derived from and what it costs on disk."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmsample.models.gguf_to_hf import is_complete_checkpoint
from llmsample.models.hf_to_gguf import is_complete_gguf
from llmsample.models.provenance import recorded_source


@dataclass(frozen=True)
class Artefact:
    kind: str  # checkpoint (safetensors), gguf, or sidecar (a GGUF's tokenizer and config)
    path: Path
    bytes: int
    made: str  # what it is, in words: "F16 GGUF", "safetensors (bfloat16)"...
    source: str | None  # the file it was made from (None: made before llmsample kept it)


def artefacts(root: Path) -> list[Artefact]:
    """Every complete entry of the cache at ``root``, by name (staging folders left out)."""
    found = []
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if not path.is_dir() or ".partial-" in path.name:
            continue
        if path.name.startswith(".gguf-"):
            kind, made = "sidecar", "tokenizer and config"
        elif is_complete_gguf(path):
            kind, made = "gguf", f"{path.name.rpartition('-')[2]} GGUF"
        elif is_complete_checkpoint(path):
            kind, made = "checkpoint", "safetensors"
        else:
            continue
        recorded = recorded_source(path)
        source, made = recorded if recorded is not None else (None, made)
        found.append(Artefact(kind, path, _size(path), made, source))
    return found


def _size(path: Path) -> int:
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())
