"""``GemmOperand``: what a GEMM reads of a quantized tensor (``refops/kernels/gemm_operand.py``).

For every recipe and usage, ``gemm_operand(usage)`` hands over the tensor's own arrays (the same storage, no
copy) in the layout the record documents (``refops.layouts``), and those arrays alone reproduce the tensor's
values bit for bit (``dequantize_gemm_operand``); a ``GemmOperand`` given to ``gemm`` directly is the tensor.
And the fast path never reads a quantized tensor's private attributes: only this record.
"""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

import fastpath
import refops
from refops import layouts
from refops.kernels import ReferenceKernels
from refops.kernels.gemm_operand import dequantize_gemm_operand
from refops.quantization import (
    DType,
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
    QuantizedTensor,
)
from refops.quantization.quantized_tensor import TENSOR_CLASSES

USAGES = ("rowwise", "columnwise")

#: name -> a quantizer of both usages (every recipe's tensor class and the layout options that change its arrays).
QUANTIZERS = {
    "fp8_delayed": lambda: Float8Quantizer(torch.tensor([2.0]), torch.zeros(1), DType.kFloat8E4M3),
    "fp8_current_e5m2": lambda: Float8CurrentScalingQuantizer(DType.kFloat8E5M2),
    "mxfp8": lambda: MXFP8Quantizer(DType.kFloat8E4M3),
    "mxfp8_2d": lambda: MXFP8Quantizer(DType.kFloat8E5M2, with_2d_quantization=True),
    "fp8_block_1d": lambda: Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=1),
    "fp8_block_2d": lambda: Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=2),
    "nvfp4": lambda: NVFP4Quantizer(),
    "nvfp4_2d": lambda: NVFP4Quantizer(with_2d_quantization=True),
    "nvfp4_rht": lambda: NVFP4Quantizer(with_rht=True),
    "nvfp4_4over6": lambda: NVFP4Quantizer(nvfp4_use_4over6=True, nvfp4_e4m3_max=256),
}
#: Shapes every recipe takes: 2-D, 3-D (leading dims flatten into rows), rows not a multiple of 128.
SHAPES = [(64, 96), (2, 48, 64), (160, 32)]


def quantized(name: str, shape: tuple[int, ...], seed: int = 0) -> QuantizedTensor:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 4
    return QUANTIZERS[name]()(x.to(torch.bfloat16))


def stored(qt: QuantizedTensor, usage: str) -> dict:
    """The tensor's own arrays of ``usage`` (what the operand must hand over, as views)."""
    if type(qt).__name__ == "Float8Tensor":
        return {"data": qt._data if usage == "rowwise" else qt._transpose, "scale_inv": qt._scale_inv}
    arrays = {"data": getattr(qt, f"_{usage}_data"), "scale_inv": getattr(qt, f"_{usage}_scale_inv")}
    if type(qt).__name__ == "NVFP4Tensor":
        arrays["amax"] = getattr(qt, f"_amax_{usage}")
    return arrays


