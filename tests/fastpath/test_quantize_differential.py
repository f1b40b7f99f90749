"""Fast-path quantization kernels against the reference, bit for bit, on the GPU.

Each test runs one kernel method under the reference backend and under the
fastpath backend on the same CUDA inputs and requires every returned tensor to
be bit-identical (integer views, so NaN payloads count; scale tensors over the
whole padded tensor, since both sides zero-pad). A failure names the first
differing index and both values. Covered here: amax, per-tensor FP8, MXFP8 and
FP8 block scaling; NVFP4 is in test_quantize_nvfp4.py, the quantizer classes in
test_quantize_roundtrip.py (both import the helpers below).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch
from _nvcc_builds import Build

import refops
from fastpath.compile_check import KERNEL_DIR, NVCC_FLAGS

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
FP8_DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2]
USAGES = [(True, False), (False, True), (True, True)]
#: "plain": random values over a wide dynamic range; "edge": plus NaN, ±0, subnormals, huge finite
#: values, a zero block and a NaN block; "inf": edge plus ±inf.
MODES = ["plain", "edge", "inf"]
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# ------------------------------------------------------------------ helpers
def bits(t: torch.Tensor) -> torch.Tensor:
    """The flattened integer view of ``t``'s elements."""
    return t.detach().contiguous().reshape(-1).view(_INT_VIEW[t.element_size()])


def assert_identical(ref: Any, fast: Any, what: str) -> None:
    """``ref`` and ``fast`` (tensors, None or tuples of them) are bit-identical."""
    if isinstance(ref, (tuple, list)):
        assert isinstance(fast, (tuple, list)) and len(ref) == len(fast), f"{what}: {len(ref)} results vs {fast!r}"
        for i, (r, f) in enumerate(zip(ref, fast)):
            assert_identical(r, f, f"{what}[{i}]")
        return
    if ref is None or fast is None:
        assert ref is None and fast is None, (
            f"{what}: reference gives {type(ref).__name__}, fastpath {type(fast).__name__}")
        return
    assert (ref.shape, ref.dtype) == (fast.shape, fast.dtype), (
        f"{what}: reference {tuple(ref.shape)} {ref.dtype} vs fastpath {tuple(fast.shape)} {fast.dtype}")
    a, b = bits(ref), bits(fast)
    differ = a != b
    if differ.any():
        flat = int(differ.nonzero()[0])
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), ref.shape)) if ref.dim() else ()
        rv, fv = ref.reshape(-1)[flat], fast.reshape(-1)[flat]
        mask = (1 << (8 * ref.element_size())) - 1
        raise AssertionError(
            f"{what}: {int(differ.sum())} of {a.numel()} elements differ; first at index {index} of shape "
            f"{tuple(ref.shape)}: reference {rv.item()!r} (bits {int(a[flat]) & mask:#x}) vs fastpath "
            f"{fv.item()!r} (bits {int(b[flat]) & mask:#x})")


def make_input(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, mode: str = "plain", *,
               seed: int = 0, transposed: bool = False) -> torch.Tensor:
    """Random values of magnitude 2^-20..2^20 (and special values by ``mode``); ``transposed`` gives a
    non-contiguous tensor (the transpose of a contiguous one) of the same shape."""
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    values = torch.randn(n, generator=g) * torch.exp2(torch.randint(-20, 21, (n,), generator=g).float())
    if mode != "plain" and n >= 16:
        info = torch.finfo(dtype)
        special = [float("nan"), 0.0, -0.0, info.tiny / 8, -info.tiny / 4, info.tiny, info.max, -info.max,
                   448.0, 449.0, -57344.0, 1e-30]
        if mode == "inf":
            special += [float("inf"), float("-inf")]
        values[: len(special)] = torch.tensor(special)
        if n >= 256:
            values[64:96] = float("nan")  # a block of NaNs
            values[-64:] = 0.0  # zero blocks
    x = values.reshape(shape).to(dtype)
    if transposed and x.dim() == 2:
        x = x.t().contiguous().t()
    return x.to(device)


