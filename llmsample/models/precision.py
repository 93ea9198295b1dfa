"""bfloat16 weights on a CPU without bfloat16 arithmetic (anything but x86 with AVX512-BF16 or AMX).

A one-row matmul (the decode step) is bound by memory bandwidth, so half-size bf16 weights
make it faster. A many-row matmul (the prompt's prefill) is bound by arithmetic, and there
oneDNN's emulated bf16 GEMM is 5–9× slower than float32's for 30–150 rows (docs/history/2026-11.md). The linear layers
therefore compute products of ``WIDE_ROWS`` rows or more in float32, from a copy of their weight
upcast on the fly. Weights stay bf16 in memory; only the arithmetic of wide products changes."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

WIDE_ROWS = 16
"""Upcast + float32 GEMM beats bf16 GEMM from ~8 rows for a 576×1536 weight, and from ~30 for
the 49152-row LM head (its upcast writes 113 MB); prefill asks the LM head for one row only."""


def emulated_bf16(device: torch.device, dtype: torch.dtype) -> bool:
    """True where bf16 GEMM has no hardware support: the case this module is for."""
    from llmsample.models.device import native_bf16_cpu

    return device.type == "cpu" and dtype == torch.bfloat16 and not native_bf16_cpu()


class WideFloat32Linear(nn.Linear):
    """``nn.Linear`` whose wide products run in float32; narrow ones are untouched."""

    def forward(self, x: Tensor) -> Tensor:
        if x.numel() < WIDE_ROWS * x.shape[-1]:
            return super().forward(x)
        bias = None if self.bias is None else self.bias.float()
        return F.linear(x.float(), self.weight.float(), bias).to(x.dtype)


def upcast_wide_products(model: nn.Module) -> int:
    """Switch every plain ``nn.Linear`` of ``model`` to ``WideFloat32Linear`` in place (same
    parameters, tied ones included); returns how many."""
    linears = [m for m in model.modules() if type(m) is nn.Linear]
    for module in linears:
        module.__class__ = WideFloat32Linear
    return len(linears)
