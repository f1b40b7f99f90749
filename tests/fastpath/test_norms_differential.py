"""Fast-path LayerNorm, RMSNorm and L2 normalization against the reference backend on the same GPU.

Row statistics are fp32 reductions in another order than torch's, so outputs are
compared within the dtype's tolerance (``dtype_tols``), mean/rstd within fp32's,
and weight gradients (column sums over rows) within the dtype's tolerance plus
an fp32 summation bound. Rows too wide for the kernels fall back to the
reference and must then equal it exactly.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import refops
from fastpath.backend import FastpathKernels
from fastpath.norms import max_fast_width
from refops.kernels import ReferenceKernels
from refops.testing import dtype_tols
from refops.testing.tensor_report import compare_tensors

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: (leading dims..., width): one warp per row, several rows per block, a block per row, odd widths.
SHAPES = [(1, 64), (5, 37), (33, 1000), (3, 5, 48), (8, 4096), (2, 1001), (64, 8192), (300, 256), (1, 1)]


def _ids(shape) -> str:
    return "x".join(map(str, shape))


def make(shape, dtype, device, *, seed=0, scale=1.0, offset=0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale + offset).to(dtype).to(device)


def run_both(reference_backend, fastpath_backend, method: str, *args: Any, **kwargs: Any):
    with refops.use_backend(reference_backend) as ref:
        expected = getattr(ref, method)(*args, **kwargs)
    with refops.use_backend(fastpath_backend) as fast:
        actual = getattr(fast, method)(*args, **kwargs)
    torch.cuda.synchronize()
    return actual, expected


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, *, rtol: float, atol: float) -> None:
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != reference {expected.dtype}"
    result = compare_tensors(what, actual, expected, tier="tolerance", rtol=rtol, atol=atol)
    if not result.passed:
        index = result.first_mismatches[0] if result.first_mismatches else ()
        detail = ""
        if index:
            detail = (f"; at {index}: fastpath {actual[index].item()!r} vs reference {expected[index].item()!r}")
        raise AssertionError(f"{result}{detail}")


def assert_output_close(actual, expected, what) -> None:
    assert_close(actual, expected, what, **dtype_tols(actual.dtype))


def assert_stats_close(actual, expected, what) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert_close(actual, expected, what, **dtype_tols(torch.float32))


def assert_wgrad_close(actual, expected, summands, what) -> None:
    """Column sums over rows: the dtype's tolerance plus 1e-6 of the sum of |terms| (fp32 accumulation)."""
    tols = dtype_tols(actual.dtype)
    scale = summands.double().abs().reshape(-1, summands.shape[-1]).sum(dim=0).reshape(actual.shape)
    bound = tols["atol"] + tols["rtol"] * expected.double().abs() + 1e-6 * scale.to(expected.device)
    diff = (actual.double() - expected.double()).abs()
    bad = diff > bound
    if bad.any():
        i = tuple(int(v) for v in bad.nonzero()[0])
        raise AssertionError(f"{what}: {int(bad.sum())}/{bad.numel()} beyond tolerance; first at {i}: fastpath "
                             f"{actual[i].item()!r} vs reference {expected[i].item()!r} (bound {bound[i].item():.3e})")


# ------------------------------------------------------------------- LayerNorm
@pytest.mark.parametrize("zero_centered_gamma", [False, True], ids=["gamma", "zero_centered"])
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_layer_norm(dtype, shape, zero_centered_gamma, cuda, reference_backend, fastpath_backend):
    width = shape[-1]
    x = make(shape, dtype, cuda, scale=2.0, offset=3.0)  # an offset mean exercises the two-pass variance
    w = make((width,), dtype, cuda, seed=1, scale=0.5, offset=0.0 if zero_centered_gamma else 1.0)
    b = make((width,), dtype, cuda, seed=2, scale=0.5)
    kw = dict(eps=1e-5, zero_centered_gamma=zero_centered_gamma)
    (y, mean, rstd), (y_ref, mean_ref, rstd_ref) = run_both(
        reference_backend, fastpath_backend, "layer_norm_forward", x, w, b, out_dtype=dtype, **kw)
    assert y.shape == x.shape
    assert_output_close(y, y_ref, "LayerNorm y")
    assert_stats_close(mean, mean_ref, "LayerNorm mean")
    assert_stats_close(rstd, rstd_ref, "LayerNorm rstd")

    dy = make(shape, dtype, cuda, seed=3)
    (dx, dw, db), (dx_ref, dw_ref, db_ref) = run_both(
        reference_backend, fastpath_backend, "layer_norm_backward", dy, x, mean_ref, rstd_ref, w,
        zero_centered_gamma=zero_centered_gamma)
    assert_output_close(dx, dx_ref, "LayerNorm dx")
    xhat = (x.double().reshape(-1, width) - mean_ref.double()[:, None]) * rstd_ref.double()[:, None]
    assert_wgrad_close(dw, dw_ref, dy.double().reshape(-1, width) * xhat, "LayerNorm dweight")
    assert_wgrad_close(db, db_ref, dy, "LayerNorm dbias")