def run_both(reference_backend, fastpath_backend, method: str, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """``method(*args, **kwargs)`` under each backend (inputs cloned, so in-place updates stay separate)."""
    results = []
    for backend in (reference_backend, fastpath_backend):
        call_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        call_kwargs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        with refops.use_backend(backend):
            out = getattr(backend, method)(*call_args, **call_kwargs)
        results.append((out, call_args, call_kwargs))
    return results[0], results[1]


def assert_same_error(reference_backend, fastpath_backend, method: str, *args: Any, **kwargs: Any) -> None:
    """Both backends reject the call with the same exception type."""
    types = []
    for backend in (reference_backend, fastpath_backend):
        with refops.use_backend(backend), pytest.raises(Exception) as info:
            getattr(backend, method)(*args, **kwargs)
        types.append(type(info.value))
    assert types[0] is types[1], f"{method}: reference raises {types[0].__name__}, fastpath {types[1].__name__}"


def random_bytes(shape: tuple[int, ...], device: torch.device, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g).to(device)


def cases(*axes: list) -> list:
    return list(itertools.product(*axes))


# ------------------------------------------------------------------ amax
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 5), (33, 257), (1000, 1000), (2, 3, 4, 40)])
@pytest.mark.parametrize("mode", MODES)
def test_amax(fastpath_backend, reference_backend, cuda, dtype, shape, mode):
    x = make_input(shape, dtype, cuda, mode)
    (ref, *_), (fast, *_) = run_both(reference_backend, fastpath_backend, "amax", x)
    assert_identical(ref, fast, f"amax {dtype} {shape} {mode}")


def test_amax_of_empty_and_non_contiguous(fastpath_backend, reference_backend, cuda):
    for x in (torch.empty(0, 8, device=cuda), make_input((96, 160), torch.bfloat16, cuda, "edge", transposed=True),
              make_input((64, 256), torch.float32, cuda)[:, ::3]):
        (ref, *_), (fast, *_) = run_both(reference_backend, fastpath_backend, "amax", x)
        assert_identical(ref, fast, f"amax {tuple(x.shape)} stride {x.stride()}")


# ------------------------------------------------------------------ scale from amax
#: Amaxes that take every branch: ordinary, 0, ±inf, NaN, subnormal (scale overflows to +inf), below
#: and at the epsilons, negative, and values whose quotient needs rounding.
AMAX_VALUES = [1.0, 3.0, 448.0, 449.0, 0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-45, 1e-40,
               2.0 ** -126, 1e-38, 1e-12, 1e-6, -5.0, 7.1234567, 3.3e38, 57344.0, 0.1]


@pytest.mark.parametrize("fmax", [448.0, 57344.0, 6.0])
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("eps", [0.0, 1e-12, 0.1])
@pytest.mark.parametrize("value_for_inf", [torch.finfo(torch.float32).max, torch.finfo(torch.bfloat16).max, 1.0])
def test_compute_scale_from_amax(fastpath_backend, reference_backend, cuda, fmax, pow2, eps, value_for_inf):
    g = torch.Generator().manual_seed(3)
    random = torch.randn(300, generator=g) * torch.exp2(torch.randint(-140, 120, (300,), generator=g).float())
    for amax in (torch.tensor(AMAX_VALUES), random, torch.tensor([0.37]), torch.tensor(2.5)):
        (ref, *_), (fast, *_) = run_both(
            reference_backend, fastpath_backend, "compute_scale_from_amax", amax.to(cuda), fmax=fmax,
            force_pow_2_scales=pow2, amax_epsilon=eps, value_for_inf=value_for_inf)
        assert_identical(ref, fast, f"compute_scale_from_amax {tuple(amax.shape)} fmax={fmax} pow2={pow2} eps={eps}")


# ------------------------------------------------------------------ per-tensor FP8
FLOAT8_SHAPES = [(), (1,), (7,), (3, 5), (128, 128), (130, 260), (2, 48, 72), (1024, 2048)]


