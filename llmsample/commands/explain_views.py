"""``explain --layers`` and ``explain --tree``: run the analysis and show it (terminal table or
tree, ``--format jsonl``, ``--html``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from torch import Tensor

    from llmsample.models.loading import LoadedModel
    from llmsample.sampling.config import SamplingConfig


def show_layers(
    options: dict[str, Any],
    lm: LoadedModel,
    prompt: str,
    prompt_ids: Tensor,
    fed: list[int],
    cfg: SamplingConfig,
    watch: list[int],
    console: Any,
) -> None:
    """The lens at the position after the prompt and ``fed`` (``--continuation``'s tokens)."""
    from llmsample.analysis.lens_records import explain_layers
    from llmsample.render.jsonout import strict_json
    from llmsample.render.lens_view import layers_page, layers_table

    report = explain_layers(lm, prompt_ids, cfg, options["top_n"] or 5, watch, fed)
    if options["html"]:
        from llmsample.render.html import write_page

        write_page(options["html"], layers_page(report, prompt + (options["continuation"] or "")))
    if options["fmt"] == "jsonl":
        click.echo(strict_json(report.to_dict()))
    else:
        console.print(layers_table(report))


def show_tree(
    options: dict[str, Any],
    lm: LoadedModel,
    prompt: str,
    prompt_ids: Tensor,
    console: Any,
) -> None:
    """The tree of the model's own probabilities (the preset does not shape it)."""
    from llmsample.engine.tree import continuation_tree
    from llmsample.render.jsonout import strict_json
    from llmsample.render.lens_view import tree_page, tree_view

    depth, width = options["tree"], options["tree_width"]
    branches = continuation_tree(lm, prompt_ids[0].tolist(), depth, width)
    if options["html"]:
        from llmsample.render.html import write_page

        write_page(options["html"], tree_page(branches, prompt))
    if options["fmt"] == "jsonl":
        record = {"type": "tree", "depth": depth, "width": width, "branches": [b.to_dict() for b in branches]}
        click.echo(strict_json(record))
    else:
        console.print(tree_view(branches, depth, width))
