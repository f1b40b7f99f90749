"""The cuts of a quantized tensor that keep it quantized: ``split``/``chunk``, ``slice``/``narrow``, ``new_zeros``.

Importing this module adds these handlers to :data:`refops.quantization.quantized_tensor.TORCH_DISPATCH`
(they need every scheme's row-major form, which this layer holds):

* ``split``/``chunk`` give exact pieces, as in TE: quantized for per-tensor FP8 (any dim) and for dim-0
  cuts on scaling-block bounds (how FSDP2 shards a parameter), else pieces of the dequantized values;
* a dim-0 ``slice``/``narrow`` on scaling-block bounds stays quantized (FSDP2's cut of a full value into
  a rank's shard); any other slice reads the dequantized values;
* ``new_zeros`` with only the row count changed gives zeros of the scheme (FSDP2 pads a shard with them);
  a row count that splits a scaling block is refused, as FSDP2 would re-quantize a dequantized shard into it.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..layouts import columnwise_layout
from ..quantization._dispatch import alias
from ..quantization.float8 import Float8Tensor
from ..quantization.quantized_tensor import TORCH_DISPATCH, QuantizedTensor
from .row_major import block_rows, rows, zeros_like_rows
from .scheme_forms import SCHEME_FORMS

__all__: list[str] = []

aten = torch.ops.aten


def _cuttable_at(tensor: QuantizedTensor, start: int, stop: int) -> bool:
    """Whether rows ``[start, stop)`` of ``tensor`` can be kept quantized (2-D, on scaling-block bounds)."""
    form = SCHEME_FORMS.get(type(tensor).__name__)
    if form is None or tensor.dim() != 2 or form.cut_refusal(tensor) is not None:
        return False
    g = block_rows(tensor)
    return not (start % g or (stop % g and stop != tensor.shape[0]))


def _rows_or_none(tensor: QuantizedTensor, start: int, stop: int) -> Optional[QuantizedTensor]:
    """Rows ``[start, stop)`` kept quantized (the whole tensor: an alias), or None where the scheme cannot cut there."""
    if start == 0 and stop == tensor.shape[0]:
        return alias(tensor)
    return rows(tensor, start, stop) if _cuttable_at(tensor, start, stop) else None


def _split_bounds(n: int, split_size: Any) -> list[tuple[int, int]]:
    """``[start, stop)`` of each piece ``torch.split(t, split_size)`` makes along a dim of size ``n``."""
    if isinstance(split_size, (list, tuple)):
        sizes = list(split_size)
    else:
        sizes = [min(split_size, n - start) for start in range(0, n, split_size)] or [0]
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


def _split(tensor: QuantizedTensor, split_size: Any, dim: int = 0) -> list[torch.Tensor]:
    """``split``/``chunk``: exact pieces, quantized where the scheme allows the cut, as in TE.

    Per-tensor FP8 cuts along any dim (its one scale serves every piece). Other schemes keep
    dim-0 cuts on their scaling-block bounds quantized (how FSDP2 shards a parameter). Any other
    cut returns the pieces of the dequantized values, exactly (TE's fallback); FSDP2's padding of
    such a shard is then refused by ``new_zeros`` (see :func:`_new_zeros`), so a quantized weight
    is never sharded into dequantized pieces silently.
    """
    if tensor.dim() == 0:
        raise RuntimeError(f"{type(tensor).__name__}: split expects at least a 1-dimensional tensor")
    dim = dim % tensor.dim()
    bounds = _split_bounds(tensor.shape[dim], split_size)
    if isinstance(tensor, Float8Tensor):
        return [_float8_piece(tensor, dim, start, stop) for start, stop in bounds]
    if dim == 0:
        pieces = [_rows_or_none(tensor, start, stop) for start, stop in bounds]
        if all(piece is not None for piece in pieces):
            return pieces
    values = tensor._dequantize_impl(tensor.dtype, None)
    return [values.narrow(dim, start, stop - start) for start, stop in bounds]


def _float8_piece(tensor: Float8Tensor, dim: int, start: int, stop: int) -> QuantizedTensor:
    """Elements ``[start, stop)`` along ``dim`` of a per-tensor FP8 tensor: its bytes, its usages, a copy of its scale."""
    if start == 0 and stop == tensor.shape[dim]:
        return alias(tensor)
    full = tensor
    if tensor._data is None:  # derive the row-wise bytes on a copy that shares the arrays
        full = type(tensor).make_like(tensor)
        full.update_usage(rowwise_usage=True)
    data = full._data.narrow(dim, start, stop - start).contiguous()
    return type(tensor).make_like(
        tensor, shape=data.shape,
        data=data if tensor._data is not None else None,
        data_transpose=columnwise_layout(data) if tensor._transpose is not None else None,
        fp8_scale_inv=tensor._scale_inv.clone(),  # re-quantizing one piece never writes another's scale
    )


def _slice(tensor: QuantizedTensor, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> torch.Tensor:
    """A dim-0 slice on block bounds stays quantized (FSDP2's ``narrow``); any other slice reads dequantized values."""
    n = tensor.shape[0] if tensor.dim() else 0
    lo = 0 if start is None else (start + n if start < 0 else min(start, n))
    hi = n if end is None else (end + n if end < 0 else min(end, n))
    if tensor.dim() and dim % tensor.dim() == 0 and step == 1 and 0 <= lo <= hi:
        piece = _rows_or_none(tensor, lo, hi)
        if piece is not None:
            return piece
    return aten.slice.Tensor(tensor._dequantize_impl(tensor.dtype, None), dim, start, end, step)


def _new_zeros(tensor: QuantizedTensor, size: Any, **kwargs: Any) -> torch.Tensor:
    """Zeros of ``tensor``'s scheme (FSDP2 pads a shard with them) when only the row count changes; else plain zeros."""
    size = torch.Size(size)
    dtype = kwargs.get("dtype") or tensor.dtype
    form = SCHEME_FORMS.get(type(tensor).__name__)
    quantizable = (form is not None and tensor.dim() == 2 and len(size) == 2 and size[1:] == tensor.shape[1:]
                   and dtype == tensor.dtype and form.cut_refusal(tensor) is None)
    if quantizable:
        block = block_rows(tensor)
        if size[0] % block and size[0] != tensor.shape[0]:
            # FSDP2 pads each shard with new_zeros(shard rows) before copying the shard in: a shard that
            # splits a scaling block would be re-quantized from its dequantized piece (a silent loss).
            raise NotImplementedError(
                f"{type(tensor).__name__}: new_zeros{tuple(size)} on a tensor of shape {tuple(tensor.shape)}: a "
                f"{type(tensor).__name__} can only be cut at multiples of {block} rows (its scaling blocks), so "
                f"rows of {size[0]} cannot hold its shards (FSDP2 pads each shard this way). Choose sizes whose "
                f"shards are multiples of {block} rows, or keep this weight in high precision"
            )
        return zeros_like_rows(tensor, size)
    return torch.zeros(size, dtype=dtype, device=kwargs.get("device") or tensor.device)


TORCH_DISPATCH.update({
    aten.split.Tensor: _split,
    aten.split_with_sizes.default: _split,
    aten.slice.Tensor: _slice,
    aten.new_zeros.default: _new_zeros,
})