@pytest.mark.parametrize("dtype,fp8_dtype,usage", cases(DTYPES, FP8_DTYPES, USAGES))
@pytest.mark.parametrize("shape", FLOAT8_SHAPES)
@pytest.mark.parametrize("mode", MODES)
def test_quantize_float8(fastpath_backend, reference_backend, cuda, dtype, fp8_dtype, usage, shape, mode):
    x = make_input(shape, dtype, cuda, mode, seed=1)
    scale = torch.tensor([3.7], device=cuda)
    accumulator = torch.tensor([0.5], device=cuda)
    (ref, _, ref_kw), (fast, _, fast_kw) = run_both(
        reference_backend, fastpath_backend, "quantize_float8", x, scale, fp8_dtype=fp8_dtype, rowwise=usage[0],
        columnwise=usage[1], amax_accumulator=accumulator)
    what = f"quantize_float8 {dtype} {fp8_dtype} {usage} {shape} {mode}"
    assert_identical(ref, fast, what)
    assert_identical(ref_kw["amax_accumulator"], fast_kw["amax_accumulator"], what + " amax_accumulator")


@pytest.mark.parametrize("scale_value", [1.0, 2.0 ** -7, 448.0 / 3.0, 0.0, float("inf"), 1e-39])
@pytest.mark.parametrize("accumulator_value", [None, 0.0, 7.0, float("nan")])
def test_quantize_float8_scales_and_accumulators(fastpath_backend, reference_backend, cuda, scale_value,
                                                 accumulator_value):
    x = make_input((64, 96), torch.bfloat16, cuda, "inf", seed=2, transposed=True)
    kwargs = dict(fp8_dtype=torch.float8_e4m3fn, rowwise=True, columnwise=True)
    if accumulator_value is not None:
        kwargs["amax_accumulator"] = torch.tensor([accumulator_value], device=cuda)
    (ref, _, ref_kw), (fast, _, fast_kw) = run_both(
        reference_backend, fastpath_backend, "quantize_float8", x, torch.tensor([scale_value], device=cuda), **kwargs)
    assert_identical(ref, fast, f"quantize_float8 scale={scale_value}")
    if accumulator_value is not None:
        assert_identical(ref_kw["amax_accumulator"], fast_kw["amax_accumulator"], "amax_accumulator")


@pytest.mark.parametrize("fp8_dtype,out_dtype", cases(FP8_DTYPES, DTYPES))
@pytest.mark.parametrize("shape", [(), (1,), (3, 5), (256,), (40, 1000)])
@pytest.mark.parametrize("scale_inv", [1.0, 0.0123, 2.0 ** 100, float("inf")])
def test_dequantize_float8(fastpath_backend, reference_backend, cuda, fp8_dtype, out_dtype, shape, scale_inv):
    data = random_bytes(shape, cuda)  # every byte value, NaN encodings included
    (ref, *_), (fast, *_) = run_both(reference_backend, fastpath_backend, "dequantize_float8", data,
                                     torch.tensor([scale_inv], device=cuda), fp8_dtype=fp8_dtype, out_dtype=out_dtype)
    assert_identical(ref, fast, f"dequantize_float8 {fp8_dtype} {out_dtype} {shape} {scale_inv}")


# ------------------------------------------------------------------ MXFP8
MXFP8_SHAPES = [(32, 32), (64, 96), (2, 32, 160), (96, 4096), (1024, 1024)]


@pytest.mark.parametrize("dtype,fp8_dtype,usage", cases(DTYPES, FP8_DTYPES, USAGES))
@pytest.mark.parametrize("with_2d", [False, True])
@pytest.mark.parametrize("shape", MXFP8_SHAPES)
@pytest.mark.parametrize("mode", MODES)
def test_quantize_mxfp8(fastpath_backend, reference_backend, cuda, dtype, fp8_dtype, usage, with_2d, shape, mode):
    x = make_input(shape, dtype, cuda, mode, seed=3, transposed=shape == (64, 96))
    (ref, *_), (fast, *_) = run_both(reference_backend, fastpath_backend, "quantize_mxfp8", x, fp8_dtype=fp8_dtype,
                                     rowwise=usage[0], columnwise=usage[1], with_2d_quantization=with_2d)
    assert_identical(ref, fast, f"quantize_mxfp8 {dtype} {fp8_dtype} {usage} 2d={with_2d} {shape} {mode}")


