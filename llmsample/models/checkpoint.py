"""Reading a checkpoint (hub id or local directory): its config, tokenizer and weights, refusing
in one line whatever would not decode: encoders, missing tokenizer files, weights that do not
match their config, unknown architectures, a hub that cannot be reached."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmsample.errors import UserError, first_line
from llmsample.models.gguf_to_hf import DEFAULT_HUB_ID, WEIGHT_FILES

if TYPE_CHECKING:
    import torch

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
)


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
        raise UserError(mismatch_message(name, str(exc).strip().splitlines()[-1].strip())) from exc
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
            mismatch_message(name, f"{key} is {list(saved)} in the weights, {list(expected)} by config.json")
        )
    if info["missing_keys"]:  # transformers would initialise them at random
        missing = sorted(info["missing_keys"])
        raise UserError(mismatch_message(name, f"{len(missing)} weights are missing, e.g. {missing[0]}"))
    return tokenizer, model


def transformers_version() -> str:
    import transformers

    return transformers.__version__


def mismatch_message(name: str, detail: str) -> str:
    """The one line for weights that do not fit their config.json, from either loader."""
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
