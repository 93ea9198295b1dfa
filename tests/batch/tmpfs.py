"""Real small filesystems for the disk cases: a tmpfs of a given size (or read-only), filled
but a few bytes. Mounting needs root: the test is skipped, saying why, where it cannot mount."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(path: Path, *options: str) -> Iterator[Path]:
    """A real small tmpfs (root only); the test is skipped, saying why, where it cannot be mounted."""
    path.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("cannot mount a tmpfs here (no mount command)")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(path)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or 'not root'})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(folder: Path, leave: int) -> Path:
    """Fill a filesystem but ``leave`` bytes."""
    stats = os.statvfs(folder)
    filler = folder / "filler"
    filler.write_bytes(b"\0" * max(0, stats.f_bavail * stats.f_frsize - leave))
    return filler
