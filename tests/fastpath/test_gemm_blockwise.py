"""FP8 block-scaled GEMMs through ``torch._scaled_mm`` (``fastpath.gemm_blockwise``).

On any machine: the operands and scale views built from refops's tensors, fed to an emulation of
``torch._scaled_mm``'s blockwise contract (its stride checks, then each 1x128 block or 128x128 tile scaled by
its own scale), equal the reference's exact GEMM, for a Linear's three GEMMs, under each tile-scale
convention; pairs the path does not take give None. On a GPU: the probe's verdict on an H200 and the results
of the backend's GEMM against the reference where the path applies and where it does not.
"""

from __future__ import annotations

import pytest
import torch

import refops
from fastpath import gemm_blockwise
from refops.kernels import ReferenceKernels
from refops.quantization import DType, Float8BlockQuantizer
from refops.testing import quantization_tols

BLOCK = 128
#: The (scale_a, scale_b) kinds torch._scaled_mm accepts for FP8 block scaling (cuBLAS's pairs).
PAIRS = {("1x128", "128x128"), ("128x128", "1x128"), ("1x128", "1x128")}


def quantized(rows: int, cols: int, dim: int, seed: int, device="cpu", fp8=DType.kFloat8E4M3):
    """An operand whose blocks and tiles have scales that differ by powers of two."""
    g = torch.Generator().manual_seed(seed)
    exponent = torch.randint(-3, 3, (rows, -(-cols // BLOCK)), generator=g).float()
    x = torch.randn(rows, cols, generator=g) * torch.exp2(exponent).repeat_interleave(BLOCK, 1)[:, :cols]
    quantizer = Float8BlockQuantizer(fp8, rowwise=True, columnwise=True, block_scaling_dim=dim)
    return quantizer(x.to(torch.bfloat16).to(device))


#: Per tile-scale convention: the row stride torch checks and the one cuBLAS reads ("compact" C/128 or "padded").
STRIDES = {"compact": ("compact", "compact"), "padded": ("padded", "padded"),
           "padded_behind_compact": ("compact", "padded"), "aligned": ("compact", "compact")}


def tile_row_stride(kb: int, which: str) -> int:
    return -(-kb // 4) * 4 if which == "padded" else kb


def scale_kind(rows: int, k: int, s: torch.Tensor, convention: str):
    """How torch's ``_scaled_mm`` classifies ``s`` as the scale of an operand ``(rows, k)`` (its
    ``is_blockwise_1x128_scaling`` / ``is_blockwise_128x128_scaling``: a dim of size 1 has no stride check)."""
    kb = -(-k // BLOCK)
    if tuple(s.shape) == (rows, kb) and (rows <= 1 or s.stride(0) == 1) and (kb <= 1 or s.stride(1) == rows):
        return "1x128"
    rb = -(-rows // BLOCK)
    row_stride = tile_row_stride(kb, STRIDES[convention][0])
    if tuple(s.shape) == (rb, kb) and (rb <= 1 or s.stride(0) == row_stride) and (kb <= 1 or s.stride(1) == 1):
        return "128x128"
    return None


def emulated_scaled_mm(mat1, mat2, scale_a, scale_b, convention: str) -> torch.Tensor:
    """``torch._scaled_mm``'s blockwise result in float64: mat1's blocks times scale_a's, mat2's times scale_b's
    (checked as ``scale_b.t()`` against ``mat2.t()``), after the same shape and stride checks; tile scales are
    read from the tensor's pointer at the row stride cuBLAS assumes under ``convention``."""
    m, k = mat1.shape
    n = mat2.shape[1]
    kinds = (scale_kind(m, k, scale_a, convention), scale_kind(n, k, scale_b.t(), convention))
    assert kinds in PAIRS, (kinds, scale_a.shape, scale_a.stride(), scale_b.shape, scale_b.stride())

    def expanded(s: torch.Tensor, rows: int, kind: str) -> torch.Tensor:
        r, c = torch.arange(rows)[:, None], (torch.arange(k) // BLOCK)[None, :]
        if kind == "1x128":
            return s[r, c].double()
        read = s.as_strided(s.shape, (tile_row_stride(s.shape[1], STRIDES[convention][1]), 1))
        return read[r // BLOCK, c].double()

    a = mat1.float().double() * expanded(scale_a, m, kinds[0])
    bt = mat2.t().float().double() * expanded(scale_b.t(), n, kinds[1])
    return a @ bt.t()


@pytest.mark.parametrize("convention", gemm_blockwise.TILE_CONVENTIONS)
@pytest.mark.parametrize("tokens,hidden,ffn", [(256, 384, 128), (256, 512, 512), (128, 128, 128)])
def test_operands_give_the_reference_gemm(tokens, hidden, ffn, convention):
    x, w, dy = quantized(tokens, hidden, 1, 0), quantized(ffn, hidden, 2, 1), quantized(tokens, ffn, 1, 2)
    reference = ReferenceKernels()
    # (tile rows, tile columns) of the weight's tile scales as each GEMM reads them (wgrad reads no tiles)
    tiles = {"fprop": (ffn // BLOCK, hidden // BLOCK), "dgrad": (hidden // BLOCK, ffn // BLOCK), "wgrad": (1, 4)}
    for what, a, b, trans_a, trans_b in [("fprop", x, w, False, True), ("dgrad", dy, w, False, False),
                                         ("wgrad", dy, x, True, False)]:
        operands = gemm_blockwise._build(a, b, trans_a, trans_b, convention)
        tile_rows, tile_cols = tiles[what]
        if convention == "aligned" and tile_rows > 1 and tile_cols % 4:
            assert operands is None, f"{what}: 'aligned' takes no tile scales of {tile_cols} columns"
            continue
        assert operands is not None, what
        mat1, mat2, scale_a, scale_b = operands
        assert mat1.dtype == mat2.dtype == torch.float8_e4m3fn and mat2.stride(0) == 1  # mat2 column-major
        got = emulated_scaled_mm(mat1, mat2, scale_a, scale_b, convention)
        want = reference.gemm(a, b, trans_a=trans_a, trans_b=trans_b, out_dtype=torch.float32).double()
        # The reference sums exact products in fp32: a few fp32 roundings of the largest terms apart.
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max())), what


def test_the_scale_views_share_refops_memory_where_the_strides_allow():
    """1x128 scales and, under the padded convention, tile scales are views of refops's tensors: no copy."""
    x, w = quantized(256, 512, 1, 0), quantized(384, 512, 2, 1)
    _, _, scale_a, scale_b = gemm_blockwise._build(x, w, False, True, "padded")
    assert scale_a.data_ptr() == x._rowwise_scale_inv.data_ptr() and scale_a.stride() == (1, 256)
    assert scale_b.data_ptr() == w._rowwise_scale_inv.data_ptr() and scale_b.t().stride() == (4, 1)
    # 3 tile rows of 4 columns: the compact and padded layouts agree, so "aligned" takes it too
    assert gemm_blockwise._build(x, w, False, True, "aligned") is not None


def test_pairs_the_path_does_not_take():
    x = quantized(256, 256, 1, 0)
    w = quantized(256, 256, 2, 1)
    assert gemm_blockwise._build(w, w, False, True, "padded") is None  # two tile-scaled operands
    odd = quantized(96, 256, 1, 2)  # 96 rows: not a multiple of 128
    assert gemm_blockwise._build(odd, w, False, True, "padded") is None
    g1 = quantized(256, 256, 1, 3, fp8=DType.kFloat8E5M2)
    g2 = quantized(256, 256, 1, 4, fp8=DType.kFloat8E5M2)
    assert gemm_blockwise._build(g1, g2, True, False, "padded") is None  # E5M2 x E5M2
    rows_only = Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=False, block_scaling_dim=1)(
        torch.randn(256, 256).to(torch.bfloat16))
    assert gemm_blockwise._build(rows_only, x, True, False, "padded") is None  # wgrad needs column-wise data
    # CPU tensors never reach the probe
    assert gemm_blockwise.blockwise_scaled_mm_operands(x, w, False, True, torch.bfloat16) is None


# ------------------------------------------------------------------ on a GPU
def test_block_scaled_gemms_are_found_on_hopper(cuda):
    """An H200 with CUDA 12.9+ (TE's condition for Float8BlockScaling GEMMs) runs them, right, in every
    output dtype the fused ops ask for."""
    cuda_version = tuple(int(v) for v in torch.version.cuda.split(".")[:2])
    if torch.cuda.get_device_capability(cuda)[0] != 9 or cuda_version < (12, 9):
        pytest.skip("block-scaled cuBLAS GEMMs need sm_90 and CUDA 12.9 or later")
    found = gemm_blockwise.support(cuda)
    assert found is not None, "torch._scaled_mm with 1x128 / 128x128 scales failed or gave wrong results"
    assert {torch.float32, torch.bfloat16} <= found.out_dtypes, found


@pytest.mark.parametrize("tokens,hidden,ffn", [(256, 384, 384), (256, 1024, 512), (96, 256, 128)])
def test_backend_gemms_match_the_reference(tokens, hidden, ffn, cuda, reference_backend, fastpath_backend):
    """The fast path's GEMMs on block-scaled operands against the reference: cuBLAS's block-scaled GEMM where
    the dims are multiples of 128 (``gemm_path`` says "scaled_mm"), dequantize + cuBLAS elsewhere."""
    from fastpath.gemm import gemm_path

    with refops.use_backend(reference_backend):
        x, w, dy = (quantized(tokens, hidden, 1, 0, cuda), quantized(ffn, hidden, 2, 1, cuda),
                    quantized(tokens, ffn, 1, 2, cuda))
    tols = quantization_tols("fp8_block_scaling")
    found = gemm_blockwise.support(cuda)
    for out_dtype in (torch.bfloat16, torch.float32):
        applies = tokens % BLOCK == 0 and found is not None and out_dtype in found.out_dtypes
        for what, a, b, kw in [("fprop", x, w, dict(trans_b=True)), ("dgrad", dy, w, {}),
                               ("wgrad", dy, x, dict(trans_a=True))]:
            with refops.use_backend(reference_backend) as ref:
                want = ref.gemm(a, b, out_dtype=out_dtype, **kw)
            with refops.use_backend(fastpath_backend) as fast:
                got = fast.gemm(a, b, out_dtype=out_dtype, **kw)
            scale = float(want.float().abs().max())
            assert torch.allclose(got.float(), want.float(), rtol=tols["rtol"], atol=tols["atol"] * scale), what
            assert gemm_path(a, b, out_dtype=out_dtype, **kw) == ("scaled_mm" if applies else "dequantize+cublas"), what
