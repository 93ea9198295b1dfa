"""Files written whole or not at all: what a reader may load is never half-written."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def replace_whole(path: Path, data: bytes) -> None:
    """``data`` written beside ``path``, synced, then renamed over it, so a full disk or an
    interrupt never tears the file there before (it stays as it was); the temporary file is
    removed on any failure, which is raised for the caller to word."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(temporary, "xb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):  # never made (no such folder): nothing to remove
            temporary.unlink(missing_ok=True)
        raise
