"""Reading a checkpoint folder for llmsample's own forward (``--backend torch``,
:mod:`llmsample.models.native_llama`) without transformers: config.json and generation_config.json as
plain JSON (:class:`~llmsample.models.llamacpp_load.KeptConfig`), the tokenizer with ``tokenizers``
(:mod:`llmsample.models.fast_tokenizer`), the weights from safetensors by their own names, refused
in the transformers path's words (:mod:`llmsample.models.checkpoint`) when they do not fit.
Whether ``--backend auto`` picks it: :mod:`llmsample.models.plan`."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmsample.errors import UserError, first_line
from llmsample.models.checkpoint import mismatch_message
from llmsample.models.gguf_to_hf import DEFAULT_MODEL, is_complete_conversion, models_dir
from llmsample.models.llamacpp_load import KeptConfig, checkpoint_folder

if TYPE_CHECKING:
    import torch

    from llmsample.models.fast_tokenizer import FastTokenizer
    from llmsample.models.native_llama import NativeCausalLM

TORCH_ONLY_FOR = "--compile, --quantize, --device-map and --tp"
OWN_TOKENIZER_CLASS = {"qwen2": "Qwen2Tokenizer"}
"""Model types whose tokenizer transformers 5 builds with a class of their own whatever
tokenizer_config.json names (``MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS``): not ``tokenizers``'
reading of tokenizer.json, so not :mod:`llmsample.models.fast_tokenizer`'s."""


def check_torch(spec: str | None, device: torch.device, simple: bool) -> None:
    """An explicit ``--backend torch`` that cannot run here, in one line (the model itself is
    checked as it is read: :func:`read_native`)."""
    if spec is not None and native_folder(spec) is None:
        raise UserError(
            f"--backend torch runs local checkpoint folders and the default model, and {spec!r} is neither; "
            "give --model FOLDER, leave out --model, or use --backend transformers"
        )
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"--backend torch runs on the CPU or CUDA, not {device}; use --backend transformers")
    if not simple:
        raise UserError(f"--backend torch runs the checkpoint as it is: {TORCH_ONLY_FOR} are transformers' "
                        "(use --backend transformers)")  # fmt: skip


def native_folder(spec: str | None) -> Path | None:
    """The checkpoint folder ``spec`` names: a local folder, or for the default model its converted
    folder once the conversion is there (None before: the transformers path converts it)."""
    if spec is None:
        target = models_dir() / DEFAULT_MODEL
        return target if is_complete_conversion(target) else None
    return checkpoint_folder(spec)


def problem(folder: Path) -> str | None:
    """Why the native forward would not run ``folder`` as transformers does (None: it would)."""
    from llmsample.models.native_llama import shape_of

    try:
        config = read_json_config(folder / "config.json")
        shape_of(config)
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        return first_line(exc) if not isinstance(exc, OSError) else f"cannot read its config.json ({first_line(exc)})"
    if weight_files(folder) is None:
        return "its weights are not safetensors"
    if config.model_type in OWN_TOKENIZER_CLASS:
        return f"its tokenizer is transformers' {OWN_TOKENIZER_CLASS[config.model_type]}, rebuilt from the vocabulary"
    if tokenizer_of(folder) is None:
        return "its tokenizer needs transformers' own classes"
    return None


def read_json_config(path: Path) -> KeptConfig:
    """config.json as attributes; ValueError for a file that is no JSON object."""
    return KeptConfig.read(path)


def weight_files(folder: Path) -> list[Path] | None:
    """The safetensors files of ``folder`` (one, or the shards its index names); None without them."""
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return None
    try:
        names = json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return [folder / name for name in sorted(set(names))]


