"""The emulated NVFP4 GEMM: a fixed-order sum over 16-element scale blocks.

The order is ``docs/recipes/nvfp4.md#the-fixed-order-gemm``.
"""

from __future__ import annotations

import torch

from ...formats import E4M3, e2m1_to_fp32, unpack_e2m1
from ...layouts import NVFP4_BLOCK_SIZE as BLOCK
from .nvfp4_scales import fl

__all__ = ["nvfp4_gemm_reference"]


def nvfp4_gemm_reference(
    a_data: torch.Tensor,
    a_scale: torch.Tensor,
    a_amax: torch.Tensor,
    b_data: torch.Tensor,
    b_scale: torch.Tensor,
    b_amax: torch.Tensor,
    *,
    out_dtype: torch.dtype = torch.float32,
    a_e4m3_max: float = 448.0,
    b_e4m3_max: float = 448.0,
) -> torch.Tensor:
    """Emulated NVFP4 GEMM ``y = Â @ B̂ᵀ``, both operands blocked along the contraction dim K.

    ``a_data`` ``(M, K/2)`` and ``b_data`` ``(N, K/2)`` with compact-or-padded
    scales and amax ``(1,)`` or per row (``(M,)`` / ``(N,)``). Fixed order:

    1. for each 16-block ``k`` in ascending order:
       ``p = e2m1(qa_k) @ e2m1(qb_k)ᵀ`` (exact: products are multiples of 1/4,
       ``|p| <= 576``), ``y = RN(y + RN(RN(sa_k ⊗ sb_k) * p))``, starting at ``y = 0``;
    2. ``alpha = RN(RN(A_a ⊗ A_b) * fl(1/(36 * E_a * E_b)))`` and ``y = RN(alpha * y)``;
    3. one cast to ``out_dtype``.
    """
    m, n = a_data.shape[0], b_data.shape[0]
    k = a_data.shape[1] * 2
    if b_data.shape[1] * 2 != k or k % BLOCK != 0:
        raise ValueError(
            f"nvfp4_gemm_reference: operands must share K (a multiple of {BLOCK}), "
            f"got a {tuple(a_data.shape)} and b {tuple(b_data.shape)} packed"
        )
    n_blocks = k // BLOCK
    qa = e2m1_to_fp32(unpack_e2m1(a_data)).double()
    qb = e2m1_to_fp32(unpack_e2m1(b_data)).double()
    sa = E4M3.to_fp32(a_scale[:m, :n_blocks].contiguous())
    sb = E4M3.to_fp32(b_scale[:n, :n_blocks].contiguous())
    y = torch.zeros(m, n, dtype=torch.float32, device=a_data.device)
    for blk in range(n_blocks):
        cols = slice(blk * BLOCK, (blk + 1) * BLOCK)
        partial = (qa[:, cols] @ qb[:, cols].t()).to(torch.float32)
        y = y + (sa[:, blk, None] * sb[None, :, blk]) * partial
    amax_product = a_amax.to(torch.float32).reshape(-1, 1) * b_amax.to(torch.float32).reshape(1, -1)
    alpha = amax_product * fl(1.0 / (36.0 * a_e4m3_max * b_e4m3_max), y)
    return (alpha * y).to(out_dtype)
