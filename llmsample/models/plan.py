"""Which backend runs a model, decided in one place and said why (``--verbose``), as llama.cpp
and vLLM each pick in one place: ``--backend auto`` walks one ordered table (:data:`AUTO`),
the first backend whose rule holds runs it; an explicit ``--backend`` that cannot run is one
line saying why. The files each backend derives (the GGUF and its type, the converted
safetensors, the tokenizer sidecar) are its loader's: :mod:`llmsample.models.loading`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmsample.errors import UserError
from llmsample.models import llamacpp_load, native_checkpoint

if TYPE_CHECKING:
    from pathlib import Path

    import torch

ON_LLAMA_CPP = (
    "--layers reads the model's hidden states, which the llama.cpp backend does not expose; "
    "run it with --backend transformers"
)


@dataclass(frozen=True)
class Asked:
    """What decides the backend: ``--backend``, the model (None: the default model), the device,
    whether ``--dtype`` was given (llama.cpp runs its file's own), ``simple`` (none of --compile,
    --quantize, --device-map, --tp: transformers' own) and ``layers`` (``explain --layers``
    reads every layer's hidden states)."""

    backend: str
    spec: str | None
    device: torch.device
    dtype_given: bool = False
    simple: bool = True
    layers: bool = False


@dataclass(frozen=True)
class Plan:
    backend: str  # llama.cpp, torch or transformers
    why: str  # one line, for --verbose


def _llama_cpp(asked: Asked) -> str | None:
    if asked.layers or not asked.simple or asked.dtype_given or asked.device.type != "cpu":
        return None
    if not llamacpp_load.installed():
        return None
    if asked.spec is None:
        return "the default model's GGUF, rewritten at F16, on the CPU with llama-cpp-python installed"
    if llamacpp_load.gguf_file(asked.spec) is not None:
        return "a GGUF file, on the CPU with llama-cpp-python installed"
    folder = llamacpp_load.checkpoint_folder(asked.spec)
    if folder is not None and _unconvertible(folder) is None:
        return "a local checkpoint llama.cpp runs once written to GGUF, on the CPU with llama-cpp-python installed"
    return None


def _torch(asked: Asked) -> str | None:
    if asked.layers or not asked.simple or asked.device.type != "cpu":
        return None
    folder = native_checkpoint.native_folder(asked.spec)
    if folder is None or native_checkpoint.problem(folder) is not None:
        return None
    lacking = "llama-cpp-python is not installed" if not llamacpp_load.installed() else "llama.cpp does not run it"
    return f"a local checkpoint llmsample's own torch forward runs on the CPU ({lacking})"


def _transformers(asked: Asked) -> str:
    if asked.layers:
        return "explain --layers reads the hidden states, which transformers exposes"
    if not asked.simple:
        return "--compile, --quantize, --device-map and --tp are transformers' own"
    if asked.device.type != "cpu":
        return f"on {asked.device}, what runs there"
    return "what neither llama.cpp nor llmsample's torch forward runs here (a hub id, custom code, a new architecture)"


AUTO: tuple[tuple[str, Callable[[Asked], str | None]], ...] = (
    ("llama.cpp", _llama_cpp),
    ("torch", _torch),
    ("transformers", _transformers),
)
"""``--backend auto``, in order: the first rule that gives a reason runs the model."""


def plan(asked: Asked) -> Plan:
    """The backend that runs ``asked.spec`` and why; an explicit one that cannot run raises
    ``UserError`` in one line."""
    if asked.backend == "auto":
        for backend, rule in AUTO:
            why = rule(asked)
            if why is not None:
                return Plan(backend, why)
    if asked.backend == "llama.cpp":
        _check_llama_cpp(asked)
    elif asked.backend == "torch":
        native_checkpoint.check_torch(asked.spec, asked.device, asked.simple)
    return Plan(asked.backend, "asked for (--backend, or LLMSAMPLE_BACKEND)")


def draft_load(spec: str, target_backend: str, sample_device: torch.device, dtype: torch.dtype) -> tuple[str, str, str]:
    """How ``--draft MODEL`` loads (device, dtype, backend): a GGUF beside a target sampling on
    the CPU on llama.cpp where it is installed (``auto``); else on the device the target samples
    on (its input device when it is placed over several), in its dtype, on torch where a torch
    target's draft can run, else transformers."""
    if llamacpp_load.gguf_file(spec) is not None and sample_device.type == "cpu":
        return "cpu", "auto", "auto"
    return str(sample_device), str(dtype).removeprefix("torch."), "auto" if target_backend == "torch" else "transformers"


def _check_llama_cpp(asked: Asked) -> None:
    spec = asked.spec
    folder = llamacpp_load.checkpoint_folder(spec)
    if asked.layers:
        raise UserError(ON_LLAMA_CPP)
    if llamacpp_load.gguf_file(spec) is None and folder is None:
        raise UserError(
            f"--backend llama.cpp runs GGUF files and local checkpoints, and {spec!r} is neither; "
            "give --model FILE.gguf or a checkpoint folder, or leave out --model for the default model"
        )
    why = _unconvertible(folder) if folder is not None else None
    if why is not None:
        raise UserError(f"cannot run {spec} on llama.cpp: {why}; use --backend transformers")
    if not llamacpp_load.installed():
        raise UserError(f"--backend llama.cpp needs llama-cpp-python, which is not installed: {llamacpp_load.EXTRA}")
    if asked.device.type != "cpu":
        raise UserError(f"--backend llama.cpp runs on the CPU here, not {asked.device}; drop --device or the backend")
    if not asked.simple or asked.dtype_given:
        raise UserError(
            "--backend llama.cpp runs the GGUF's own weights: --dtype, --compile, --quantize, --device-map "
            "and --tp are transformers' (use --backend transformers)"
        )


def _unconvertible(folder: Path) -> str | None:
    from llmsample.models.hf_to_gguf import unconvertible

    return unconvertible(folder)