def test_layer_norm_backward_after_its_kernel_is_loaded_again(cuda, reference_backend, fastpath_backend):
    """layer_norm_bwd takes 96 KiB of dynamic shared memory for bf16, which every loaded copy of the kernel must opt
    in to: after the kernel caches are cleared (as test_nvrtc_compile's tests do), the kernel compiled and loaded
    again runs, and gives the same bytes."""
    from fastpath import _cuda

    shape, dtype = (64, 8192), torch.bfloat16
    x = make(shape, dtype, cuda, scale=2.0, offset=3.0)
    w = make((shape[-1],), dtype, cuda, seed=1, scale=0.5, offset=1.0)
    dy = make(shape, dtype, cuda, seed=3)
    with refops.use_backend(reference_backend) as ref:
        _, mean, rstd = ref.layer_norm_forward(x, w, w, eps=1e-5, zero_centered_gamma=False, out_dtype=dtype)
    args = ("layer_norm_backward", dy, x, mean, rstd, w)
    first, expected = run_both(reference_backend, fastpath_backend, *args, zero_centered_gamma=False)
    _cuda._module.cache_clear()
    _cuda._kernel.cache_clear()
    again, _ = run_both(reference_backend, fastpath_backend, *args, zero_centered_gamma=False)
    for name, a, b in zip(("dx", "dweight", "dbias"), again, first):
        assert torch.equal(a, b), f"LayerNorm {name} changed when the kernel was loaded again"
    assert_output_close(again[0], expected[0], "LayerNorm dx")


# --------------------------------------------------------------------- RMSNorm
@pytest.mark.parametrize("zero_centered_gamma", [False, True], ids=["gamma", "zero_centered"])
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm(dtype, shape, zero_centered_gamma, cuda, reference_backend, fastpath_backend):
    width = shape[-1]
    x = make(shape, dtype, cuda, scale=2.0, offset=0.5)
    w = make((width,), dtype, cuda, seed=1, scale=0.5, offset=0.0 if zero_centered_gamma else 1.0)
    kw = dict(eps=1e-6, zero_centered_gamma=zero_centered_gamma)
    (y, rstd), (y_ref, rstd_ref) = run_both(reference_backend, fastpath_backend, "rms_norm_forward", x, w,
                                            out_dtype=dtype, **kw)
    assert_output_close(y, y_ref, "RMSNorm y")
    assert_stats_close(rstd, rstd_ref, "RMSNorm rstd")

    dy = make(shape, dtype, cuda, seed=3)
    (dx, dw), (dx_ref, dw_ref) = run_both(reference_backend, fastpath_backend, "rms_norm_backward", dy, x,
                                          rstd_ref, w, zero_centered_gamma=zero_centered_gamma)
    assert_output_close(dx, dx_ref, "RMSNorm dx")
    xhat = x.double().reshape(-1, width) * rstd_ref.double()[:, None]
    assert_wgrad_close(dw, dw_ref, dy.double().reshape(-1, width) * xhat, "RMSNorm dweight")


# ----------------------------------------------------------- L2 normalization
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_l2_normalize(dtype, shape, cuda, reference_backend, fastpath_backend):
    x = make(shape, dtype, cuda, scale=2.0)
    (y, r), (y_ref, r_ref) = run_both(reference_backend, fastpath_backend, "l2_normalize_forward", x, eps=1e-6)
    assert_output_close(y, y_ref, "L2Normalization y")
    assert_stats_close(r, r_ref, "L2Normalization rsqrt_norm")
    dy = make(shape, dtype, cuda, seed=3)
    dx, dx_ref = run_both(reference_backend, fastpath_backend, "l2_normalize_backward", dy, x, r_ref, eps=1e-6)
    assert_output_close(dx, dx_ref, "L2Normalization dx")


