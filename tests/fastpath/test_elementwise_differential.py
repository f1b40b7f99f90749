"""Fast-path activations, bias + activation and dbias against the reference backend on the same GPU.

Element-wise results must be bit-identical (NaN compares equal to NaN, any
payload); dbias is a reduction in a different order and is held to a bound on
fp32 summation error. The GPU tests skip with the reason when CuPy or a GPU is
missing; the tests at the end check, on any machine, the tables and constants
the kernels hard-code and the fallback to the reference (the compile options:
test_nvrtc_compile.py).
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional

import numpy as np
import pytest
import torch

import refops
from fastpath import _cuda
from fastpath.backend import FastpathKernels
from fastpath.elementwise import ACTIVATION_GROUPS, FP32_CONSTANTS, GATED_ACTIVATIONS, UNARY_ACTIVATIONS
from refops.kernels import ReferenceKernels
from refops.kernels.reference import activations as ref_act

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ACTIVATIONS = UNARY_ACTIVATIONS + GATED_ACTIVATIONS
#: Parameters each activation is called with (the others take none).
PARAMS: dict[str, dict[str, float]] = {
    "clamped_swiglu": {"limit": 0.75, "alpha": 1.702, "glu_linear_offset": 1.0},
    "situglu": {"beta1": 3.0, "beta2": 0.7},  # 1/3 and 1/0.7 are inexact: exercises torch's x / beta
}
#: Leading shapes x last dims; last dims cover 16-byte vectors, odd widths (single elements) and one element.
SHAPES = [(1, 2), (1, 64), (7, 18), (3, 5, 40), (33, 1000), (2, 1, 4096), (5, 3), (257, 24)]


def _ids(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))


# ------------------------------------------------------------------ helpers
def assert_bits_equal(actual: torch.Tensor, expected: torch.Tensor, what: str,
                      inputs: Optional[dict[str, torch.Tensor]] = None) -> None:
    """Same shape, dtype and bits (NaN == NaN); on failure name the first differing index and values."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != reference {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != reference {expected.dtype}"
    a, e = actual.detach().reshape(-1), expected.detach().reshape(-1)
    bits = {4: torch.int32, 2: torch.int16}[a.element_size()]
    differ = (a.view(bits) != e.view(bits)) & ~(torch.isnan(a) & torch.isnan(e))
    count = int(differ.sum())
    if count == 0:
        return
    flat = int(differ.nonzero()[0, 0])
    index = tuple(int(i) for i in np.unravel_index(flat, tuple(actual.shape)))
    mask = (1 << (8 * a.element_size())) - 1

    def show(t: torch.Tensor) -> str:
        return f"{t[flat].item()!r} (0x{int(t.view(bits)[flat]) & mask:0{2 * a.element_size()}x})"

    lines = [f"{what}: {count} of {a.numel()} elements differ; first at index {index}: "
             f"fastpath {show(a)} vs reference {show(e)}"]
    for name, t in (inputs or {}).items():
        if t.shape == actual.shape:
            lines.append(f"  {name}[{index}] = {t.reshape(-1)[flat].item()!r}")
    raise AssertionError("\n".join(lines))


