"""The bias epilogue of a GEMM whose cuBLAS call takes no bias: ``kernels/gemm_epilogue.cu``.

``torch._scaled_mm`` takes no bias with FP8 block scales, so those Linear+Bias GEMMs write fp32 and
:func:`add_bias_and_round` finishes them: bit for bit ``(wide + bias.float()).to(target)``, the
reference's arithmetic (one fp32 add, one rounding), in one pass instead of torch's add into a
second fp32 buffer and a cast.
"""

from __future__ import annotations

import torch

from ._cuda import i64, ptr
from ._quantize_launch import _SUFFIX, _grid, _run

__all__ = ["add_bias_and_round"]


def add_bias_and_round(wide: torch.Tensor, bias: torch.Tensor, target: torch.dtype) -> torch.Tensor:
    """``(wide + bias.float()).to(target)`` for an fp32 ``wide`` and a ``bias`` of its last dim. A 16-bit
    ``target`` with a bias of that dtype or fp32 on a contiguous ``wide`` whose rows hold a multiple of 4
    values is one kernel pass; anything else is torch's two steps."""
    cols = wide.shape[-1] if wide.dim() else 0
    fits = (target in (torch.bfloat16, torch.float16) and bias.dtype in (target, torch.float32)
            and wide.dtype == torch.float32 and wide.is_contiguous() and bias.is_contiguous()
            and cols > 0 and cols % 4 == 0 and wide.numel() > 0 and wide.data_ptr() % 16 == 0)
    if not fits:
        return (wide + bias.float()).to(target)
    out = torch.empty(wide.shape, dtype=target, device=wide.device)
    quads = wide.numel() // 4
    _run("gemm_epilogue.cu", f"bias_add_round_{_SUFFIX[target]}_{_SUFFIX[bias.dtype]}", _grid(quads, wide.device), 256,
         (ptr(wide), ptr(bias), ptr(out), i64(wide.numel() // cols), i64(cols)), wide.device)
    return out
