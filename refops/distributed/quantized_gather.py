"""Quantized all-gather along dim 0: gather the data and scales, never the high-precision values.

Invariant of every function here: gathering the ranks' quantized shards gives, byte for byte,
the quantized tensor that quantizing the gathered high-precision tensor would give, provided
the shards were quantized with the same global scale (per-tensor FP8: the same ``scale``;
NVFP4: the same global amax). Current scaling and NVFP4 get that from amax reduction over the
group (``with_amax_reduction``); delayed scaling from the recipe's amax reduction
(``autocast(amax_reduction_group=...)``). A gather checks that the ranks' global scales are
equal and raises ``ValueError`` otherwise, instead of silently using one rank's scale.

Per scheme (rows ``m`` = product of the leading dims of one rank's shard):

* per-tensor FP8: the row-wise uint8 data; the transpose is rebuilt from the gathered bytes
  (as in TE, FP8 does not gather transposed data);
* MXFP8: data of both usages, and scales with their padding removed before the gather and
  added back after (needs ``m % 32 == 0``);
* FP8 block scaling: data and scales; the column-wise copy (blocks of 128 along dim 0) and 2D
  tiles need ``m % 128 == 0``; the row-wise 1x128 copy has no condition;
* NVFP4: row-wise data and scales, column-wise (transposed) data and scales gathered along
  their second dim, one shared global amax (row-scaled: row-wise amaxes concatenated).

When a shard's block grid does not align with dim 0, :func:`quantize_then_gather` gathers the
high-precision shards and quantizes the result (TE's fallback); an already quantized shard that
does not align is a ``ValueError``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..kernels.reference.quant_float8 import columnwise_layout
from ..quantization.float8 import Float8Tensor, _PerTensorQuantizer
from ..quantization.float8_block import Float8BlockQuantizer, Float8BlockwiseQTensor
from ..quantization.mxfp8 import MXFP8Quantizer, MXFP8Tensor
from ..quantization.nvfp4 import NVFP4Quantizer, NVFP4Tensor
from ..quantization.quantized_tensor import QuantizedTensor
from ..quantization.quantizer import Quantizer
from .collectives import all_gather_columns, all_gather_rows, get_group_size

__all__ = ["gather_quantized", "quantize_then_gather", "shard_aligned"]

_ROW_MULTIPLE = {MXFP8Quantizer: 32, NVFP4Quantizer: 16}


def _rows_cols(shape: torch.Size) -> tuple[int, int]:
    return math.prod(shape[:-1]), shape[-1]


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def _padded(valid: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Zero padding, as the quantizers write it."""
    out = torch.zeros(rows, cols, dtype=valid.dtype, device=valid.device)
    out[: valid.shape[0], : valid.shape[1]] = valid
    return out


def _gathered_shape(shape: torch.Size, world: int) -> torch.Size:
    return torch.Size((world * shape[0], *shape[1:]))


def _check_equal_across_ranks(what: str, value: torch.Tensor, group: Any) -> None:
    """Raise on every rank unless ``value`` is bitwise equal on all of them."""
    values = all_gather_rows(value.detach().reshape(1, -1), group)
    if not bool((values == values[:1]).all()):
        raise ValueError(
            f"gather_along_first_dim: the ranks' {what} differ ({values.flatten().tolist()}); a quantized "
            "all-gather shares one global scale, so reduce the amax over the group first "
            "(with_amax_reduction on the quantizer, or autocast(amax_reduction_group=...) for delayed scaling)"
        )


def shard_aligned(quantizer: Quantizer, shape: torch.Size, *, columnwise: bool) -> bool:
    """Whether shards of ``shape`` quantize to whole blocks, so their quantized gather is exact."""
    if len(shape) < 2:
        return isinstance(quantizer, _PerTensorQuantizer)
    m, _ = _rows_cols(torch.Size(shape))
    if isinstance(quantizer, Float8BlockQuantizer):
        needs_128 = quantizer.block_scaling_dim == 2 or columnwise
        return not needs_128 or m % 128 == 0
    for cls, multiple in _ROW_MULTIPLE.items():
        if isinstance(quantizer, cls):
            return m % multiple == 0
    return isinstance(quantizer, _PerTensorQuantizer)


