"""Which device and dtype a run uses."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llmsample.errors import UserError

if TYPE_CHECKING:
    import torch


def resolve_device(name: str) -> torch.device:
    """``auto``: CUDA, then MPS, then CPU."""
    import torch

    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise UserError(f"--device {name!r} is not a device; use auto, cpu, cuda, cuda:N or mps") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"--device {name}: CUDA is not available on this machine; use --device cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s); pick a lower index")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"--device {name}: MPS is not available on this machine; use --device cpu or auto")
    if device.type not in ("cpu", "cuda", "mps"):
        raise UserError(f"--device {name!r} is not supported; use auto, cpu, cuda, cuda:N or mps")
    return device


HALF = ("bfloat16", "float16")


def checkpoint_dtype(config: Any, default_model: bool = False) -> str | None:
    """The dtype a checkpoint was saved in, as its config.json records it (``dtype``, or
    ``torch_dtype`` before transformers 4.56): a name like ``"bfloat16"``, or None. The default
    model is upstream's (bf16) whatever a conversion from before it was recorded says (float32,
    the dtype its dequantized weights are stored in)."""
    if default_model:
        from llmsample.models.gguf_to_hf import DEFAULT_DTYPE

        return DEFAULT_DTYPE
    for key in ("dtype", "torch_dtype"):
        value = getattr(config, key, None)
        if value is not None:
            return str(value).removeprefix("torch.")
    return None


def native_bf16_cpu() -> bool:
    """x86 with AVX512-BF16 or AMX: bf16 GEMM in hardware (elsewhere oneDNN emulates it)."""
    import torch

    native = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in native)


def resolve_dtype(name: str, device: torch.device, checkpoint: str | None = None) -> torch.dtype:
    """``auto``: the checkpoint's own dtype (``checkpoint``, from its config) where the device
    computes it natively and fast, float32 elsewhere, as transformers' ``dtype="auto"`` would
    without the slow cases:

    - CUDA: a bf16 checkpoint runs in bf16 (fp16 on GPUs without bf16), an fp16 one in fp16;
    - CPU: a bf16 checkpoint runs in bf16 only with bf16 arithmetic in hardware (AVX512-BF16,
      AMX). Emulated bf16 (AVX2) decodes ~20% faster but prefills ~7x slower and verifies
      speculative drafts slower (README), so float32 wins there; fp16 is float32 on every CPU;
    - MPS, and a float32 checkpoint or one that does not say: float32."""
    import torch

    if name != "auto":
        return getattr(torch, name)
    if checkpoint in HALF and device.type == "cuda":
        if checkpoint == "bfloat16" and not torch.cuda.is_bf16_supported():
            return torch.float16
        return getattr(torch, checkpoint)
    if checkpoint == "bfloat16" and device.type == "cpu" and native_bf16_cpu():
        return torch.bfloat16
    return torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: how summaries and results name a dtype."""
    return str(dtype).removeprefix("torch.")
