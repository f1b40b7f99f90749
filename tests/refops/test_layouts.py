"""``refops.layouts``: each shape function against the arrays the reference quantizers actually produce, for every
recipe, on shapes the blocks do not divide, 1-D and 3-D ones; and that no other module restates them."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

import fastpath
import refops
from refops import layouts
from refops.quantization import (
    DType,
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
)


def randn(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3).to(torch.bfloat16)


def assert_zero_padded(scale: torch.Tensor, valid: tuple[int, int]) -> None:
    """Everything outside the valid region is zero (refops zero-fills what TE leaves uninitialized)."""
    outside = torch.ones(scale.shape, dtype=torch.bool)
    outside[: valid[0], : valid[1]] = False
    assert not scale[outside].view(torch.uint8).any()


# ------------------------------------------------------------------ integers and the row-major form
def test_ceil_div_and_round_up():
    for n in range(0, 300):
        for d in (1, 4, 16, 32, 128):
            assert layouts.ceil_div(n, d) == -(-n // d) == (n + d - 1) // d
            r = layouts.round_up(n, d)
            assert r % d == 0 and n <= r < n + d


@pytest.mark.parametrize("shape,expected", [((), (1, 1)), ((7,), (1, 7)), ((3, 5), (3, 5)), ((2, 3, 5), (6, 5)),
                                            ((4, 0), (4, 0)), ((0, 3, 8), (0, 8))])
def test_rows_cols_is_the_row_major_form(shape, expected):
    assert layouts.rows_cols(shape) == layouts.rows_cols(torch.Size(shape)) == expected
    assert layouts.rows_cols(iter(shape)) == expected  # any iterable of ints


@pytest.mark.parametrize("shape", [(), (7,), (3, 5), (2, 3, 5)])
def test_the_columnwise_copy_is_the_transpose_of_the_row_major_form(shape):
    data = torch.arange(max(1, torch.Size(shape).numel()), dtype=torch.uint8).reshape(shape)
    col = layouts.columnwise_layout(data)
    assert tuple(col.shape) == layouts.columnwise_shape(shape) and col.is_contiguous()
    m, k = layouts.rows_cols(shape)
    assert torch.equal(col.reshape(k, m), data.reshape(m, k).t())
    back = layouts.rowwise_layout(col, shape)
    assert torch.equal(back, data) and back.is_contiguous()
    q = Float8CurrentScalingQuantizer(DType.kFloat8E4M3)(data.float())
    assert torch.equal(q._transpose, layouts.columnwise_layout(q._data))  # what the reference produces


def test_zero_padded():
    valid = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 1
    out = layouts.zero_padded(valid, (4, 4))
    assert out.shape == (4, 4) and torch.equal(out[:2, :3], valid) and out.sum() == valid.sum()
    whole = layouts.zero_padded(valid.t(), (3, 2))  # already whole: a contiguous copy
    assert torch.equal(whole, valid.t()) and whole.is_contiguous() and whole.data_ptr() != valid.data_ptr()


# --------------------------------------------------------------------- per recipe
MXFP8_SHAPES = [(32, 32), (64, 96), (160, 224), (2, 48, 64), (3, 32, 416)]


@pytest.mark.parametrize("shape", MXFP8_SHAPES)
@pytest.mark.parametrize("with_2d", [False, True])
def test_mxfp8_scale_shapes_are_the_quantizer_s(shape, with_2d):
    q = MXFP8Quantizer(DType.kFloat8E4M3, with_2d_quantization=with_2d)(randn(shape))
    m, k = layouts.rows_cols(shape)
    for columnwise, data, scale in ((False, q._rowwise_data, q._rowwise_scale_inv),
                                    (True, q._columnwise_data, q._columnwise_scale_inv)):
        assert data.shape == shape  # not transposed, in either usage
        padded = layouts.mxfp8_scale_shape(shape, columnwise=columnwise)
        valid = layouts.mxfp8_scale_valid_shape(shape, columnwise=columnwise)
        assert tuple(scale.shape) == padded == q._quantizer.get_scale_shape(shape, columnwise)
        assert valid == ((m // 32, k) if columnwise else (m, k // 32))
        tile = (4, 128) if columnwise else (128, 4)
        assert padded[0] % tile[0] == 0 and padded[1] % tile[1] == 0
        assert_zero_padded(scale, valid)
        assert scale[: valid[0], : valid[1]].all()  # nonzero inputs: every valid scale byte is set


NVFP4_SHAPES = [(16, 16), (48, 80), (144, 32), (2, 24, 32), (16, 528)]


@pytest.mark.parametrize("shape", NVFP4_SHAPES)
def test_nvfp4_data_and_scale_shapes_are_the_quantizer_s(shape):
    quantizer = NVFP4Quantizer()
    q = quantizer(randn(shape))
    m, k = layouts.rows_cols(shape)
    for columnwise, data, scale in ((False, q._rowwise_data, q._rowwise_scale_inv),
                                    (True, q._columnwise_data, q._columnwise_scale_inv)):
        assert tuple(data.shape) == layouts.nvfp4_data_shape(shape, columnwise=columnwise)
        padded = layouts.nvfp4_scale_shape(shape, columnwise=columnwise)
        valid = layouts.nvfp4_scale_valid_shape(shape, columnwise=columnwise)
        assert tuple(scale.shape) == padded == quantizer.get_scale_shape(shape, columnwise)
        assert valid == ((k, m // 16) if columnwise else (m, k // 16))
        assert padded == layouts.scale_tile_padded(*valid)
        assert_zero_padded(scale, valid)
    assert tuple(q._rowwise_data.shape) == (*shape[:-1], k // 2) and tuple(q._columnwise_data.shape) == (k, m // 2)
    empty = quantizer.make_empty(shape)
    assert empty._rowwise_data.shape == q._rowwise_data.shape and empty._columnwise_scale_inv.shape == scale.shape


#: Shapes FP8 block scaling takes that its blocks do not divide, 1-D and 3-D ones among them.
BLOCK_SHAPES = [(200,), (128, 128), (129, 257), (3, 70, 130), (1, 5), (256, 64), (2, 64, 384)]


@pytest.mark.parametrize("shape", BLOCK_SHAPES)
@pytest.mark.parametrize("dim", [1, 2])
def test_fp8_block_scale_shapes_are_the_quantizer_s(shape, dim):
    quantizer = Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=dim)
    q = quantizer(randn(shape))
    m, k = layouts.rows_cols(shape)
    mb, kb = layouts.ceil_div(m, 128), layouts.ceil_div(k, 128)
    expected_valid = {(1, False): (kb, m), (1, True): (mb, k), (2, False): (mb, kb), (2, True): (kb, mb)}
    assert tuple(q._columnwise_data.shape) == layouts.columnwise_shape(shape) == quantizer.get_columnwise_shape(shape)
    for columnwise, scale in ((False, q._rowwise_scale_inv), (True, q._columnwise_scale_inv)):
        padded = layouts.float8_block_scale_shape(shape, columnwise=columnwise, block_scaling_dim=dim)
        valid = layouts.float8_block_scale_valid_shape(shape, columnwise=columnwise, block_scaling_dim=dim)
        assert valid == expected_valid[dim, columnwise]
        assert tuple(scale.shape) == padded == quantizer.get_scale_shape(shape, columnwise)
        assert padded == (valid[0], layouts.round_up(valid[1], 4))
        assert_zero_padded(scale, valid)
        assert (scale[: valid[0], : valid[1]] > 0).all()
    # the stored data's own 2-D view (R, C) reads alike in both orientations: its row-wise layout
    own = layouts.float8_block_scale_valid_shape((k, m), block_scaling_dim=dim)
    assert own == layouts.float8_block_scale_valid_shape(shape, columnwise=True, block_scaling_dim=dim)


def test_fp8_block_scaling_refuses_other_block_dims():
    with pytest.raises(ValueError, match="block_scaling_dim must be 1 or 2"):
        layouts.float8_block_scale_shape((128, 128), block_scaling_dim=3)


def test_the_swizzle_works_on_whole_scale_tiles_and_inverts():
    scales = torch.arange(256 * 8, dtype=torch.int32).to(torch.uint8).reshape(256, 8)
    swizzled = layouts.swizzle_block_scales(scales)
    assert swizzled.shape == scales.shape and not torch.equal(swizzled, scales)
    assert torch.equal(layouts.unswizzle_block_scales(swizzled), scales)
    with pytest.raises(ValueError, match="padded to"):
        layouts.swizzle_block_scales(scales[:100])


# ------------------------------------------------------------------ defined once
#: The helpers refops.layouts owns: a function of one of these names anywhere else restates it.
LAYOUT_HELPERS = {"_round_up", "round_up", "_ceil_div", "ceil_div", "_rows_cols", "rows_cols", "columnwise_layout",
                  "columnwise_shape", "rowwise_layout", "_padded", "zero_padded"}
#: Restatements allowed outside refops.layouts (path -> helper names): none, and it should stay so.
NOT_YET_MOVED: dict[str, set[str]] = {}


def test_no_module_outside_refops_layouts_defines_a_layout_helper():
    repo = pathlib.Path(refops.__file__).parent.parent
    offenders = []
    for package in (pathlib.Path(refops.__file__).parent, pathlib.Path(fastpath.__file__).parent):
        for path in sorted(package.rglob("*.py")):
            relative = path.relative_to(repo).as_posix()
            if relative.startswith("refops/layouts"):
                continue
            allowed = NOT_YET_MOVED.get(relative, set())
            for node in ast.walk(ast.parse(path.read_text(), filename=relative)):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                name = node.name
                if name in LAYOUT_HELPERS and name not in allowed:
                    offenders.append(f"{relative}:{node.lineno}: def {name}")
    assert not offenders, "use refops.layouts instead of restating it:\n" + "\n".join(offenders)