def quantize_then_gather(tensor: torch.Tensor, quantizer: Quantizer, group: Any) -> QuantizedTensor:
    """Quantize this rank's shard with ``quantizer``, then gather it quantized.

    The result has ``quantizer``'s usages. Per-tensor FP8 quantizes row-wise only and
    rebuilds the transpose after the gather. A shard whose block grid does not align with
    dim 0 is gathered in high precision and quantized after.
    """
    columnwise = quantizer.columnwise_usage
    if not shard_aligned(quantizer, tensor.shape, columnwise=columnwise):
        return quantizer(all_gather_rows(tensor, group))
    local_quantizer = quantizer
    if isinstance(quantizer, _PerTensorQuantizer) and columnwise:
        local_quantizer = quantizer.copy()
        local_quantizer.set_usage(rowwise=True, columnwise=False)
    return gather_quantized(local_quantizer(tensor), group, columnwise=columnwise)


def gather_quantized(tensor: QuantizedTensor, group: Any, *, columnwise: bool | None = None) -> QuantizedTensor:
    """All-gather a quantized tensor along dim 0, keeping its usages (``columnwise`` overrides one).

    Raises ``ValueError`` for a shard whose block grid does not align with dim 0 and for
    ranks whose global scales differ.
    """
    if tensor.dim() < 1:
        raise ValueError("gather_along_first_dim: cannot gather a 0-dim tensor along dim 0")
    if columnwise is None:
        columnwise = tensor.has_usage("columnwise")
    quantizer = tensor.quantizer
    if quantizer is not None and not isinstance(tensor, Float8Tensor):
        if not shard_aligned(quantizer, tensor.shape, columnwise=tensor.has_usage("columnwise")):
            raise ValueError(
                f"gather_along_first_dim: a {type(tensor).__name__} shard of shape {tuple(tensor.shape)} does not "
                "quantize to whole blocks along dim 0, so it cannot be gathered in quantized form; gather the "
                "high-precision tensor (gather_along_first_dim(x, group, quantizer=q)) instead"
            )
    for cls, gather in _GATHERS:
        if isinstance(tensor, cls):
            return gather(tensor, group, columnwise)
    raise NotImplementedError(f"gather_along_first_dim: no quantized all-gather for {type(tensor).__name__}")


def _gather_float8(t: Float8Tensor, group: Any, columnwise: bool) -> Float8Tensor:
    """Row-wise bytes gathered; the shared ``scale_inv`` must already agree across ranks."""
    _check_equal_across_ranks("Float8Tensor scale_inv", t._scale_inv, group)
    if t._data is None:  # derive the row-wise bytes on a copy that shares the arrays
        t = Float8Tensor.make_like(t)
        t.update_usage(rowwise_usage=True)
    data = all_gather_rows(t._data, group)
    transpose = columnwise_layout(data) if columnwise else None
    return Float8Tensor.make_like(t, shape=data.shape, data=data, data_transpose=transpose)