def documented_layout(name: str, qt: QuantizedTensor, usage: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(data shape, scale_inv shape)`` of the operand, as ``GemmOperand`` and ``refops.layouts`` document them."""
    rows, last = layouts.rows_cols(qt.shape)
    col = usage == "columnwise"
    contracted_last = (last, rows) if col else (rows, last)
    if name.startswith("fp8_block"):
        dim = 2 if name.endswith("2d") else 1
        return contracted_last, layouts.float8_block_scale_shape(qt.shape, columnwise=col, block_scaling_dim=dim)
    if name.startswith("fp8"):
        return contracted_last, (1,)
    if name.startswith("mxfp8"):
        return (rows, last), layouts.mxfp8_scale_shape(qt.shape, columnwise=col)
    packed = (contracted_last[0], contracted_last[1] // 2)
    return packed, layouts.nvfp4_scale_shape(qt.shape, columnwise=col)


CASES = [(name, shape, usage) for name in QUANTIZERS for shape in SHAPES for usage in USAGES]


@pytest.mark.parametrize("name,shape,usage", CASES, ids=[f"{n}-{'x'.join(map(str, s))}-{u}" for n, s, u in CASES])
def test_the_operand_hands_over_the_tensor_s_own_arrays_in_the_documented_layout(name, shape, usage):
    qt = quantized(name, shape)
    op = qt.gemm_operand(usage)
    rows, last = layouts.rows_cols(shape)
    assert op.shape == (rows, last) and op.usage == usage and op.format == qt._GEMM_FORMAT
    data_shape, scale_shape = documented_layout(name, qt, usage)
    assert tuple(op.data.shape) == data_shape and op.data.dtype == torch.uint8 and op.data.is_contiguous()
    assert tuple(op.scale_inv.shape) == tuple(scale_shape)
    for field, array in stored(qt, usage).items():
        given = getattr(op, field)
        # the same storage, the same bytes: a view of the tensor's array, never a copy
        assert given.data_ptr() == array.data_ptr() and torch.equal(given.reshape(-1), array.reshape(-1)), field
    fp8 = name.startswith(("fp8", "mxfp8"))
    assert (op.fp8_dtype is not None) == fp8
    if fp8:
        assert op.fp8_dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    assert op.block_scaling_dim == ({"fp8_block_1d": 1, "fp8_block_2d": 2}.get(name))
    assert (op.e4m3_max is not None) == name.startswith("nvfp4")
    if name.startswith("nvfp4"):
        assert op.e4m3_max == (256.0 if name == "nvfp4_4over6" else 448.0)
    assert op.hadamard == (name == "nvfp4_rht" and usage == "columnwise")
    # the exact values are the flattened dequantization; values=False leaves them out
    assert torch.equal(op.values, qt.dequantize(dtype=torch.float32, usage=usage).reshape(rows, last))
    assert qt.gemm_operand(usage, values=False).values is None


@pytest.mark.parametrize("name,shape,usage", CASES, ids=[f"{n}-{'x'.join(map(str, s))}-{u}" for n, s, u in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_arrays_alone_give_the_tensor_s_values_bit_for_bit(name, shape, usage, dtype):
    qt = quantized(name, shape, seed=1)
    got = dequantize_gemm_operand(qt.gemm_operand(usage, values=False), ReferenceKernels(), dtype)
    want = qt.dequantize(dtype=dtype, usage=usage)
    assert got.dtype == dtype and tuple(got.shape) == layouts.rows_cols(shape)
    assert torch.equal(got.contiguous().view(torch.uint8), want.reshape(got.shape).contiguous().view(torch.uint8))


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_a_gemm_operand_given_directly_is_the_tensor(name):
    a, b = quantized(name, (64, 96), seed=2), quantized(name, (32, 96), seed=3)
    kernels = ReferenceKernels()
    for trans_a, trans_b in [(False, True), (True, False)]:
        ua, ub = ("columnwise" if trans_a else "rowwise"), ("rowwise" if trans_b else "columnwise")
        b_ = b if trans_b else quantized(name, (64, 32), seed=4)
        want = kernels.gemm(a, b_, trans_a=trans_a, trans_b=trans_b, out_dtype=torch.float32)
        got = kernels.gemm(a.gemm_operand(ua), b_.gemm_operand(ub), trans_a=trans_a, trans_b=trans_b,
                           out_dtype=torch.float32)
        assert torch.equal(got, want), (trans_a, trans_b)


def test_an_operand_of_a_missing_usage_is_refused_with_the_tensor_s_name():
    rows_only = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, columnwise=False)(torch.randn(16, 32))
    with pytest.raises(ValueError, match="without columnwise data"):
        rows_only.gemm_operand("columnwise", name="b")
    with pytest.raises(ValueError, match="GemmOperand of rowwise data"):
        ReferenceKernels().gemm(torch.randn(16, 32), rows_only.gemm_operand("rowwise"), out_dtype=torch.float32)


# ------------------------------------------------------------------ the seam
def _private_fields() -> set[str]:
    """Every private attribute name of refops's quantized tensors: their arrays and metadata, and the private
    attributes and methods their classes define (torch.Tensor's own are not theirs)."""
    names = {"_quantizer"}
    for cls in {QuantizedTensor, *TENSOR_CLASSES.values()}:
        names.update(cls._ROWWISE + cls._COLUMNWISE + cls._SHARED)
        names.update(cls._CTOR_TENSORS.values())
        names.update(attr for attr, _ in cls._CTOR_META.values())
        names.update(n for n in vars(cls) if n.startswith("_") and not n.startswith("__"))
    return names


def test_the_private_field_list_knows_the_arrays():
    fields = _private_fields()
    assert {"_data", "_transpose", "_scale_inv", "_rowwise_data", "_columnwise_scale_inv", "_amax_rowwise",
            "_is_2D_scaled", "_fp8_dtype", "_columnwise_rht", "_gemm_arrays", "_dequantize_usage"} <= fields


def test_the_fast_path_reads_no_private_attribute_of_a_quantized_tensor():
    """The fast path is a backend: it sees quantized operands only through ``GemmOperand`` (and the public
    tensor API), never a quantized tensor's private attributes (``refops/kernels/interface.py``)."""
    fields = _private_fields()
    root = pathlib.Path(fastpath.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Attribute):
                name = node.attr
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "setattr", "hasattr")
                  and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)):
                name = node.args[1].value
            if name in fields:
                offenders.append(f"{path.relative_to(root.parent)}:{node.lineno}: {name}")
    assert not offenders, "fastpath reads private attributes of refops's quantized tensors:\n" + "\n".join(offenders)


def test_the_fast_path_does_not_import_refops_quantization():
    root = pathlib.Path(fastpath.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            modules = []
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            offenders += [f"{path.name}:{node.lineno}: {m}" for m in modules if m.startswith("refops.quantization")]
    assert not offenders, offenders


def test_the_module_cites_this_test():
    assert "tests/refops/kernels/test_gemm_operand.py" in refops.kernels.gemm_operand.__doc__
