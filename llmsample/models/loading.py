"""Loading a causal language model and its tokenizer (hub id, local directory, or the converted
default model), refusing in one line whatever would not decode: encoders, missing tokenizer
files, weights that do not match their config."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmsample.errors import RuntimeFailure, UserError, first_line
from llmsample.models.conversion import (
    DEFAULT_HUB_ID,
    DEFAULT_MODEL,
    WEIGHT_FILES,
    cache_home,
    default_model_path,
    models_dir,
    remove_abandoned_staging,
)
from llmsample.models.device import checkpoint_dtype, resolve_device, resolve_dtype
from llmsample.models.placement import Placement

if TYPE_CHECKING:
    import torch
    from rich.progress import Progress
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from llmsample.models.compiled import CompiledSteps

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
)


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    device: torch.device
    dtype: torch.dtype
    compiled: CompiledSteps | None = None  # --compile: the model's compiled decode steps
    tensor_parallel: bool = False  # --tp: this process holds one rank's slice of every layer
    sample_device: torch.device | None = None  # where logits are sampled; None: ``device``
    placed_on: tuple[str, ...] = ()  # --device-map: the devices its layers sit on ("cpu", "disk", ...)
    quantization: str | None = None  # "int8", "int4", or how a stored-quantized checkpoint was quantized
    token_texts: dict[int, str] = field(default_factory=dict, repr=False, compare=False)  # token_text's memo

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

    @property
    def compile(self) -> bool:
        return self.compiled is not None

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
        return getattr(self.model.config, "max_position_embeddings", None)


def check_local_model(path: Path) -> None:
    if not path.is_dir():
        raise UserError(
            f"model path {path} is not a directory; pass a model directory or a hub id like {DEFAULT_HUB_ID}"
        )
    if not (path / "config.json").is_file():
        raise UserError(
            f"model directory {path} has no config.json; point --model at a Hugging Face checkpoint directory"
        )
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise UserError(
            f"model directory {path} has no weights (model.safetensors); save the model with save_pretrained"
        )


def check_tokenizer_files(path: Path) -> None:
    """Without them transformers builds a tokenizer from nothing, or fails with a message about
    slow-tokenizer conversion that does not say what is missing."""
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise UserError(
            f"model directory {path} has no tokenizer files (tokenizer.json, tokenizer_config.json, ...); "
            "save the tokenizer into it with tokenizer.save_pretrained"
        )


def check_causal(name: str, config: Any) -> None:
    """Refuse what is not a text generator. Encoders (BERT, RoBERTa, ...) have a causal-LM class
    in transformers, which would load them with a random head and generate garbage. (A decoder
    saved without its head is caught later, by its missing weights.)"""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    how = "pass a text-generation model (e.g. a Llama, Qwen, GPT-2 or SmolLM checkpoint)"
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise UserError(f"model {name!r} is a {config.model_type!r} model, not a causal language model; {how}")
    encoder = config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not config.is_encoder_decoder
    if encoder and getattr(config, "is_decoder", None) is False:
        raise UserError(
            f"model {name!r} is a {config.model_type!r} encoder (is_decoder is false), not a causal language "
            f"model; {how}"
        )


def looks_like_path(spec: str) -> bool:
    """Hub ids are ``name`` or ``org/name``; anything else that looks like a path is one."""
    return Path(spec).expanduser().exists() or spec.startswith((".", "/", "~")) or spec.count("/") > 1


def read_config(source: str, name: str) -> Any:
    """The model's config, refused in one line when transformers cannot read it or it is no
    causal LM."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(source)
    except OSError as exc:
        raise UserError(_not_found_message(name, exc)) from exc
    except StrictDataclassError as exc:  # e.g. a hidden size that is no multiple of the head count
        raise UserError(_mismatch_message(name, str(exc).strip().splitlines()[-1].strip())) from exc
    except (ValueError, KeyError) as exc:
        raise UserError(
            f"model {name!r} has an architecture this transformers {transformers_version()} does not know "
            f"({first_line(exc)}); upgrade transformers or pick a supported model"
        ) from exc
    check_causal(name, config)
    quantization = getattr(config, "quantization_config", None)
    if isinstance(quantization, dict) and quantization.get("quant_method") == "gguf":
        del config.quantization_config  # kept by older conversions; the weights are plain floats
    return config


