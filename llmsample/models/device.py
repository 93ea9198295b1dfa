"""Which device and dtype a run uses."""

from __future__ import annotations

from typing import TYPE_CHECKING

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


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on CUDA (float16 without bf16 support); float32 elsewhere. On a CPU
    without native bf16 (AVX2), bf16 decodes ~20% faster per token but prefills ~7x slower and
    verifies speculative drafts slower (measured, see README), so float32 wins overall."""
    import torch

    if name != "auto":
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32
