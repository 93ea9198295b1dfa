"""The options that choose the model, its device and backend, and spread it over devices; and
loading it with progress on stderr (with its drafter and its reference: the engine in this
process, :func:`local_engine`)."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from llmsample.commands.option_group import option_group
from llmsample.errors import UserError

if TYPE_CHECKING:
    from llmsample.api.local import LocalEngine
    from llmsample.engine.speculative import Drafter
    from llmsample.models.loading import LoadedModel


DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def check_device(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A click callback: a device name torch would take, checked before anything loads."""
    if not DEVICE_PATTERN.fullmatch(value):
        raise click.BadParameter(f"{value!r} is not one of auto, cpu, cuda, cuda:N, mps")
    return value


model_options = option_group(
    click.option("--model", "-m", metavar="ID|DIR", help="Hub id or local directory [default: SmolLM2-135M-Instruct]."),
    click.option(
        "--device", default="auto", show_default=True, callback=check_device, help="auto, cpu, cuda, cuda:N or mps."
    ),
    click.option(
        "--dtype",
        type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
        default="auto",
        show_default=True,
        help="auto: the checkpoint's dtype where the device runs it natively (bf16 on CUDA, on CPUs with AVX512-BF16/AMX), else float32 (see docs/models.md).",
    ),
    click.option(
        "--compile",
        "compile_model",
        is_flag=True,
        help="Static KV cache + torch.compile'd decode step: faster tokens after a slow first start (cached on disk).",
    ),
    click.option(
        "--backend",
        type=click.Choice(["auto", "transformers", "llama.cpp", "torch"]),
        default="auto",
        show_default=True,
        envvar="LLMSAMPLE_BACKEND",
        help="llama.cpp runs GGUF files, local checkpoints (written to GGUF once) and the default model on the CPU; needs llmsample[llamacpp]. torch: llmsample's own forward of Llama, Mistral and Qwen2 checkpoints (no transformers import: the fastest start). auto: llama.cpp on a CPU where it can run the model and no transformers-only option is given, else torch where it can, else transformers [env: LLMSAMPLE_BACKEND].",
    ),
    click.option(
        "--gguf-type",
        metavar="TYPE",
        default=None,
        help="llama.cpp's weight type (F16, BF16, Q8_0, Q4_K_M...): the model written at it once by llama.cpp's quantizer. Default: a checkpoint's own precision, F16 for the default model.",
    ),
    click.option("--verbose", is_flag=True, help="Say on stderr which backend runs the model, and why."),
    panel="Model",
)