@pytest.mark.parametrize("shape", [(16, 32), (32, 48), (32,), (31, 64)])
def test_quantize_mxfp8_rejects_the_same_shapes(fastpath_backend, reference_backend, cuda, shape):
    assert_same_error(reference_backend, fastpath_backend, "quantize_mxfp8", make_input(shape, torch.bfloat16, cuda),
                      fp8_dtype=torch.float8_e4m3fn, rowwise=True, columnwise=True)


@pytest.mark.parametrize("fp8_dtype,out_dtype,columnwise", cases(FP8_DTYPES, DTYPES, [False, True]))
@pytest.mark.parametrize("shape", [(32, 32), (64, 160), (2, 32, 256)])
def test_dequantize_mxfp8(fastpath_backend, reference_backend, cuda, fp8_dtype, out_dtype, columnwise, shape):
    m, k = math.prod(shape[:-1]), shape[-1]
    if columnwise:
        scale_shape = ((m // 32 + 3) // 4 * 4, (k + 127) // 128 * 128)
    else:
        scale_shape = ((m + 127) // 128 * 128, (k // 32 + 3) // 4 * 4)
    scale = random_bytes(scale_shape, cuda, seed=1)  # 0 (2^-127), 254, 255 (NaN) included
    (ref, *_), (fast, *_) = run_both(reference_backend, fastpath_backend, "dequantize_mxfp8", random_bytes(shape, cuda),
                                     scale, fp8_dtype=fp8_dtype, columnwise=columnwise, out_dtype=out_dtype)
    assert_identical(ref, fast, f"dequantize_mxfp8 {fp8_dtype} {out_dtype} col={columnwise} {shape}")


# ------------------------------------------------------------------ FP8 block scaling
BLOCK_SHAPES = [(), (7,), (3, 5), (1, 200), (128, 128), (130, 260), (2, 70, 136), (1024, 2048)]
#: (force_pow_2_scales, amax_epsilon, input mode)
BLOCK_VARIANTS = [(True, 0.0, "plain"), (False, 0.0, "edge"), (False, 1e-3, "inf"), (True, 1e-30, "edge")]


@pytest.mark.parametrize("dtype,fp8_dtype,usage", cases(DTYPES, FP8_DTYPES, USAGES))
@pytest.mark.parametrize("dim", [1, 2])
@pytest.mark.parametrize("pow2,eps,mode", BLOCK_VARIANTS)
@pytest.mark.parametrize("shape", BLOCK_SHAPES)
def test_quantize_float8_block(fastpath_backend, reference_backend, cuda, dtype, fp8_dtype, usage, dim, pow2, eps,
                               mode, shape):
    x = make_input(shape, dtype, cuda, mode, seed=4, transposed=shape == (130, 260))
    (ref, *_), (fast, *_) = run_both(
        reference_backend, fastpath_backend, "quantize_float8_block", x, fp8_dtype=fp8_dtype, rowwise=usage[0],
        columnwise=usage[1], block_scaling_dim=dim, force_pow_2_scales=pow2, amax_epsilon=eps)
    assert_identical(ref, fast, f"quantize_float8_block {dtype} {fp8_dtype} {usage} dim={dim} pow2={pow2} "
                                f"eps={eps} {shape} {mode}")


def test_quantize_float8_block_rejects_the_same_options(fastpath_backend, reference_backend, cuda):
    x = make_input((128, 128), torch.bfloat16, cuda)
    for kwargs in (dict(block_scaling_dim=3, fp8_dtype=torch.float8_e4m3fn),
                   dict(block_scaling_dim=1, fp8_dtype=torch.float16)):
        assert_same_error(reference_backend, fastpath_backend, "quantize_float8_block", x, rowwise=True,
                          columnwise=True, force_pow_2_scales=True, amax_epsilon=0.0, **kwargs)


@pytest.mark.parametrize("fp8_dtype,out_dtype,dim", cases(FP8_DTYPES, DTYPES, [1, 2]))
@pytest.mark.parametrize("shape", [(3, 5), (130, 260), (2, 70, 144)])
def test_dequantize_float8_block(fastpath_backend, reference_backend, cuda, fp8_dtype, out_dtype, dim, shape):
    x = make_input(shape, torch.bfloat16, cuda, "edge", seed=5)
    for columnwise in (False, True):
        row_data, row_scale, col_data, col_scale = reference_backend.quantize_float8_block(
            x, fp8_dtype=fp8_dtype, rowwise=True, columnwise=True, block_scaling_dim=dim, force_pow_2_scales=False,
            amax_epsilon=0.0)
        data, scale = (col_data, col_scale) if columnwise else (row_data, row_scale)
        data = random_bytes(tuple(data.shape), cuda, seed=6)  # every byte value under real scales
        (ref, *_), (fast, *_) = run_both(reference_backend, fastpath_backend, "dequantize_float8_block", data, scale,
                                         fp8_dtype=fp8_dtype, columnwise=columnwise, block_scaling_dim=dim,
                                         out_dtype=out_dtype)
        assert_identical(ref, fast, f"dequantize_float8_block {fp8_dtype} {out_dtype} dim={dim} {shape} "
                                    f"col={columnwise}")


# ------------------------------------------------------------------ independence from -ftz
QUANTIZE_KERNEL_FILES = ["cast_fp8.cu", "mxfp8.cu", "fp8_block.cu", "nvfp4.cu"]
#: The fast path's nvcc flags with subnormals flushed: what CuPy's RawModule would compile with.
FTZ_FLAGS = tuple(f for f in NVCC_FLAGS if not f.startswith("--ftz")) + ("--ftz=true",)
FTZ_BUILDS = [Build(name, FTZ_FLAGS, "ptx", source=KERNEL_DIR / name) for name in QUANTIZE_KERNEL_FILES]


@pytest.mark.compile(*FTZ_BUILDS)
def test_quantize_kernels_keep_subnormals_under_ftz(nvcc_builds):
    """CuPy appends ``-ftz=true`` to every NVRTC compile, after the caller's options, and NVRTC honours the
    last occurrence; the reference keeps subnormals. So the quantization kernels must not depend on the
    flag: compiled with ``--ftz=true`` their PTX holds no ``.ftz`` instruction. Runs wherever nvcc is."""
    for build in FTZ_BUILDS:
        result = nvcc_builds.result(build)
        assert result.ok and result.ptx, f"{build.name} does not compile with {FTZ_FLAGS}:\n{result.output}"
        flushing = [line.strip() for line in result.ptx.splitlines() if ".ftz" in line]
        assert not flushing, (f"{build.name}: {len(flushing)} PTX instructions flush subnormals under --ftz=true, "
                              f"first: {flushing[0]}")


def test_helpers_compare_bits(cuda):
    """The comparison itself: NaN payloads and signed zeros count, the message names the index."""
    a = torch.tensor([0.0, 1.0], device=cuda)
    assert_identical(a, a.clone(), "same")
    with pytest.raises(AssertionError, match=r"index \(0,\)"):
        assert_identical(a, torch.tensor([-0.0, 1.0], device=cuda), "signed zero")
    nan_a = torch.tensor([0x7FC00000], dtype=torch.int32).view(torch.float32)
    nan_b = torch.tensor([0x7FFFFFFF], dtype=torch.int32).view(torch.float32)
    with pytest.raises(AssertionError):
        assert_identical(nan_a, nan_b, "nan payload")