def assert_column_sums_close(actual: torch.Tensor, expected: torch.Tensor, summands: torch.Tensor,
                             what: str) -> None:
    """``|a - e| <= 2 ulp(e) + 1e-6 * sum_rows |g|``: fp32 sums in two orders, each rounded once."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, what
    a, e = actual.double(), expected.double()
    scale = summands.double().abs().reshape(-1, summands.shape[-1]).sum(dim=0)
    ulp = torch.finfo(actual.dtype).eps * e.abs().clamp_min(torch.finfo(actual.dtype).tiny)
    bound = 2 * ulp + 1e-6 * scale
    bad = ((a - e).abs() > bound) | (torch.isnan(a) != torch.isnan(e))
    if bad.any():
        i = int(bad.nonzero()[0, 0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {a.numel()} column sums differ beyond the bound; "
                             f"first at column {i}: fastpath {a[i].item()!r} vs reference {e[i].item()!r} "
                             f"(bound {bound[i].item():.3e})")


def run_both(reference_backend, fastpath_backend, method: str, *args: Any, **kwargs: Any):
    """``(fastpath result, reference result)`` of the same kernel method on the same inputs."""
    with refops.use_backend(reference_backend) as ref:
        expected = getattr(ref, method)(*args, **kwargs)
    with refops.use_backend(fastpath_backend) as fast:
        actual = getattr(fast, method)(*args, **kwargs)
    torch.cuda.synchronize()
    return actual, expected


def make_input(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, *, scale: float = 3.0,
               seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype).to(device)


def special_values(dtype: torch.dtype) -> torch.Tensor:
    """NaN, infinities, signed zeros, tiny and huge values, clamp boundaries of this dtype."""
    big = torch.finfo(dtype).max
    values = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-30, -1e-30, 1e-7, -1e-7, 0.75, -0.75, 1.0, -1.0,
              20.0, -20.0, 88.0, -88.0, 89.0, -104.0, big, -big, big / 2, 3.0, -3.0]
    return torch.tensor(values, dtype=torch.float32).to(dtype)


def gated_width(activation: str, width: int) -> bool:
    return activation in UNARY_ACTIVATIONS or width % 2 == 0


# ------------------------------------------------------------ forward/backward
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_activation_forward_and_backward_bit_exact(activation, dtype, shape, cuda, reference_backend,
                                                   fastpath_backend):
    if not gated_width(activation, shape[-1]):
        pytest.skip("gated activations need an even last dim (tested in test_errors_match_the_reference)")
    params = PARAMS.get(activation, {})
    x = make_input(shape, dtype, cuda)
    y, y_ref = run_both(reference_backend, fastpath_backend, "activation_forward", x, activation, **params)
    assert_bits_equal(y, y_ref, f"{activation} forward {dtype}", {"x": x})
    dy = make_input(y_ref.shape, dtype, cuda, scale=1.0, seed=1)
    dx, dx_ref = run_both(reference_backend, fastpath_backend, "activation_backward", dy, x, activation, **params)
    assert_bits_equal(dx, dx_ref, f"{activation} backward {dtype}", {"x": x})


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_special_values(activation, dtype, cuda, reference_backend, fastpath_backend):
    """NaN, +-inf, +-0, tiny, huge and clamp-boundary inputs, in both halves of gated activations."""
    params = PARAMS.get(activation, {})
    specials = special_values(dtype)
    n = specials.numel()
    a = specials.reshape(1, n).repeat(n, 1)
    b = specials.reshape(n, 1).repeat(1, n)  # every pair of specials (a, b) appears once
    x = (torch.cat([a, b], dim=-1) if activation in GATED_ACTIVATIONS else torch.cat([a, b], dim=0)).to(cuda)
    y, y_ref = run_both(reference_backend, fastpath_backend, "activation_forward", x, activation, **params)
    assert_bits_equal(y, y_ref, f"{activation} forward on special values {dtype}")
    dy = make_input(y_ref.shape, dtype, cuda, scale=1.0, seed=2)
    dy[0, : min(n, dy.shape[1])] = specials[: min(n, dy.shape[1])].to(cuda)
    dx, dx_ref = run_both(reference_backend, fastpath_backend, "activation_backward", dy, x, activation, **params)
    assert_bits_equal(dx, dx_ref, f"{activation} backward on special values {dtype}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", ["gelu", "swiglu", "relu", "situglu"])
def test_non_contiguous_and_offset_inputs(activation, dtype, cuda, reference_backend, fastpath_backend):
    """A transposed view, a strided view and a view at an odd element offset (unaligned pointer)."""
    params = PARAMS.get(activation, {})
    base = make_input((64, 132), dtype, cuda)
    views = {
        "transposed": base[:, :64].t(),
        "strided": base[:, ::2],
        "offset": base.reshape(-1)[1:1 + 65 * 128].reshape(65, 128),  # contiguous, pointer not 16-byte aligned
    }
    for name, x in views.items():
        y, y_ref = run_both(reference_backend, fastpath_backend, "activation_forward", x, activation, **params)
        assert_bits_equal(y, y_ref, f"{activation} forward, {name} input, {dtype}")
        dy_base = make_input((y_ref.shape[0], y_ref.shape[1] * 2), dtype, cuda, scale=1.0, seed=3)
        dy = dy_base[:, ::2]
        dx, dx_ref = run_both(reference_backend, fastpath_backend, "activation_backward", dy, x, activation,
                              **params)
        assert_bits_equal(dx, dx_ref, f"{activation} backward, {name} input, {dtype}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_empty_tensors(dtype, cuda, reference_backend, fastpath_backend):
    for activation in ("gelu", "swiglu"):
        x = torch.empty((0, 16), dtype=dtype, device=cuda)
        y, y_ref = run_both(reference_backend, fastpath_backend, "activation_forward", x, activation)
        assert y.shape == y_ref.shape == (0, 16 if activation == "gelu" else 8)
        dx, dx_ref = run_both(reference_backend, fastpath_backend, "activation_backward", y_ref, x, activation)
        assert dx.shape == dx_ref.shape == x.shape
    db, db_ref = run_both(reference_backend, fastpath_backend, "dbias", torch.empty((0, 16), dtype=dtype, device=cuda))
    assert_bits_equal(db, db_ref, "dbias of an empty tensor")


# ------------------------------------------------------------ SiTU-GLU by table
#: SiTU-GLU parameters for the table kernel: the tests' inexact reciprocals and the benchmark's.
SITU_PARAMS = [{"beta1": 3.0, "beta2": 0.7}, {"beta1": 4.0, "beta2": 25.0}]


def record_launches(monkeypatch) -> list[str]:
    """The names of the elementwise kernels launched from now on, in order (kernels are also looked up to size
    grids, so lookups alone do not count)."""
    import fastpath.elementwise as elementwise

    names, launched = {}, []  # kernels looked up (a launch's grid sizing looks some up too), and those launched
    kernel, launch = elementwise._kernel, elementwise._cuda.launch

    def look_up(group, name, index):
        k = kernel(group, name, index)
        names[id(k)] = name
        return k

    def record(k, *args, **kwargs):
        launched.append(names.get(id(k), repr(k)))
        return launch(k, *args, **kwargs)

    monkeypatch.setattr(elementwise, "_kernel", look_up)
    monkeypatch.setattr(elementwise._cuda, "launch", record)
    return launched


@pytest.fixture
def situ_table_always(monkeypatch):
    """Every vectorizable bf16 SiTU-GLU forward takes act_fwd_situglu_table_bf16 (normally from 2^20 outputs)."""
    import fastpath.elementwise as elementwise

    monkeypatch.setattr(elementwise, "_SITU_TABLE_MIN_OUTPUTS", 0)
    monkeypatch.setattr(elementwise, "_SITU_TABLE_WITH_BIAS", True)
    return record_launches(monkeypatch)


def every_bf16_pair() -> torch.Tensor:
    """(8192, 16) bf16: the gate half holds every one of the 65536 bit patterns once, the linear half too
    (rotated, so each gate value meets a different linear value)."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    a = bits.reshape(8192, 8)
    b = bits.roll(12345).reshape(8192, 8)
    return torch.cat([a, b], dim=-1)