# ----------------------------------------------------------- layouts and edges
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_non_contiguous_and_unaligned_inputs(dtype, cuda, reference_backend, fastpath_backend):
    base = make((64, 260), dtype, cuda, scale=2.0, offset=1.0)
    views = {"strided": base[:, ::2], "transposed": base[:, :64].t(),
             "offset": base.reshape(-1)[1:1 + 64 * 128].reshape(64, 128)}
    for name, x in views.items():
        width = x.shape[-1]
        w, b = make((width,), dtype, cuda, seed=1, offset=1.0), make((width,), dtype, cuda, seed=2)
        (y, mean, rstd), (y_ref, mean_ref, rstd_ref) = run_both(
            reference_backend, fastpath_backend, "layer_norm_forward", x, w, b, eps=1e-5,
            zero_centered_gamma=False, out_dtype=dtype)
        assert_output_close(y, y_ref, f"LayerNorm y, {name} input")
        assert_stats_close(rstd, rstd_ref, f"LayerNorm rstd, {name} input")
        dy = make((x.shape[1], x.shape[0]), dtype, cuda, seed=3).t()
        (dx, dw, _), (dx_ref, dw_ref, _) = run_both(
            reference_backend, fastpath_backend, "layer_norm_backward", dy, x, mean_ref, rstd_ref, w,
            zero_centered_gamma=False)
        assert_output_close(dx, dx_ref, f"LayerNorm dx, {name} input")
        (y, r), (y_ref, r_ref) = run_both(reference_backend, fastpath_backend, "rms_norm_forward", x, w, eps=1e-5,
                                          zero_centered_gamma=False, out_dtype=dtype)
        assert_output_close(y, y_ref, f"RMSNorm y, {name} input")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_special_values_propagate_like_the_reference(dtype, cuda, reference_backend, fastpath_backend):
    """A row with NaN or inf gives NaN where the reference does (same positions)."""
    x = make((4, 256), dtype, cuda)
    x[1, 3] = float("nan")
    x[2, 7] = float("inf")
    w, b = make((256,), dtype, cuda, seed=1, offset=1.0), make((256,), dtype, cuda, seed=2)
    (y, _, rstd), (y_ref, _, rstd_ref) = run_both(reference_backend, fastpath_backend, "layer_norm_forward", x, w, b,
                                                  eps=1e-5, zero_centered_gamma=False, out_dtype=dtype)
    assert torch.equal(torch.isnan(y), torch.isnan(y_ref))
    assert torch.equal(torch.isnan(rstd), torch.isnan(rstd_ref))
    ok = ~torch.isnan(y_ref)
    assert_output_close(y[ok], y_ref[ok], "LayerNorm y (finite rows)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rows_too_wide_fall_back_exactly(dtype, cuda, reference_backend, fastpath_backend):
    width = max_fast_width(dtype) * 2
    x = make((2, width), dtype, cuda)
    w, b = make((width,), dtype, cuda, seed=1), make((width,), dtype, cuda, seed=2)
    (y, mean, rstd), (y_ref, mean_ref, rstd_ref) = run_both(
        reference_backend, fastpath_backend, "layer_norm_forward", x, w, b, eps=1e-5, zero_centered_gamma=False,
        out_dtype=dtype)
    assert torch.equal(y, y_ref) and torch.equal(mean, mean_ref) and torch.equal(rstd, rstd_ref)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_empty_and_mixed_dtype_inputs_fall_back(dtype, cuda, reference_backend, fastpath_backend):
    x = torch.empty((0, 64), dtype=dtype, device=cuda)
    w, b = torch.ones(64, dtype=dtype, device=cuda), torch.zeros(64, dtype=dtype, device=cuda)
    (y, mean, rstd), (y_ref, mean_ref, rstd_ref) = run_both(
        reference_backend, fastpath_backend, "layer_norm_forward", x, w, b, eps=1e-5, zero_centered_gamma=False,
        out_dtype=dtype)
    assert y.shape == y_ref.shape == (0, 64) and mean.shape == mean_ref.shape == (0,)
    x = make((4, 64), dtype, cuda)
    other = torch.float32 if dtype != torch.float32 else torch.bfloat16
    (y, _), (y_ref, _) = run_both(reference_backend, fastpath_backend, "rms_norm_forward", x, w, eps=1e-5,
                                  zero_centered_gamma=False, out_dtype=other)
    assert y.dtype == y_ref.dtype == other and torch.equal(y, y_ref)


def test_cpu_tensors_fall_back_to_the_reference():
    fast, ref = FastpathKernels(), ReferenceKernels()
    x, w, b = make((6, 32), torch.float32, "cpu"), make((32,), torch.float32, "cpu", seed=1), torch.zeros(32)
    for a, e in zip(fast.layer_norm_forward(x, w, b, eps=1e-5, zero_centered_gamma=False, out_dtype=torch.float32),
                    ref.layer_norm_forward(x, w, b, eps=1e-5, zero_centered_gamma=False, out_dtype=torch.float32)):
        assert torch.equal(a, e)
    assert torch.equal(fast.l2_normalize_forward(x, eps=1e-6)[0], ref.l2_normalize_forward(x, eps=1e-6)[0])


def test_max_fast_width():
    assert max_fast_width(torch.bfloat16) == 16384
    assert max_fast_width(torch.float32) == 8192
    assert max_fast_width(torch.float16, vectorized=False) == 4096


def test_row_layout_choices():
    """One warp per narrow row, a wider block for wide rows, single elements for odd widths."""
    from fastpath.norms import _row_layout

    t = torch.empty(16, dtype=torch.bfloat16)  # an aligned CPU tensor: only its pointer is read
    assert _row_layout(256, torch.bfloat16, t) == (True, 32, 8)
    assert _row_layout(8192, torch.bfloat16, t) == (True, 256, 1)
    assert _row_layout(16384, torch.bfloat16, t) == (True, 512, 1)
    assert _row_layout(16385, torch.bfloat16, t) is None
    assert _row_layout(1001, torch.bfloat16, t) == (False, 128, 2)
    assert _row_layout(4096, torch.float32, t) == (True, 256, 1)
    assert _row_layout(64, torch.float32, t[1:]) == (False, 32, 8)  # unaligned pointer: single elements
