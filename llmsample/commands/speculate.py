"""``llmsample speculate``: the same text distribution as ``generate``, in fewer target passes."""

from __future__ import annotations

from typing import Any

import click

from llmsample.commands.generate import run
from llmsample.commands.help import GroupedCommand
from llmsample.commands.host_options import with_engine_options
from llmsample.commands.options import generation_options, reference_option


@click.command(cls=GroupedCommand)
@generation_options
@reference_option
@with_engine_options
def speculate(**options: Any) -> None:
    """Speculative decoding: a draft proposes, the target verifies (exact rejection sampling).

    --draft is a model sharing the target's tokenizer, or 'ngram' (the default): prompt lookup,
    which pays off when the answer copies from the prompt (rewrites, edits, extraction).
    Drafted tokens that the target accepted are underlined in the live view. With 'ngram', a
    warm engine of the model (llmsample start) drafts and verifies instead of this process.

    \b
    llmsample speculate -p "Add docstrings to: $(cat f.py)" --draft ngram --compare
    llmsample speculate -m HuggingFaceTB/SmolLM2-1.7B-Instruct --draft HuggingFaceTB/SmolLM2-135M-Instruct -p ...
    """
    run({**options, "draft": options["draft"] or "ngram"})
