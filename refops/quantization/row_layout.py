"""The row-major layout of a quantized tensor: what lets FSDP2 shard and all-gather it without dequantizing.

FSDP2 shards a parameter along dim 0 and all-gathers the shards by concatenating each all-gather input
along its dim 0. A quantized tensor's arrays are not all laid out that way: per-tensor FP8 keeps a
transposed copy, MXFP8 and NVFP4 pad their scales, FP8 block scaling transposes its column-wise data
and scales, and shared scales (per-tensor FP8's ``scale_inv``, NVFP4's global amaxes) belong to no row.

Each scheme here states its **row-major arrays**: the arrays, un-padded and transposed where needed,
whose dim 0 runs over the nominal rows (dim 0 of the tensor) in blocks of ``granularity`` rows, plus the
arrays it *shares* (whole-tensor scales) and the usages it can *derive* after a gather. Then:

* ``rows(t, start, stop)``: rows ``[start, stop)`` of ``t`` as a tensor of the same class with exactly
  the bytes and scales the full tensor holds for them (``start``/``stop`` must fall on block bounds);
* ``to_row_major(t)`` / ``from_row_major(template, arrays, shape)``: the layout and its inverse.

Invariant: ``from_row_major(t, to_row_major(t), t.shape)`` rebuilds ``t`` bit for bit (padding too), and
concatenating the row-major arrays of consecutive row ranges gives the arrays of their union. So shards
gathered by FSDP2 rebuild the full tensor exactly, provided their shared arrays agree (the amax of a
per-tensor scale is reduced over the shard group, or the shards were cut from one quantized tensor).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from .quantized_tensor import QuantizedTensor

__all__ = ["RowLayout", "row_layout", "rows", "to_row_major", "from_row_major", "zeros_like_rows"]


class RowLayout:
    """A scheme's row-major layout (see the module docstring); one instance per tensor class.

    ``granularities(t)``: constructor keyword -> how many nominal rows one row of that row-major array
    covers (1 for data, 32 for MXFP8's column-wise scales, ...). A cut must fall on a multiple of the
    largest (:meth:`block_rows`).
    """

    def block_rows(self, tensor: QuantizedTensor) -> int:
        return max(self.granularities(tensor).values())

    def __init__(
        self,
        granularities: Callable[[QuantizedTensor], dict[str, int]],
        to_rows: Callable[[QuantizedTensor], dict[str, torch.Tensor]],
        from_rows: Callable[[QuantizedTensor, dict[str, torch.Tensor], torch.Size], dict[str, Optional[torch.Tensor]]],
        shared: tuple[str, ...] = (),
        check: Optional[Callable[[QuantizedTensor], Optional[str]]] = None,
    ) -> None:
        self.granularities = granularities
        self.to_rows = to_rows
        self.from_rows = from_rows
        self.shared = shared
        self.check = check


_LAYOUTS: dict[str, RowLayout] = {}


def row_layout(tensor: QuantizedTensor, *, what: str) -> RowLayout:
    """The layout of ``tensor``'s class, or a ``NotImplementedError`` naming ``what`` and the reason."""
    layout = _LAYOUTS.get(type(tensor).__name__)
    reason = None if layout is not None else f"{type(tensor).__name__} has no row-major layout in refops"
    if layout is not None and layout.check is not None:
        reason = layout.check(tensor)
    if tensor.dim() != 2 and reason is None:
        reason = f"only 2-D quantized tensors are sharded (got shape {tuple(tensor.shape)})"
    if reason is not None:
        raise NotImplementedError(f"{what}: cannot shard a {type(tensor).__name__} along dim 0: {reason}")
    return layout


def to_row_major(tensor: QuantizedTensor, *, what: str = "QuantizedTensor") -> dict[str, torch.Tensor]:
    """Constructor keyword -> array whose dim 0 runs over the rows (shared arrays excluded)."""
    return row_layout(tensor, what=what).to_rows(tensor)


def from_row_major(template: QuantizedTensor, arrays: dict[str, torch.Tensor], shape: torch.Size,
                   shared: Optional[dict[str, torch.Tensor]] = None) -> QuantizedTensor:
    """A tensor of ``template``'s class, quantizer and metadata, of nominal ``shape``, from row-major ``arrays``.

    ``shared`` gives the whole-tensor arrays (default: clones of ``template``'s, so that re-quantizing
    one tensor in place never writes into another's scale).
    """
    layout = row_layout(template, what=type(template).__name__)
    kwargs = layout.from_rows(template, arrays, torch.Size(shape))
    for kw in layout.shared:
        value = (shared or {}).get(kw)
        if value is None:
            current = template.get_metadata()[kw]
            value = None if current is None else current.clone()
        kwargs[kw] = value
    return type(template).make_like(template, shape=torch.Size(shape), **kwargs)


def rows(tensor: QuantizedTensor, start: int, stop: int, *, what: str = "QuantizedTensor") -> QuantizedTensor:
    """Rows ``[start, stop)`` of ``tensor``: the same bytes and scales as the full tensor holds for them."""
    layout = row_layout(tensor, what=what)
    g = layout.block_rows(tensor)
    if start % g or (stop % g and stop != tensor.shape[0]):
        raise NotImplementedError(
            f"{what}: a {type(tensor).__name__} can only be cut at multiples of {g} rows (its scaling blocks); "
            f"got rows [{start}, {stop}) of {tuple(tensor.shape)}. Choose sizes whose shards are multiples of {g} rows"
        )
    grans = layout.granularities(tensor)
    arrays = {kw: a[start // grans[kw] : _ceil_div(stop, grans[kw])] for kw, a in layout.to_rows(tensor).items()}
    return from_row_major(tensor, arrays, torch.Size((stop - start, *tensor.shape[1:])))


def zeros_like_rows(tensor: QuantizedTensor, shape: torch.Size, *, what: str = "QuantizedTensor") -> QuantizedTensor:
    """A tensor of ``tensor``'s class and nominal ``shape`` (same trailing dims) whose arrays are all zero bytes."""
    layout = row_layout(tensor, what=what)
    if tuple(shape[1:]) != tuple(tensor.shape[1:]):
        raise NotImplementedError(
            f"{what}: new_zeros{tuple(shape)} on a {type(tensor).__name__} of shape {tuple(tensor.shape)} needs the "
            "same trailing dims"
        )
    grans = layout.granularities(tensor)
    arrays = {kw: a.new_zeros((_ceil_div(shape[0], grans[kw]), *a.shape[1:]))
              for kw, a in layout.to_rows(tensor).items()}
    shared = {kw: torch.zeros_like(v) for kw in layout.shared if (v := tensor.get_metadata()[kw]) is not None}
    return from_row_major(tensor, arrays, torch.Size(shape), shared)


# ------------------------------------------------------------------ helpers
def _ceil_div(n: int, d: int) -> int:
    return -(-n // d)


def _round_up(n: int, m: int) -> int:
    return _ceil_div(n, m) * m


def _padded(valid: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """``valid`` in the top-left corner of a zero array of ``shape`` (the scale layouts pad with zeros)."""
    if tuple(valid.shape) == tuple(shape):
        return valid.contiguous()
    out = valid.new_zeros(shape)
    out[: valid.shape[0], : valid.shape[1]] = valid
    return out


def _t(a: torch.Tensor) -> torch.Tensor:
    return a.t().contiguous()


# --------------------------------------------------------- per-tensor FP8
def _float8_to_rows(t: QuantizedTensor) -> dict[str, torch.Tensor]:
    data = t._data if t._data is not None else _t(t._transpose)
    return {"data": data}


def _float8_from_rows(t: QuantizedTensor, arrays: dict[str, torch.Tensor], shape: torch.Size) -> dict[str, Any]:
    from ..kernels.reference.quant_float8 import columnwise_layout

    data = arrays["data"].contiguous()
    return {
        "data": data if t._data is not None else None,
        "data_transpose": columnwise_layout(data) if t._transpose is not None else None,
    }


# ------------------------------------------------------------------ MXFP8
def _mxfp8_to_rows(t: QuantizedTensor) -> dict[str, torch.Tensor]:
    m, k = t.shape
    out = {}
    if t._rowwise_data is not None:
        out["rowwise_data"] = t._rowwise_data
        out["rowwise_scale_inv"] = t._rowwise_scale_inv[:m, : k // 32]
    if t._columnwise_data is not None:
        out["columnwise_data"] = t._columnwise_data
        out["columnwise_scale_inv"] = t._columnwise_scale_inv[: m // 32, :k]
    return out


def _mxfp8_from_rows(t: QuantizedTensor, arrays: dict[str, torch.Tensor], shape: torch.Size) -> dict[str, Any]:
    m, k = shape
    out: dict[str, Any] = {"rowwise_data": None, "rowwise_scale_inv": None, "columnwise_data": None,
                           "columnwise_scale_inv": None}
    if "rowwise_data" in arrays:
        out["rowwise_data"] = arrays["rowwise_data"].contiguous()
        out["rowwise_scale_inv"] = _padded(arrays["rowwise_scale_inv"], (_round_up(m, 128), _round_up(k // 32, 4)))
    if "columnwise_data" in arrays:
        out["columnwise_data"] = arrays["columnwise_data"].contiguous()
        out["columnwise_scale_inv"] = _padded(arrays["columnwise_scale_inv"], (_round_up(m // 32, 4), _round_up(k, 128)))
    return out


# ------------------------------------------------------------- FP8 block
def _block_granularities(t: QuantizedTensor) -> dict[str, int]:
    scale = 128 if t._is_2D_scaled else 1
    return {"rowwise_data": 1, "rowwise_scale_inv": scale, "columnwise_data": 1, "columnwise_scale_inv": 128}


def _block_to_rows(t: QuantizedTensor) -> dict[str, torch.Tensor]:
    m, k = t.shape
    out = {}
    if t._rowwise_data is not None:
        out["rowwise_data"] = t._rowwise_data
        if t._is_2D_scaled:  # (ceil(M/128), ceil(K/128)) tiles: rows of tiles
            out["rowwise_scale_inv"] = t._rowwise_scale_inv[: _ceil_div(m, 128), : _ceil_div(k, 128)]
        else:  # 1x128 blocks, stored (ceil(K/128), M): one column per row
            out["rowwise_scale_inv"] = _t(t._rowwise_scale_inv[:, :m])
    if t._columnwise_data is not None:
        out["columnwise_data"] = _t(t._columnwise_data)  # stored (K, M)
        if t._is_2D_scaled:  # stored (ceil(K/128), ceil(M/128))
            out["columnwise_scale_inv"] = _t(t._columnwise_scale_inv[:, : _ceil_div(m, 128)])
        else:  # 128x1 blocks along M, stored (ceil(M/128), K)
            out["columnwise_scale_inv"] = t._columnwise_scale_inv[:, :k]
    return out


def _block_from_rows(t: QuantizedTensor, arrays: dict[str, torch.Tensor], shape: torch.Size) -> dict[str, Any]:
    m, k = shape
    out: dict[str, Any] = {"rowwise_data": None, "rowwise_scale_inv": None, "columnwise_data": None,
                           "columnwise_scale_inv": None}
    if "rowwise_data" in arrays:
        out["rowwise_data"] = arrays["rowwise_data"].contiguous()
        scale = arrays["rowwise_scale_inv"]
        out["rowwise_scale_inv"] = (
            _padded(scale, (_ceil_div(m, 128), _round_up(_ceil_div(k, 128), 4))) if t._is_2D_scaled
            else _padded(_t(scale), (_ceil_div(k, 128), _round_up(m, 4)))
        )
    if "columnwise_data" in arrays:
        out["columnwise_data"] = _t(arrays["columnwise_data"])
        scale = arrays["columnwise_scale_inv"]
        out["columnwise_scale_inv"] = (
            _padded(_t(scale), (_ceil_div(k, 128), _round_up(_ceil_div(m, 128), 4))) if t._is_2D_scaled
            else _padded(scale, (_ceil_div(m, 128), _round_up(k, 4)))
        )
    return out


# ------------------------------------------------------------------ NVFP4
def _nvfp4_check(t: QuantizedTensor) -> Optional[str]:
    if t._row_scaled_nvfp4:
        return "row-scaled NVFP4 keeps one amax per row, which the shards' re-quantization cannot share"
    return None


def _nvfp4_to_rows(t: QuantizedTensor) -> dict[str, torch.Tensor]:
    m, k = t.shape
    out = {}
    if t._rowwise_data is not None:
        out["rowwise_data"] = t._rowwise_data
        out["rowwise_scale_inv"] = t._rowwise_scale_inv[:m, : k // 16]
    if t._columnwise_data is not None:
        out["columnwise_data"] = _t(t._columnwise_data)  # stored (K, M/2): 2 rows per byte
        out["columnwise_scale_inv"] = _t(t._columnwise_scale_inv[:k, : m // 16])
    return out


def _nvfp4_from_rows(t: QuantizedTensor, arrays: dict[str, torch.Tensor], shape: torch.Size) -> dict[str, Any]:
    m, k = shape
    out: dict[str, Any] = {"rowwise_data": None, "rowwise_scale_inv": None, "columnwise_data": None,
                           "columnwise_scale_inv": None}
    if "rowwise_data" in arrays:
        out["rowwise_data"] = arrays["rowwise_data"].contiguous()
        out["rowwise_scale_inv"] = _padded(arrays["rowwise_scale_inv"], (_round_up(m, 128), _round_up(k // 16, 4)))
    if "columnwise_data" in arrays:
        out["columnwise_data"] = _t(arrays["columnwise_data"])
        out["columnwise_scale_inv"] = _padded(_t(arrays["columnwise_scale_inv"]), (_round_up(k, 128), _round_up(m // 16, 4)))
    return out


_LAYOUTS.update({
    "Float8Tensor": RowLayout(lambda t: {"data": 1}, _float8_to_rows, _float8_from_rows, shared=("fp8_scale_inv",)),
    "MXFP8Tensor": RowLayout(
        lambda t: {"rowwise_data": 1, "rowwise_scale_inv": 1, "columnwise_data": 1, "columnwise_scale_inv": 32},
        _mxfp8_to_rows, _mxfp8_from_rows),
    "Float8BlockwiseQTensor": RowLayout(_block_granularities, _block_to_rows, _block_from_rows),
    "NVFP4Tensor": RowLayout(
        lambda t: {"rowwise_data": 1, "rowwise_scale_inv": 1, "columnwise_data": 2, "columnwise_scale_inv": 16},
        _nvfp4_to_rows, _nvfp4_from_rows, shared=("amax_rowwise", "amax_columnwise"), check=_nvfp4_check),
})