@pytest.mark.parametrize("params", SITU_PARAMS, ids=lambda p: f"b{p['beta1']}-{p['beta2']}")
@pytest.mark.parametrize("with_bias", [False, True], ids=["x", "x+bias"])
def test_situglu_table_kernel_on_every_bf16_input(with_bias, params, situ_table_always, cuda, reference_backend,
                                                  fastpath_backend):
    """Every bf16 gate input and every linear input (NaN, inf, subnormals, the table's edges) bit for bit."""
    x = every_bf16_pair().to(cuda)
    if with_bias:
        bias = make_input((16,), torch.bfloat16, cuda, scale=0.5, seed=7)
        (y, pre), (y_ref, pre_ref) = run_both(reference_backend, fastpath_backend, "bias_activation_forward", x,
                                              bias, "situglu", **params)
        assert_bits_equal(pre, pre_ref, "situglu table x + bias")
    else:
        y, y_ref = run_both(reference_backend, fastpath_backend, "activation_forward", x, "situglu", **params)
    assert_bits_equal(y, y_ref, f"situglu table forward, bias={with_bias}, {params}")
    assert "act_fwd_situglu_table_bf16" in situ_table_always


@pytest.mark.parametrize("shape", [(1, 16), (7, 32), (3, 5, 48), (33, 1024), (2, 1, 4096), (257, 16)], ids=_ids)
def test_situglu_table_kernel_on_random_shapes(shape, situ_table_always, cuda, reference_backend, fastpath_backend):
    x = make_input(shape, torch.bfloat16, cuda, scale=20.0)
    y, y_ref = run_both(reference_backend, fastpath_backend, "activation_forward", x, "situglu",
                        **PARAMS["situglu"])
    assert_bits_equal(y, y_ref, f"situglu table forward {shape}", {"x": x})
    assert "act_fwd_situglu_table_bf16" in situ_table_always


