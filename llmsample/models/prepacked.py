"""bf16 linear layers on a CPU with bf16 arithmetic, their weights reordered for oneDNN once.

``F.linear`` hands oneDNN a bf16 weight in PyTorch's row-major layout, and oneDNN reorders it
into its blocked layout on every call: for a decode step's one row that reorder is most of the
product. Reordered once at load (what torch.compile's freezing does for its CPU graphs), the
same kernel computes the same values, bit for bit, in less time. Measured here (2-core AVX512-BF16
EPYC, torch 2.13, one row): 576×576 42.8 → 27.2 µs, 1536×576 117 → 48 µs, the 49152×576 LM head
4.5 → 2.4 ms; 16 rows 1.3–2.0×, a 300-token prefill 1.1–1.3×.

A reordered weight is an opaque oneDNN tensor that replaces the layer: its plain weight is freed
(memory stays as it was) unless another module holds it too, as a tied LM head's embedding does
(the default model then holds its 56 MB head twice)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class PrepackedLinear(nn.Module):
    """``nn.Linear`` with its weight in oneDNN's layout (``packed``); inference only."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # A parameter, so that what counts a model's weights (the benchmarks' bytes a step) sees it.
        self.packed = nn.Parameter(
            torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 1), requires_grad=False
        )
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def prepacks(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this device and dtype gain from reordered weights: bf16 on a CPU whose oneDNN has
    native bf16 kernels (AVX512-BF16 or AMX; elsewhere :mod:`llmsample.models.precision`)."""
    from llmsample.models.device import native_bf16_cpu

    return (
        device.type == "cpu"
        and dtype == torch.bfloat16
        and native_bf16_cpu()
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def prepack_linears(model: nn.Module) -> int:
    """Replace every plain bf16 ``nn.Linear`` of ``model`` by a :class:`PrepackedLinear`, in place;
    returns how many. Where the first layer's output on a probe row differs from ``F.linear``'s (a
    oneDNN that computes otherwise, or refuses), the model is left as it is."""
    linears = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear and child.weight.dtype == torch.bfloat16 and child.weight.device.type == "cpu"
    ]
    if not linears or not _same_output(linears[0][2]):
        return 0
    for parent, name, linear in linears:
        setattr(parent, name, PrepackedLinear(linear))  # the plain weight goes with the layer unless held elsewhere
    return len(linears)


@torch.inference_mode()
def _same_output(linear: nn.Linear) -> bool:
    """Whether a probe row through ``linear`` reordered gives ``F.linear``'s output (False where
    this oneDNN refuses the reordered ops)."""
    probe = torch.randn(2, linear.in_features, generator=torch.Generator().manual_seed(0)).to(linear.weight.dtype)
    try:
        return torch.equal(linear(probe), PrepackedLinear(linear)(probe))
    except RuntimeError:
        return False