def tokenizer_of(folder: Path) -> FastTokenizer | None:
    """The folder's tokenizer read without transformers, or None where it cannot be exactly;
    read once per version of its files (the backend choice and the load both ask)."""
    stamps = tuple(_stamp(folder / name) for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"))
    return _tokenizer(str(folder), stamps)


def _stamp(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return -1


@functools.lru_cache(maxsize=4)
def _tokenizer(folder: str, stamps: tuple[int, ...]) -> FastTokenizer | None:
    from llmsample.models.fast_tokenizer import fast_tokenizer

    return fast_tokenizer(Path(folder))


def read_native(folder: Path, name: str, dtype: torch.dtype) -> tuple[NativeCausalLM, FastTokenizer]:
    """The model (on the CPU, in ``dtype``) and tokenizer of ``folder``, or one line saying why not."""
    config = read_json_config(folder / "config.json")
    heads, hidden = getattr(config, "num_attention_heads", 1), getattr(config, "hidden_size", 0)
    if isinstance(heads, int) and isinstance(hidden, int) and heads and hidden % heads:
        detail = f"ValueError: The hidden size ({hidden}) is not a multiple of the number of attention heads ({heads})."
        raise UserError(mismatch_message(name, detail))  # as transformers' config class says it
    why = problem(folder)
    if why is not None:
        raise UserError(f"cannot run {name} on --backend torch: {why}; use --backend transformers")
    tokenizer = tokenizer_of(folder)
    assert tokenizer is not None  # problem() said so
    generation = folder / "generation_config.json"
    try:
        generation_config = KeptConfig.read(generation) if generation.is_file() else None
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {generation} ({first_line(exc)}); save the model again") from exc
    if generation_config is None:  # transformers derives one from the model's config
        generation_config = KeptConfig({"eos_token_id": getattr(config, "eos_token_id", None)})
    return build(folder, name, config, generation_config, dtype), tokenizer


def build(folder: Path, name: str, config: Any, generation_config: Any, dtype: torch.dtype) -> NativeCausalLM:
    """The model made without memory (meta), then given the checkpoint's tensors in ``dtype``."""
    import torch

    from llmsample.models.native_llama import NativeCausalLM, rope_frequencies, shape_of

    shape = shape_of(config)
    with torch.device("meta"), uninitialised():
        model = NativeCausalLM(shape, config, generation_config)
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    if shape.tied:
        del expected["lm_head.weight"]
    state = read_tensors(folder, name, expected)
    model.load_state_dict({key: state[key].to(dtype) for key in expected}, strict=False, assign=True)
    model.model.inv_freq = rope_frequencies(shape)
    model.tie_weights()
    return model.eval()


@contextlib.contextmanager
def uninitialised() -> Iterator[None]:
    """Linear and embedding layers made without their random initialisation, which the weights
    replace: on the meta device its first call costs seconds of torch's lazy machinery."""
    from torch import nn

    kept = nn.Linear.reset_parameters, nn.Embedding.reset_parameters
    nn.Linear.reset_parameters = nn.Embedding.reset_parameters = lambda self: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Linear.reset_parameters, nn.Embedding.reset_parameters = kept  # type: ignore[method-assign]


def read_tensors(folder: Path, name: str, expected: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """The checkpoint's tensors that ``expected`` names; a missing one or one of another shape is
    the transformers path's line (the rest, like transformers, left unread)."""
    from safetensors import SafetensorError, safe_open

    files = weight_files(folder) or []
    state: dict[str, Any] = {}
    try:
        for path in files:
            with safe_open(str(path), framework="pt") as opened:
                for key in opened.keys():  # noqa: SIM118  (safe_open has keys(), no iteration)
                    if key in expected:
                        state[key] = opened.get_tensor(key)
    except (SafetensorError, OSError) as exc:
        raise UserError(
            f"cannot read the weights of {name!r} ({first_line(exc)}); the file is incomplete or corrupt: "
            "download or save it again"
        ) from exc
    wrong = sorted(key for key, tensor in state.items() if tuple(tensor.shape) != expected[key])
    if wrong:
        key = wrong[0]
        raise UserError(
            mismatch_message(
                name, f"{key} is {list(state[key].shape)} in the weights, {list(expected[key])} by config.json"
            )
        )
    missing = sorted(expected.keys() - state.keys())
    if missing:
        raise UserError(mismatch_message(name, f"{len(missing)} weights are missing, e.g. {missing[0]}"))
    return state