def test_situglu_table_kernel_is_what_large_bf16_inputs_take(cuda, fastpath_backend, monkeypatch):
    launched = record_launches(monkeypatch)
    x = make_input((1024, 2048), torch.bfloat16, cuda)  # 2^20 outputs
    with refops.use_backend(fastpath_backend) as fast:
        fast.activation_forward(x[:, :1024].contiguous(), "situglu", **PARAMS["situglu"])  # 2^19 outputs
        fast.activation_forward(x, "situglu", **PARAMS["situglu"])
        fast.bias_activation_forward(x, torch.zeros(2048, dtype=x.dtype, device=cuda), "situglu",
                                     **PARAMS["situglu"])  # with a bias: the plain kernel
    assert launched == ["act_fwd_situglu_bf16", "act_fwd_situglu_table_bf16", "act_fwd_situglu_bf16"]


# ------------------------------------------------------------ bias + activation
@pytest.mark.parametrize("shape", [(1, 64), (7, 18), (3, 5, 40), (33, 1000), (2, 4096)], ids=_ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_bias_activation_forward(activation, dtype, shape, cuda, reference_backend, fastpath_backend):
    if not gated_width(activation, shape[-1]):
        pytest.skip("gated activations need an even last dim")
    params = PARAMS.get(activation, {})
    x = make_input(shape, dtype, cuda)
    bias = make_input((shape[-1],), dtype, cuda, seed=4)
    (y, pre), (y_ref, pre_ref) = run_both(reference_backend, fastpath_backend, "bias_activation_forward", x, bias,
                                          activation, **params)
    assert_bits_equal(pre, pre_ref, f"{activation} x + bias {dtype}", {"x": x})
    assert_bits_equal(y, y_ref, f"{activation}(x + bias) {dtype}")
    (y, pre), (y_ref, pre_ref) = run_both(reference_backend, fastpath_backend, "bias_activation_forward", x, None,
                                          activation, **params)
    assert_bits_equal(y, y_ref, f"{activation}(x), no bias, {dtype}")
    assert pre is x and pre_ref is x


# ---------------------------------------------------------------------- dbias
@pytest.mark.parametrize("shape", [(1, 8), (5, 3), (257, 24), (3, 5, 40), (4096, 64), (300, 1000), (64, 8192)],
                         ids=_ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dbias(dtype, shape, cuda, reference_backend, fastpath_backend):
    g = make_input(shape, dtype, cuda, scale=1.0)
    db, db_ref = run_both(reference_backend, fastpath_backend, "dbias", g)
    assert_column_sums_close(db, db_ref, g, f"dbias {dtype} {shape}")
    gt = make_input((shape[-1], 2 * max(shape[0], 1)), dtype, cuda, scale=1.0).t()[::2]  # non-contiguous
    db, db_ref = run_both(reference_backend, fastpath_backend, "dbias", gt)
    assert_column_sums_close(db, db_ref, gt, f"dbias of a non-contiguous {dtype} tensor")


@pytest.mark.parametrize("shape", [(1, 64), (7, 18), (257, 24), (3, 5, 40), (512, 1000), (64, 4096)], ids=_ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", ["identity", "gelu", "relu", "silu", "geglu", "swiglu", "clamped_swiglu"])
def test_activation_backward_dbias(activation, dtype, shape, cuda, reference_backend, fastpath_backend):
    if not gated_width(activation, shape[-1]):
        pytest.skip("gated activations need an even last dim")
    params = PARAMS.get(activation, {})
    x = make_input(shape, dtype, cuda)
    n = shape[-1] // 2 if activation in GATED_ACTIVATIONS else shape[-1]
    dy = make_input((*shape[:-1], n), dtype, cuda, scale=1.0, seed=5)
    (dx, db), (dx_ref, db_ref) = run_both(reference_backend, fastpath_backend, "activation_backward_dbias", dy, x,
                                          activation, **params)
    assert_bits_equal(dx, dx_ref, f"{activation} backward (with dbias) {dtype}", {"x": x})
    assert_column_sums_close(db, db_ref, dx_ref, f"{activation} dbias {dtype}")


# --------------------------------------------------------------------- errors
@pytest.mark.parametrize("call", [
    ("activation_forward", lambda x: (x[:, :7], "swiglu"), {}),
    ("activation_forward", lambda x: (x, "no_such_activation"), {}),
    ("activation_forward", lambda x: (x, "clamped_swiglu"), {"limit": 1.0}),
    ("activation_backward", lambda x: (x[:, :4], x[:, :7], "geglu"), {}),
    ("bias_activation_forward", lambda x: (x, x[0, :3], "gelu"), {}),
], ids=["odd-gated-width", "unknown-activation", "missing-param", "odd-gated-backward", "bad-bias-shape"])
def test_errors_match_the_reference(call, cuda, reference_backend, fastpath_backend):
    method, make_args, params = call
    x = make_input((4, 16), torch.float32, cuda)
    errors = []
    for backend in (reference_backend, fastpath_backend):
        with refops.use_backend(backend) as kernels, pytest.raises(Exception) as info:
            getattr(kernels, method)(*make_args(x), **params)
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1]


# ------------------------------------------------------- any machine (no GPU)
def test_activation_tables_match_the_reference():
    assert set(UNARY_ACTIVATIONS) == set(ref_act.UNARY)
    assert set(GATED_ACTIVATIONS) == set(ref_act.GATED)


def test_fp32_constants_are_the_references_rounded_to_fp32():
    expected = {
        "SQRT_2_OVER_PI": ref_act._SQRT_2_OVER_PI,
        "GELU_CUBIC": ref_act._GELU_CUBIC,
        "GELU_CUBIC_X3": 3.0 * ref_act._GELU_CUBIC,  # Python multiplies the two floats first
        "QGELU_ALPHA": ref_act._QGELU_ALPHA,
    }
    source = (_cuda.KERNEL_DIR / "activation_functions.cuh").read_text()  # activation.cu's device functions
    for name, value in expected.items():
        assert FP32_CONSTANTS[name] == float(np.float32(value)), name
        literal = re.search(rf"#define {name} (\S+)f\b", source).group(1)
        assert float.fromhex(literal) == FP32_CONSTANTS[name], f"{name} in activation_functions.cuh is {literal}"
    assert '#include "activation_functions.cuh"' in (_cuda.KERNEL_DIR / "activation.cu").read_text()


def test_activation_groups_match_the_source():
    """elementwise.ACTIVATION_GROUPS numbers the `#if GROUP_ENABLED(k)` blocks of activation.cu."""
    source = (_cuda.KERNEL_DIR / "activation.cu").read_text()
    found = dict(re.findall(r"#if GROUP_ENABLED\((\d+)\)\nDEFINE_ACTIVATION\((\w+),", source))
    assert {name: int(k) for k, name in found.items()} == {
        name: k for name, k in ACTIVATION_GROUPS.items() if name != "dbias"
    }
    assert re.search(rf"#if GROUP_ENABLED\({ACTIVATION_GROUPS['dbias']}\)\nDEFINE_DBIAS", source)


@pytest.mark.parametrize("activation", ["gelu", "swiglu", "situglu"])
def test_cpu_tensors_fall_back_to_the_reference(activation):
    """On CPU the fast path is the reference, bit for bit (no CuPy needed)."""
    fast, ref = FastpathKernels(), ReferenceKernels()
    params = PARAMS.get(activation, {})
    x = make_input((6, 32), torch.bfloat16, torch.device("cpu"))
    dy = make_input((6, 16 if activation in GATED_ACTIVATIONS else 32), torch.bfloat16, torch.device("cpu"), seed=1)
    assert_bits_equal(fast.activation_forward(x, activation, **params),
                      ref.activation_forward(x, activation, **params), activation)
    assert_bits_equal(fast.activation_backward(dy, x, activation, **params),
                      ref.activation_backward(dy, x, activation, **params), activation)
    assert_bits_equal(fast.dbias(dy), ref.dbias(dy), "dbias")


def test_flat_views_vectorize_any_shape():
    """A unary activation without bias runs on a flat (rows, n) view: 16-byte vectors whenever numel allows."""
    from fastpath.elementwise import _flat_shape

    assert _flat_shape(16384 * 8192, 8, True) == (16384, 8192)
    assert _flat_shape(33 * 1000, 8, True) == (4125, 8)
    assert _flat_shape(15, 8, False) == (15, 1)
    assert _flat_shape(3 * 5 * 40, 4, True) == (75, 8)