def _gather_mxfp8(t: MXFP8Tensor, group: Any, columnwise: bool) -> MXFP8Tensor:
    """Both usages' data gathered as rows; scales stripped of padding, gathered, re-padded."""
    m, k = _rows_cols(t.shape)
    world = get_group_size(group)
    shape = _gathered_shape(t.shape, world)
    big_m = world * m
    out: dict[str, Any] = dict.fromkeys(("rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv"))
    if t.has_usage("rowwise"):
        out["rowwise_data"] = all_gather_rows(t._rowwise_data, group)
        scale = all_gather_rows(t._rowwise_scale_inv[:m, : k // 32], group)
        out["rowwise_scale_inv"] = _padded(scale, _round_up(big_m, 128), _round_up(k // 32, 4))
    if columnwise:
        if not t.has_usage("columnwise"):
            raise ValueError("gather_along_first_dim: the MXFP8Tensor has no column-wise data to gather")
        out["columnwise_data"] = all_gather_rows(t._columnwise_data, group)
        scale = all_gather_rows(t._columnwise_scale_inv[: m // 32, :k], group)
        out["columnwise_scale_inv"] = _padded(scale, _round_up(big_m // 32, 4), _round_up(k, 128))
    return MXFP8Tensor.make_like(t, shape=shape, **out)


def _gather_float8_block(t: Float8BlockwiseQTensor, group: Any, columnwise: bool) -> Float8BlockwiseQTensor:
    """Row-wise data as rows, transposed column-wise data as columns; block scales likewise."""
    m, k = _rows_cols(t.shape)
    world = get_group_size(group)
    shape = _gathered_shape(t.shape, world)
    big_m, kb, mb = world * m, -(-k // 128), m // 128
    out: dict[str, Any] = dict.fromkeys(("rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv"))
    if t.has_usage("rowwise"):
        out["rowwise_data"] = all_gather_rows(t._rowwise_data, group)
        if t._is_2D_scaled:  # [m/128, k/128]
            scale = all_gather_rows(t._rowwise_scale_inv[:mb, :kb], group)
            out["rowwise_scale_inv"] = _padded(scale, big_m // 128, _round_up(kb, 4))
        else:  # [k/128, m]
            scale = all_gather_columns(t._rowwise_scale_inv[:kb, :m], group)
            out["rowwise_scale_inv"] = _padded(scale, kb, _round_up(big_m, 4))
    if columnwise:
        if not t.has_usage("columnwise"):
            raise ValueError("gather_along_first_dim: the Float8BlockwiseQTensor has no column-wise data to gather")
        data = all_gather_columns(t._columnwise_data.reshape(k, m), group)
        out["columnwise_data"] = data.reshape(k, *shape[:-1])
        if t._is_2D_scaled:  # [k/128, m/128]
            scale = all_gather_columns(t._columnwise_scale_inv[:kb, :mb], group)
            out["columnwise_scale_inv"] = _padded(scale, kb, _round_up(big_m // 128, 4))
        else:  # [m/128, k]
            scale = all_gather_rows(t._columnwise_scale_inv[:mb, :k], group)
            out["columnwise_scale_inv"] = _padded(scale, big_m // 128, _round_up(k, 4))
    return Float8BlockwiseQTensor.make_like(t, shape=shape, **out)


def _gather_nvfp4(t: NVFP4Tensor, group: Any, columnwise: bool) -> NVFP4Tensor:
    """Row-wise data and scales as rows; transposed column-wise ones as columns; one global amax."""
    m, k = _rows_cols(t.shape)
    world = get_group_size(group)
    shape = _gathered_shape(t.shape, world)
    big_m = world * m
    out: dict[str, Any] = {
        name: None for name in ("rowwise_data", "rowwise_scale_inv", "amax_rowwise", "columnwise_data",
                                "columnwise_scale_inv", "amax_columnwise")
    }
    if t.has_usage("rowwise"):
        out["rowwise_data"] = all_gather_rows(t._rowwise_data, group)
        scale = all_gather_rows(t._rowwise_scale_inv[:m, : k // 16], group)
        out["rowwise_scale_inv"] = _padded(scale, _round_up(big_m, 128), _round_up(k // 16, 4))
        if t._row_scaled_nvfp4:  # one amax per local row
            out["amax_rowwise"] = all_gather_rows(t._amax_rowwise, group)
        else:
            _check_equal_across_ranks("NVFP4Tensor row-wise amax", t._amax_rowwise, group)
            out["amax_rowwise"] = t._amax_rowwise
    if columnwise:
        if not t.has_usage("columnwise"):
            raise ValueError("gather_along_first_dim: the NVFP4Tensor has no column-wise data to gather")
        out["columnwise_data"] = all_gather_columns(t._columnwise_data, group)  # (k, m/2) -> (k, W m/2)
        scale = all_gather_columns(t._columnwise_scale_inv[:k, : m // 16], group)
        out["columnwise_scale_inv"] = _padded(scale, _round_up(k, 128), _round_up(big_m // 16, 4))
        _check_equal_across_ranks("NVFP4Tensor column-wise amax", t._amax_columnwise, group)
        out["amax_columnwise"] = t._amax_columnwise
    return NVFP4Tensor.make_like(t, shape=shape, **out)


_GATHERS = (
    (Float8Tensor, _gather_float8),
    (MXFP8Tensor, _gather_mxfp8),
    (Float8BlockwiseQTensor, _gather_float8_block),
    (NVFP4Tensor, _gather_nvfp4),
)
