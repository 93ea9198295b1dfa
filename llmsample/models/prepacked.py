"""Linear layers on a CPU with their weights reordered into oneDNN's blocked layout once, at load.

bf16 (on a CPU with bf16 arithmetic): ``F.linear`` hands oneDNN a bf16 weight in PyTorch's
row-major layout, and oneDNN reorders it into its blocked layout on every call: for a decode
step's one row that reorder is most of the product. Reordered once (what torch.compile's freezing
does for its CPU graphs), the same kernel computes the same values, bit for bit, in less time.
Measured here (2-core AVX512-BF16 EPYC, torch 2.13, one row): 576×576 42.8 → 27.2 µs, 1536×576
117 → 48 µs, the 49152×576 LM head 4.5 → 2.4 ms; 16 rows 1.3–2.0×, a 300-token prefill 1.1–1.3×.

float32: ``F.linear`` goes to MKL, whose products of a few rows run far under the machine's
bandwidth (the default model's head: 10–12 ms for one row, 19–24 ms for 16). oneDNN's own
float32 kernel on the reordered weight: 5.0–5.3 and 6.6–6.9 ms, the other layers 1.1–3× faster
at 1–16 rows, level at 300 (the same on this CPU with oneDNN and MKL held to AVX2). The values
are not MKL's bit for bit: another summation order, differing in float32's last bits, as MKL's
own results differ with the number of rows in the product.

A reordered weight is an opaque oneDNN tensor that replaces the layer: its plain weight is freed
(memory stays as it was) unless another module holds it too, as a tied LM head's embedding does
(the default model then holds its head twice: 56 MB in bf16, 113 MB in float32)."""

from __future__ import annotations

import platform

import torch
from torch import Tensor, nn

ROWS_HINT = 16
"""The rows oneDNN picks its layout for: any count runs on it; for float32 16 ran 1–16 rows as fast
as a layout for one row or faster (up to 2× at 2–3 rows), for bf16 the layout was the same."""
DTYPES = (torch.float32, torch.bfloat16)


class PrepackedLinear(nn.Module):
    """``nn.Linear`` with its weight in oneDNN's layout (``packed``); inference only."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # A parameter, so that what counts a model's weights (the benchmarks' bytes a step) sees it.
        self.packed = nn.Parameter(
            torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), ROWS_HINT), requires_grad=False
        )
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def prepacks(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this device and dtype gain from reordered weights: float32 on an x86 CPU with oneDNN
    (measured with AVX512 and AVX2; ARM's oneDNN runs other kernels, not measured), and bf16 where
    its kernels are native (AVX512-BF16 or AMX; elsewhere :mod:`llmsample.models.precision`)."""
    from llmsample.models.device import native_bf16_cpu

    return (
        device.type == "cpu"
        and ((dtype == torch.float32 and x86()) or (dtype == torch.bfloat16 and native_bf16_cpu()))
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def x86() -> bool:
    """An x86-64 CPU, where oneDNN's float32 kernels were measured against MKL's."""
    return platform.machine().lower() in ("x86_64", "amd64")


def prepack_linears(model: nn.Module) -> int:
    """Replace every plain float32 or bf16 ``nn.Linear`` of ``model`` by a :class:`PrepackedLinear`,
    in place; returns how many. Where the first layer of a dtype gives other output on probe rows
    than ``F.linear`` (a oneDNN that computes otherwise, or refuses), the model is left as it is."""
    linears = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear and child.weight.dtype in DTYPES and child.weight.device.type == "cpu"
    ]
    first_of_each_dtype = {linear.weight.dtype: linear for _, _, linear in reversed(linears)}
    if not linears or not all(_same_output(linear) for linear in first_of_each_dtype.values()):
        return 0
    for parent, name, linear in linears:
        setattr(parent, name, PrepackedLinear(linear))  # the plain weight goes with the layer unless held elsewhere
    return len(linears)


@torch.inference_mode()
def _same_output(linear: nn.Linear) -> bool:
    """Whether probe rows through ``linear`` reordered give ``F.linear``'s output: bit for bit in
    bf16, within float32's rounding (a relative 1e-4 of the largest output) in float32. False
    where this oneDNN refuses the reordered ops."""
    probe = torch.randn(2, linear.in_features, generator=torch.Generator().manual_seed(0)).to(linear.weight.dtype)
    try:
        plain, packed = linear(probe), PrepackedLinear(linear)(probe)
    except RuntimeError:
        return False
    if plain.dtype == torch.bfloat16:
        return torch.equal(plain, packed)
    return bool((plain - packed).abs().max() <= 1e-4 * plain.abs().max())
