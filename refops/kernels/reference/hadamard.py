"""The random Hadamard transform (RHT) NVFP4 applies to column-wise wgrad operands (``docs/recipes/nvfp4.md``)."""

from __future__ import annotations

import torch

__all__ = ["RHT_SIGN_VECTOR", "rht_matrix_16", "hadamard_transform_16"]

BLOCK = 16
#: Fixed RHT signs s_i (TE's ``get_wgrad_sign_vector``).
RHT_SIGN_VECTOR = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)


def rht_matrix_16(*, random_sign_mask: bool, device: torch.device | str | None = None) -> torch.Tensor:
    """The RHT matrix ``diag(s) * H16 * 0.25`` in bf16 (entries exactly ±0.25).

    ``H16[i, j] = (-1)^popcount(i & j)`` (Sylvester); ``s`` is
    :data:`RHT_SIGN_VECTOR`, or all ones when ``random_sign_mask`` is False.
    """
    idx = torch.arange(BLOCK, device=device)
    parity = torch.zeros(BLOCK, BLOCK, dtype=torch.int64, device=device)
    both = idx[:, None] & idx[None, :]
    for bit in range(4):
        parity = parity + ((both >> bit) & 1)
    hadamard = 1.0 - 2.0 * (parity % 2).to(torch.float32)
    signs = torch.tensor(RHT_SIGN_VECTOR if random_sign_mask else (1,) * BLOCK, dtype=torch.float32, device=device)
    return (signs[:, None] * hadamard * 0.25).to(torch.bfloat16)


def hadamard_transform_16(x_t: torch.Tensor, *, random_sign_mask: bool) -> torch.Tensor:
    """Apply the RHT along the last dim in chunks of 16: ``y = chunk @ (diag(s) H16 / 4)``.

    ``x_t`` is bf16 (the already transposed ``(K, M)`` tensor for columnwise
    quantization). For each chunk ``x_0..x_15`` and output ``j``:
    ``acc = +0.0; for i = 0..15: acc = RN(acc + x_i * m_ij)`` (each product is
    exact: ``m_ij = ±0.25``), then ``y_j = bf16_RNE(acc)``. The fixed ascending
    order defines the result where an fp32 sum would be inexact (operand
    exponents more than ~16 apart); elsewhere it equals TE's reference (a bf16
    ``torch.matmul`` with fp32 accumulation) bit for bit. An exactly zero sum is
    +0.0.
    """
    if x_t.dtype != torch.bfloat16:
        raise ValueError(f"hadamard_transform_16: expected a bfloat16 tensor, got {x_t.dtype}")
    if x_t.ndim == 0 or x_t.shape[-1] % BLOCK != 0:
        raise ValueError(
            f"hadamard_transform_16: the last dim must be a multiple of {BLOCK}, got shape {tuple(x_t.shape)}"
        )
    matrix = rht_matrix_16(random_sign_mask=random_sign_mask, device=x_t.device).to(torch.float32)
    chunks = x_t.reshape(-1, BLOCK).to(torch.float32)
    acc = torch.zeros_like(chunks)
    for i in range(BLOCK):
        acc = acc + chunks[:, i : i + 1] * matrix[i][None, :]
    return acc.to(torch.bfloat16).reshape(x_t.shape)
