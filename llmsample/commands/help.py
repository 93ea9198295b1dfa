"""``--help`` by purpose: every command lists its options under the same headings, in the same
order (rich-click panels; an option's heading is the ``panel`` its decorator stack gave it)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from rich_click import RichCommand, RichContext, RichHelpFormatter, RichOptionPanel

if TYPE_CHECKING:
    from rich.markdown import Markdown
    from rich.style import StyleType
    from rich.text import Text

PANELS = (
    "Prompt", "Sampling", "Penalties", "Stops, bans and biases", "Truncation", "More samplers", "Output",
    "Constrained output", "Speculation", "Engine", "Model", "Devices and memory",
)  # fmt: skip
"""The headings in the order a user reaches for them (the samplers most runs set, then the others
by family); a command's own options come last, under Options."""


class HelpFormatter(RichHelpFormatter):
    """rich-click ends a ``\\b`` block (the examples) with its paragraph break twice, so the text
    after it came four blank lines down; one blank line between paragraphs, as elsewhere."""

    def rich_text(self, text: str | Text | Markdown, style: StyleType = "") -> Text | Markdown:
        return super().rich_text(re.sub(r"\n{3,}", "\n\n", text) if isinstance(text, str) else text, style)


class HelpContext(RichContext):
    formatter_class = HelpFormatter


class GroupedCommand(RichCommand):
    """A command whose ``--help`` shows its options under :data:`PANELS`."""

    context_class = HelpContext

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        used = {getattr(param, "panel", None) for param in self.params}
        self.panels = [RichOptionPanel(name) for name in PANELS if name in used] + self.panels