def _placement_value(parser: str) -> Callable[[click.Context, click.Parameter, str | None], Any]:
    """A click callback that reads the option with ``llmsample.models.placement.<parser>`` (imported
    only when the option is given): absent stays None, a ValueError is a usage error."""

    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        from llmsample.models import placement

        try:
            return getattr(placement, parser)(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from exc

    return check


placement_options = option_group(
    click.option(
        "--device-map",
        metavar="auto|balanced|sequential|FILE",
        callback=_placement_value("read_device_map"),
        help="Spread the layers over the GPUs, the CPU and disk (accelerate); FILE: a JSON {module: device} map.",
    ),
    click.option(
        "--max-memory",
        metavar="DEV=SIZE,...",
        callback=_placement_value("parse_max_memory"),
        help="Memory per device for --device-map, e.g. 0=20GiB,1=20GiB,cpu=60GiB (implies --device-map auto).",
    ),
    click.option(
        "--offload-folder",
        type=click.Path(file_okay=False, path_type=Path),
        callback=lambda ctx, param, value: None if value is None else check_offload_folder(value),
        help="Where layers offloaded to disk keep their weights (implies --device-map auto).",
    ),
    click.option(
        "--quantize",
        type=click.Choice(["int8", "int4"]),
        help="Quantize the weights as they load: int8 (torchao), int4 (bitsandbytes NF4); needs llmsample[quant].",
    ),
    panel="Devices and memory",
)


def check_offload_folder(folder: Path) -> Path:
    """A folder that cannot be written fails deep in the load with an error about the model: try
    it first (a file in it, or a directory beside where it would be made; nothing is left), as
    ``--html`` does, since root ignores permission bits and a read-only mount does not."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if existing == folder:
            with tempfile.TemporaryFile(dir=folder):
                pass
        elif not existing.is_dir():
            raise click.BadParameter(f"cannot make {folder}: {existing} is not a directory; choose another folder")
        else:
            Path(tempfile.mkdtemp(dir=existing)).rmdir()
    except OSError as exc:
        raise click.BadParameter(
            f"cannot write the offload folder {folder} ({exc.strerror or exc}); choose another folder"
        ) from exc
    return folder


def placement_from_options(options: dict[str, Any]) -> Any:
    """``--device-map`` and friends as a ``Placement``; None places nothing (one device)."""
    from llmsample.models.placement import Placement

    device_map, max_memory, folder = (options.get(k) for k in ("device_map", "max_memory", "offload_folder"))
    if device_map is None and max_memory is None and folder is None:
        return None
    return Placement(device_map or "auto", max_memory, None if folder is None else str(folder))


def load_model_with_progress(options: dict[str, Any]) -> LoadedModel:
    """Load with progress on stderr: the first run converts the default model (tens of seconds)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from llmsample.models.loading import load_model
    from llmsample.terminal import stderr_console

    spec = (options["model"], options["device"], options["dtype"])
    compile_model = options.get("compile_model", False)
    scaling = {
        "placement": placement_from_options(options),
        "quantize": options.get("quantize"),
        "tensor_parallel": options.get("tp", False),
        "backend": options.get("backend", "auto"),
        "gguf_type": options.get("gguf_type"),
        "layers": bool(options.get("layers")),
    }
    if options.get("quiet"):
        lm = load_model(*spec, compile=compile_model, **scaling)
    else:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        console = stderr_console()
        # Off the terminal a live display only adds blank lines; step messages still print.
        with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
            task = progress.add_task(f"loading {options['model'] or 'the default model'}", total=None)
            lm = load_model(*spec, progress=progress, compile=compile_model, **scaling)
            progress.remove_task(task)
    if options.get("verbose"):
        click.echo(f"llmsample: {lm.backend} runs {lm.name} ({lm.weights}): {lm.why}", err=True)
    return lm


def load_reference(options: dict[str, Any], lm: LoadedModel) -> LoadedModel:
    """``--reference``: the same checkpoint in float32, unquantized, placed like the model (on
    llama.cpp: the same GGUF dequantized on transformers, which measures the quantized kernels)."""
    from llmsample.commands.model_options import placement_from_options
    from llmsample.models.loading import load_model

    if lm.quantization and not options.get("quantize") and lm.backend != "llama.cpp":
        raise UserError(
            f"--reference needs full-precision weights, and model {lm.name!r} is stored quantized "
            f"({lm.quantization}); compare against the checkpoint it was quantized from"
        )
    placement = placement_from_options(options)
    device = "auto" if placement is not None else str(lm.device)
    return load_model(options["model"], device, "float32", placement=placement)


def build_drafter(options: dict[str, Any], lm: LoadedModel) -> Callable[[], Drafter] | None:
    """``--draft``: ``auto`` (the default: the suffix pool where the backend drafts by default,
    else None), ``ngram`` (prompt lookup), ``suffix`` (a pool across requests) or a model sharing
    the target's tokenizer, loaded once: a maker of one drafter per row (a draft model's drafter
    keeps that row's draft cache); None for ``none``."""
    from llmsample.engine.speculative import ModelDrafter, NgramDrafter, check_same_tokenizer
    from llmsample.engine.suffix_pool import auto_drafter, suffix_drafter
    from llmsample.jobs import NGRAM
    from llmsample.models.loading import load_model

    draft, vocab = options.get("draft") or "auto", lm.model.config.vocab_size
    if draft == "none":
        return None
    if draft in ("auto", "ngram", "suffix"):
        low, high = options.get("ngram_min", NGRAM[0]), options.get("ngram_max", NGRAM[1])
        if low > high:
            raise UserError(f"--ngram-min {low} is above --ngram-max {high}")
        if draft == "auto":
            return auto_drafter(lm, (low, high))
        if draft == "suffix":  # one pool for the run (a server's: every request's)
            return suffix_drafter(lm, (low, high))
        return lambda: NgramDrafter(vocab, lm.sample_device, low, high)  # a row's own: it indexes that row's tokens
    from llmsample.models.plan import draft_load

    device, dtype, backend = draft_load(draft, lm.backend, lm.sample_device, lm.dtype)
    model = load_model(draft, device, dtype, backend=backend)
    check_same_tokenizer(model, lm)
    return lambda: ModelDrafter(model, vocab, lm.sample_device)


def local_engine(options: dict[str, Any], lm: LoadedModel | None = None) -> LocalEngine:
    """The engine in this process for a command's options: the model (``lm``, or loaded with
    progress when first asked), and, as a job asks, the drafter (``--draft``) and the reference
    (``--reference``); ``batch``'s prompt cache (``--prompt-cache-mb``)."""
    from llmsample.api.local import LocalEngine
    from llmsample.engine.suffix_pool import auto_drafter
    from llmsample.jobs import NGRAM, drafter_asked

    asked = drafter_asked(options.get("draft")) and options.get("draft") != "ngram"  # prompt lookup: the row's own
    drafter = (lambda lm: build_drafter(options, lm)) if asked else None
    ngram = (options.get("ngram_min", NGRAM[0]), options.get("ngram_max", NGRAM[1]))
    reference = (lambda lm: load_reference(options, lm)) if options.get("reference") else None
    load = (lambda: lm) if lm is not None else (lambda: load_model_with_progress(options))
    return LocalEngine(load, drafter=drafter, auto=lambda lm: auto_drafter(lm, ngram), reference=reference,
                       prompt_cache_mb=options.get("prompt_cache_mb") or 0,
                       deterministic=bool(options.get("deterministic")))  # fmt: skip
