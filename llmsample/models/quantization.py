"""Quantized models through transformers' quantization configs: ``--quantize int8|int4`` quantizes
full-precision weights while they load, and checkpoints stored quantized (GPTQ, AWQ, torchao,
bitsandbytes in ``config.json``) load as they are. One library per scheme, each one that runs on
a CPU as well as on CUDA:

- ``int8``: torchao's int8 weight-only (per-channel scales; activations stay in the model dtype).
- ``int4``: bitsandbytes' 4-bit NF4 (blocks of 64 weights, one scale each; computed in the model
  dtype). torchao's int4 weight-only needs CUDA (tinygemm) or its mslk kernels, so it is not used.

Both libraries are the optional extra ``llmsample[quant]``; without it, one line says so."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmsample.errors import UserError

if TYPE_CHECKING:
    import torch

EXTRA = "pip install 'llmsample[quant]'"


@dataclass(frozen=True)
class Scheme:
    name: str
    library: str  # the importable module
    description: str


SCHEMES = {
    "int8": Scheme("int8", "torchao", "torchao int8 weight-only"),
    "int4": Scheme("int4", "bitsandbytes", "bitsandbytes 4-bit NF4"),
}

# Checkpoints stored quantized: quant_method in config.json -> what transformers needs to load them.
STORED = {
    "gptq": ("GPTQ", ("gptqmodel", "optimum")),
    "awq": ("AWQ", ("gptqmodel",)),
    "torchao": ("torchao", ("torchao",)),
    "bitsandbytes": ("bitsandbytes", ("bitsandbytes",)),
    "compressed-tensors": ("compressed-tensors", ("compressed_tensors",)),
}


def library_available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules: blocked
        return False


def quantization_config(scheme_name: str, dtype: torch.dtype) -> Any:
    """transformers' config for ``--quantize``; the missing library is one line naming the extra."""
    scheme = SCHEMES[scheme_name]
    if not library_available(scheme.library):
        raise UserError(
            f"--quantize {scheme.name} needs {scheme.library} ({scheme.description}), which is not installed; "
            f"install the extra: {EXTRA}"
        )
    if scheme.name == "int8":
        from torchao.quantization import Int8WeightOnlyConfig
        from transformers import TorchAoConfig

        return TorchAoConfig(Int8WeightOnlyConfig())
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype)


def stored_quantization(config: Any) -> str | None:
    """The quant_method of a checkpoint stored quantized, or None."""
    quantization = getattr(config, "quantization_config", None)
    if quantization is None:
        return None
    method = (
        quantization.get("quant_method")
        if isinstance(quantization, dict)
        else getattr(quantization, "quant_method", None)
    )
    return None if method is None else str(getattr(method, "value", method))


def check_stored(name: str, method: str) -> None:
    """A stored-quantized checkpoint whose library is missing: one line naming it."""
    label, libraries = STORED.get(method, (method, ()))
    missing = [lib for lib in libraries if not library_available(lib)]
    if missing:
        packages = " ".join(lib.replace("_", "-") for lib in missing)
        raise UserError(
            f"model {name!r} is stored quantized with {label} (config.json), which needs {' and '.join(missing)}; "
            f"install it: pip install {packages}"
        )
