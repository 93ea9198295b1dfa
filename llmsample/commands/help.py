"""``--help`` by purpose: every command lists its options under the same headings, in the same
order (rich-click panels; an option's heading is the ``panel`` its decorator stack gave it)."""

from __future__ import annotations

from typing import Any

from rich_click import RichCommand, RichOptionPanel

PANELS = (
    "Prompt", "Sampling", "Output", "Constrained output", "Speculation", "Engine", "Model", "Devices and memory",
)  # fmt: skip
"""The headings in the order a user reaches for them; a command's own options come last, under Options."""


class GroupedCommand(RichCommand):
    """A command whose ``--help`` shows its options under :data:`PANELS`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        used = {getattr(param, "panel", None) for param in self.params}
        self.panels = [RichOptionPanel(name) for name in PANELS if name in used] + self.panels
