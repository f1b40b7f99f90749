"""The reference GEMM: IEEE fp32 products and sums, one rounding to the output dtype."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

__all__ = ["gemm_fp32", "epilogue_fp32"]


@contextlib.contextmanager
def _ieee_fp32(device: torch.device) -> Iterator[None]:
    """TF32 would change the reference's numbers, so it is off for the duration."""
    if device.type != "cuda":
        yield
        return
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def gemm_fp32(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    alpha: float,
    out: torch.Tensor | None,
    accumulate: bool,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``alpha * a @ b (+ out) (+ bias)`` in fp32 (operands already in the orientation to multiply; ``bias``
    1-D, one value per column of the result, added to every row)."""
    if a.is_cuda:
        with _ieee_fp32(a.device):
            result = torch.matmul(a.float(), b.float())
    else:  # TF32 is a CUDA setting: nothing to switch off
        result = torch.matmul(a.float(), b.float())
    return epilogue_fp32(result, alpha=alpha, out=out, accumulate=accumulate, bias=bias)


def epilogue_fp32(
    result: torch.Tensor,
    *,
    alpha: float,
    out: torch.Tensor | None,
    accumulate: bool,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """``alpha * result (+ out) (+ bias)`` in fp32, before the one rounding to the output dtype (cuBLASLt's
    epilogue order: scale, accumulate, bias)."""
    if alpha != 1.0:
        result = result * alpha
    if accumulate:
        if out is None:
            raise ValueError("gemm: accumulate=True needs an `out` tensor to accumulate into")
        result = result + out.float()
    if bias is not None:
        if bias.dim() != 1 or bias.shape[0] != result.shape[-1]:
            raise ValueError(f"gemm: bias must be 1-D with {result.shape[-1]} elements (the result's columns), "
                             f"got shape {tuple(bias.shape)}")
        result = result + bias.float()
    return result
