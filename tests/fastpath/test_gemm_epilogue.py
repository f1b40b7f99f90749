"""The bias epilogue of GEMMs whose cuBLAS call takes no bias (``kernels/gemm_epilogue.cu``): one pass over the
fp32 result, bit for bit what torch computes for ``(wide + bias.float()).to(out_dtype)``, the reference's
Linear+Bias arithmetic; and an FP8 block-scaled Linear+Bias GEMM goes through it."""

from __future__ import annotations

import pytest
import torch

import refops
from fastpath import gemm as fast_gemm
from fastpath.gemm_epilogue import add_bias_and_round

SPECIAL = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-45, -3e-39, 1e-38, 3.0e38, 65504.0, 65520.0,
           1.0 + 2.0 ** -8, 1.0 + 2.0 ** -9, 1.0 + 3 * 2.0 ** -9, -2.5, 7.0]


def _wide(rows: int, cols: int, seed: int, device) -> torch.Tensor:
    """Random fp32 bit patterns (every exponent, subnormals, NaNs) mixed with special values."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-2 ** 31, 2 ** 31, (rows, cols), generator=g, dtype=torch.int64).to(torch.int32)
    wide = bits.view(torch.float32) * 2.0 ** -100  # most values in range, some still huge or subnormal
    special = torch.tensor(SPECIAL)[torch.randint(0, len(SPECIAL), (rows, cols), generator=g)]
    wide = torch.where(torch.rand(rows, cols, generator=g) < 0.3, special, wide)
    ties = torch.randint(-500, 500, (rows, cols), generator=g).float() * 2.0 ** -9  # sums that land on ties
    return torch.where(torch.rand(rows, cols, generator=g) < 0.3, ties, wide).to(device)


@pytest.mark.parametrize("target", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias_dtype", ["target", torch.float32])
@pytest.mark.parametrize("rows,cols", [(1, 4), (37, 128), (256, 1028), (5, 6)])
def test_epilogue_is_torch_s_add_then_round_bit_for_bit(target, bias_dtype, rows, cols, cuda):
    bias_dtype = target if bias_dtype == "target" else bias_dtype
    wide = _wide(rows, cols, seed=rows * 31 + cols, device=cuda)
    bias = (_wide(1, cols, seed=cols, device=cuda)[0] * 2.0 ** 60).clamp(-1e4, 1e4).to(bias_dtype)
    bias[::3] = torch.tensor(SPECIAL[:1] + SPECIAL[5:9]).repeat(cols)[: bias[::3].numel()].to(bias_dtype)
    got = add_bias_and_round(wide, bias, target)
    want = (wide + bias.float()).to(target)
    assert got.dtype == target and got.shape == wide.shape
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_a_block_scaled_linear_bias_gemm_uses_the_epilogue(cuda, fastpath_backend, monkeypatch):
    """torch._scaled_mm takes no bias with block scales: the fp32 result goes through the one-pass epilogue, and
    the whole agrees with the fast path's own fp32 GEMM plus torch's add and cast, bit for bit."""
    from fastpath import gemm_blockwise

    if gemm_blockwise.support(cuda) is None:
        pytest.skip("no block-scaled cuBLAS GEMM on this GPU / torch (gemm_blockwise.support is None)")
    recipe = refops.recipe.Float8BlockScaling()
    x = torch.randn(256, 384, device=cuda, dtype=torch.bfloat16)
    linear = refops.ops.Linear(384, 512, bias=True, device=cuda, dtype=torch.bfloat16)
    calls = []
    monkeypatch.setattr(fast_gemm, "add_bias_and_round", lambda *a: calls.append(a) or add_bias_and_round(*a))
    with refops.use_backend(fastpath_backend), refops.autocast(recipe=recipe):
        y = linear(x)
    assert calls, "the block-scaled Linear+Bias did not go through the epilogue"
    wide, bias, target = calls[0]
    assert wide.dtype == torch.float32 and target == torch.bfloat16 and bias is not None
    assert torch.equal(y.reshape(wide.shape).view(torch.int16), (wide + bias.float()).to(target).view(torch.int16))
