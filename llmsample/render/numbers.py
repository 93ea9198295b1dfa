"""Numbers in tables (``bench``, ``compare-presets``): one format, so a missing figure looks the
same everywhere. Torch-free, so a command can format without loading the model stack."""

from __future__ import annotations


def format_number(value: float | None, digits: int = 2) -> str:
    """``value`` with ``digits`` decimals; ``-`` for a figure that does not exist (None)."""
    return "-" if value is None else f"{value:.{digits}f}"