def read_weights(source: str, config: Any, dtype: torch.dtype, name: str, **load: Any) -> tuple[Any, Any]:
    """Tokenizer and model; weights that do not fit the config, or are missing (transformers
    would initialise them at random), are one line. ``load``: placement and quantization
    arguments for ``from_pretrained``."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model, info = AutoModelForCausalLM.from_pretrained(
            source, config=config, dtype=dtype, output_loading_info=True, ignore_mismatched_sizes=True, **load
        )
    except ImportError as exc:  # a quantization library transformers wants and cannot import
        raise UserError(f"cannot load model {name!r}: {first_line(exc)}") from exc
    except ValueError as exc:
        if "quantization_config" in load:
            raise UserError(f"cannot quantize model {name!r} ({first_line(exc)}); run it without --quantize") from exc
        if "device_map" in load:
            raise UserError(
                f"cannot place model {name!r} ({first_line(exc)}); check --device-map, --max-memory and --offload-folder"
            ) from exc
        raise UserError(
            f"model {name!r} ({type(config).__name__}) is not a causal language model transformers can load "
            f"({first_line(exc)}); pass a text-generation model"
        ) from exc
    except OSError as exc:
        folder = load.get("offload_folder")
        if folder and exc.filename and str(exc.filename).startswith(str(folder)):
            raise UserError(
                f"cannot write the offload folder {folder} ({exc.strerror or first_line(exc)}); "
                "choose another --offload-folder"
            ) from exc
        raise UserError(_not_found_message(name, exc)) from exc
    except SafetensorError as exc:
        raise UserError(
            f"cannot read the weights of {name!r} ({first_line(exc)}); the file is incomplete or corrupt: "
            "download or save it again"
        ) from exc
    if info["mismatched_keys"]:
        key, saved, expected = sorted(info["mismatched_keys"])[0]
        raise UserError(
            _mismatch_message(name, f"{key} is {list(saved)} in the weights, {list(expected)} by config.json")
        )
    if info["missing_keys"]:  # transformers would initialise them at random
        missing = sorted(info["missing_keys"])
        raise UserError(_mismatch_message(name, f"{len(missing)} weights are missing, e.g. {missing[0]}"))
    return tokenizer, model


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
) -> LoadedModel:
    """Load tokenizer and causal LM; every failure a user can fix becomes one ``UserError`` line.

    ``placement``: spread the layers with accelerate (``--device-map``) instead of one device;
    ``quantize``: ``int8`` or ``int4`` (:mod:`llmsample.models.quantization`)."""
    import torch

    from llmsample.models.quantization import quiet_optional_libraries

    quiet_optional_libraries()
    from transformers.utils import logging as hf_logging

    from llmsample.models.placement import check_devices, input_device, placed_devices, placement_device
    from llmsample.models.precision import emulated_bf16, upcast_wide_products
    from llmsample.models.quantization import check_stored, quantization_config, stored_quantization

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # our own progress display replaces transformers' bars
    if placement is not None:
        if compile:
            raise UserError(
                "--compile needs the whole model on one device, and --device-map may spread it over several; "
                "drop --compile or --device-map"
            )
        if device_name != "auto":
            raise UserError(f"--device {device_name} and --device-map exclude each other; drop one of them")
        check_devices(placement)
        device = placement_device(placement)
    else:
        device = resolve_device(device_name)
    name = spec or DEFAULT_MODEL
    removed = remove_abandoned_staging()
    if removed and progress is not None:
        progress.console.print(
            f"removed {sum(size for _, size in removed) / 1e6:.0f} MB left in {models_dir()} by an interrupted conversion"
        )
    source = default_model_path(progress) if spec is None else spec
    local = spec is not None and looks_like_path(spec)
    if local:
        source = str(Path(spec).expanduser())
        check_local_model(Path(source))
    config = read_config(source, name)
    if placement is not None and isinstance(placement.device_map, dict):
        check_explicit_map(config, placement.device_map, name)
    dtype = resolve_dtype(dtype_name, device, checkpoint_dtype(config, default_model=spec is None))
    if local:
        check_tokenizer_files(Path(source))
    stored = stored_quantization(config)
    if stored is not None:
        if quantize:
            raise UserError(f"model {name!r} is already quantized ({stored}, config.json); drop --quantize {quantize}")
        check_stored(name, stored)
    load: dict[str, Any] = placement.kwargs() if placement is not None else {}
    if tensor_parallel:
        load.update(tensor_parallel_plan())
    if quantize:
        load["quantization_config"] = quantization_config(quantize, dtype)
        load.setdefault("device_map", {"": str(device)})  # quantized weights are made in place
    try:
        tokenizer, model = read_weights(source, config, dtype, name, **load)
    except (RuntimeError, NotImplementedError, AssertionError) as exc:
        if not quantize or isinstance(exc, torch.OutOfMemoryError):
            raise
        raise UserError(f"--quantize {quantize} cannot run on {device} here ({first_line(exc)})") from exc
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
    if quantize:
        check_quantized_forward(model, device, quantize)
    if emulated_bf16(device, dtype) and not quantize and stored is None:
        upcast_wide_products(model)
    model.eval()
    from llmsample.models.compiled import CompiledSteps

    compiled = CompiledSteps(model, str(cache_home() / "inductor")) if compile else None
    return LoadedModel(
        model, tokenizer, name, device, dtype, compiled, tensor_parallel,
        placed_on=placed, quantization=quantize or stored,
    )  # fmt: skip


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


def transformers_version() -> str:
    import transformers

    return transformers.__version__


def _mismatch_message(name: str, detail: str) -> str:
    return (
        f"the weights of model {name!r} do not match its config.json ({detail}); "
        "use the config.json saved with these weights, or save the model again"
    )


def _not_found_message(name: str, exc: Exception) -> str:
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")
    first = first_line(exc)
    how = (
        "HF_HUB_OFFLINE is set: unset it to download, or pass a local directory"
        if offline
        else "check the id and your network (or set HF_HOME to a cache that has it), or pass a local directory"
    )
    return f"cannot load model {name!r} from a local directory or the Hugging Face hub ({first}); {how}"
