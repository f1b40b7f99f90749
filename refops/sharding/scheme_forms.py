"""Each scheme's row-major form: its arrays laid out so that dim 0 runs over the tensor's rows.

A dim-0 cut, a dim-0 gather and a checkpoint's row blocks all need the same thing of a quantized tensor:
arrays whose dim 0 follows the tensor's rows. Not every stored array does: per-tensor FP8 keeps a transposed
copy, MXFP8 and NVFP4 pad their scales, FP8 block scaling transposes its column-wise data and scales, and
whole-tensor scales (per-tensor FP8's ``scale_inv``, NVFP4's global amaxes) belong to no row.

A scheme's form states, for a 2-D view of ``rows x cols`` (leading dims flattened into rows):

* :meth:`SchemeForm.arrays`: the **row-major arrays** a tensor with these usages holds, each as a
  :class:`RowArray` (how many of the tensor's rows one of its rows covers, its dtype, the shape of one row);
* :meth:`SchemeForm.shared`: the **shared arrays** (whole-tensor scales), as :class:`SharedArray`;
* :meth:`SchemeForm.to_rows` / :meth:`SchemeForm.from_rows`: the row-major arrays of a tensor, and the
  stored arrays (padded, transposed back) of a tensor of any row count from row-major arrays.

Invariant: ``from_rows(to_rows(t))`` gives ``t``'s stored arrays bit for bit (padding too), and the
row-major arrays of consecutive row ranges concatenate (dim 0) to those of their union. The functions over
these forms are :mod:`refops.sharding.row_major`'s.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Optional

import torch

from ..layouts import columnwise_layout
from ..quantization.quantized_tensor import QuantizedTensor
from ..layouts import ceil_div, float8_block_scale_shape, mxfp8_scale_shape, nvfp4_scale_shape, zero_padded

__all__ = ["RowArray", "SharedArray", "SchemeForm", "SCHEME_FORMS"]

Arrays = dict[str, torch.Tensor]


@dataclasses.dataclass(frozen=True)
class RowArray:
    """A row-major array: each of its rows covers ``granularity`` of the tensor's rows and has ``row_shape``."""

    granularity: int
    dtype: torch.dtype
    row_shape: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class SharedArray:
    """A whole-tensor array: every row range of the tensor holds the same one."""

    dtype: torch.dtype
    shape: tuple[int, ...]


class SchemeForm:
    """A scheme's row-major form (see the module docstring); ``meta`` is the tensor's constructor metadata and
    ``usages`` the usages it holds (``"rowwise"``, ``"columnwise"``)."""

    tensor_class: ClassVar[str]

    def arrays(self, cols: int, meta: dict[str, Any], usages: tuple[str, ...]) -> dict[str, RowArray]:
        raise NotImplementedError

    def shared(self, cols: int, meta: dict[str, Any], usages: tuple[str, ...]) -> dict[str, SharedArray]:
        return {}

    def to_rows(self, t: QuantizedTensor, rows: int, cols: int) -> Arrays:
        raise NotImplementedError

    def from_rows(self, arrays: Arrays, shape: torch.Size, rows: int, cols: int, meta: dict[str, Any],
                  usages: tuple[str, ...]) -> dict[str, Optional[torch.Tensor]]:
        raise NotImplementedError

    def cut_refusal(self, t: QuantizedTensor) -> Optional[str]:
        """Why ``t`` cannot be cut into row ranges that FSDP2 re-quantizes on their own (None: it can)."""
        return None


def _empty(names: tuple[str, ...]) -> dict[str, Optional[torch.Tensor]]:
    return dict.fromkeys(names)


class _Float8(SchemeForm):
    """Per-tensor FP8: the row-wise bytes (rebuilt from the transposed copy when only that is held); the
    transposed copy follows from them after a gather, so it never travels."""

    tensor_class = "Float8Tensor"

    def arrays(self, cols, meta, usages):
        return {"data": RowArray(1, torch.uint8, (cols,))}

    def shared(self, cols, meta, usages):
        return {"fp8_scale_inv": SharedArray(torch.float32, (1,))}

    def to_rows(self, t, rows, cols):
        data = t._data.reshape(rows, cols) if t._data is not None else t._transpose.reshape(cols, rows).t().contiguous()
        return {"data": data}

    def from_rows(self, arrays, shape, rows, cols, meta, usages):
        data = arrays["data"].contiguous().reshape(shape)
        return {
            "data": data if "rowwise" in usages else None,
            "data_transpose": columnwise_layout(data) if "columnwise" in usages else None,
        }


class _MXFP8(SchemeForm):
    """MXFP8: both usages' bytes are laid out as the tensor; the scales lose their padding (one row-wise scale
    row per row, one column-wise scale row per 32 rows)."""

    tensor_class = "MXFP8Tensor"

    def arrays(self, cols, meta, usages):
        out = {}
        if "rowwise" in usages:
            out["rowwise_data"] = RowArray(1, torch.uint8, (cols,))
            out["rowwise_scale_inv"] = RowArray(1, torch.uint8, (cols // 32,))
        if "columnwise" in usages:
            out["columnwise_data"] = RowArray(1, torch.uint8, (cols,))
            out["columnwise_scale_inv"] = RowArray(32, torch.uint8, (cols,))
        return out

    def to_rows(self, t, rows, cols):
        out = {}
        if t._rowwise_data is not None:
            out["rowwise_data"] = t._rowwise_data.reshape(rows, cols)
            out["rowwise_scale_inv"] = t._rowwise_scale_inv[:rows, : cols // 32]
        if t._columnwise_data is not None:
            out["columnwise_data"] = t._columnwise_data.reshape(rows, cols)
            out["columnwise_scale_inv"] = t._columnwise_scale_inv[: rows // 32, :cols]
        return out

    def from_rows(self, arrays, shape, rows, cols, meta, usages):
        out = _empty(("rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv"))
        if "rowwise_data" in arrays:
            out["rowwise_data"] = arrays["rowwise_data"].contiguous().reshape(shape)
            out["rowwise_scale_inv"] = zero_padded(arrays["rowwise_scale_inv"], mxfp8_scale_shape((rows, cols)))
        if "columnwise_data" in arrays:
            out["columnwise_data"] = arrays["columnwise_data"].contiguous().reshape(shape)
            out["columnwise_scale_inv"] = zero_padded(arrays["columnwise_scale_inv"],
                                                 mxfp8_scale_shape((rows, cols), columnwise=True))
        return out


class _Float8Block(SchemeForm):
    """FP8 block scaling: the column-wise bytes are stored transposed ``(cols, rows)``; 2-D scaling keeps one
    scale per 128 x 128 tile, 1-D one per 1 x 128 block (row-wise, stored transposed) or 128 x 1 (column-wise)."""

    tensor_class = "Float8BlockwiseQTensor"

    def arrays(self, cols, meta, usages):
        two_d, tiles = bool(meta["is_2D_scaled"]), ceil_div(cols, 128)
        out = {}
        if "rowwise" in usages:
            out["rowwise_data"] = RowArray(1, torch.uint8, (cols,))
            out["rowwise_scale_inv"] = RowArray(128 if two_d else 1, torch.float32, (tiles,))
        if "columnwise" in usages:
            out["columnwise_data"] = RowArray(1, torch.uint8, (cols,))
            out["columnwise_scale_inv"] = RowArray(128, torch.float32, (tiles,) if two_d else (cols,))
        return out

    def to_rows(self, t, rows, cols):
        row_tiles, col_tiles = ceil_div(rows, 128), ceil_div(cols, 128)
        out = {}
        if t._rowwise_data is not None:
            out["rowwise_data"] = t._rowwise_data.reshape(rows, cols)
            if t._is_2D_scaled:  # (ceil(rows/128), ceil(cols/128)) tiles: rows of tiles
                out["rowwise_scale_inv"] = t._rowwise_scale_inv[:row_tiles, :col_tiles]
            else:  # 1x128 blocks, stored (ceil(cols/128), rows): one column per row
                out["rowwise_scale_inv"] = t._rowwise_scale_inv[:, :rows].t().contiguous()
        if t._columnwise_data is not None:
            out["columnwise_data"] = t._columnwise_data.reshape(cols, rows).t().contiguous()
            if t._is_2D_scaled:  # stored (ceil(cols/128), ceil(rows/128))
                out["columnwise_scale_inv"] = t._columnwise_scale_inv[:, :row_tiles].t().contiguous()
            else:  # 128x1 blocks along the rows, stored (ceil(rows/128), cols)
                out["columnwise_scale_inv"] = t._columnwise_scale_inv[:, :cols]
        return out

    def from_rows(self, arrays, shape, rows, cols, meta, usages):
        two_d = bool(meta["is_2D_scaled"])
        dim = 2 if two_d else 1
        out = _empty(("rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv"))
        if "rowwise_data" in arrays:
            out["rowwise_data"] = arrays["rowwise_data"].contiguous().reshape(shape)
            scale = arrays["rowwise_scale_inv"]
            padded_shape = float8_block_scale_shape((rows, cols), block_scaling_dim=dim)
            out["rowwise_scale_inv"] = zero_padded(scale if two_d else scale.t().contiguous(), padded_shape)
        if "columnwise_data" in arrays:
            out["columnwise_data"] = arrays["columnwise_data"].t().contiguous().reshape(cols, *shape[:-1])
            scale = arrays["columnwise_scale_inv"]
            padded_shape = float8_block_scale_shape((rows, cols), columnwise=True, block_scaling_dim=dim)
            out["columnwise_scale_inv"] = zero_padded(scale.t().contiguous() if two_d else scale, padded_shape)
        return out


class _NVFP4(SchemeForm):
    """NVFP4: two 4-bit codes a byte; the column-wise bytes and scales are stored transposed ``(cols, ...)``
    (one row-major row per 2 and per 16 rows); the global amaxes are shared, except a row-scaled tensor's
    row-wise amaxes, one per row."""

    tensor_class = "NVFP4Tensor"

    def arrays(self, cols, meta, usages):
        out = {}
        if "rowwise" in usages:
            out["rowwise_data"] = RowArray(1, torch.uint8, (cols // 2,))
            out["rowwise_scale_inv"] = RowArray(1, torch.uint8, (cols // 16,))
            if meta["row_scaled_nvfp4"]:
                out["amax_rowwise"] = RowArray(1, torch.float32, ())
        if "columnwise" in usages:
            out["columnwise_data"] = RowArray(2, torch.uint8, (cols,))
            out["columnwise_scale_inv"] = RowArray(16, torch.uint8, (cols,))
        return out

    def shared(self, cols, meta, usages):
        out = {}
        if "rowwise" in usages and not meta["row_scaled_nvfp4"]:
            out["amax_rowwise"] = SharedArray(torch.float32, (1,))
        if "columnwise" in usages:
            out["amax_columnwise"] = SharedArray(torch.float32, (cols,) if meta["row_scaled_nvfp4"] else (1,))
        return out

    def to_rows(self, t, rows, cols):
        out = {}
        if t._rowwise_data is not None:
            out["rowwise_data"] = t._rowwise_data.reshape(rows, cols // 2)
            out["rowwise_scale_inv"] = t._rowwise_scale_inv[:rows, : cols // 16]
            if t._row_scaled_nvfp4:
                out["amax_rowwise"] = t._amax_rowwise
        if t._columnwise_data is not None:
            out["columnwise_data"] = t._columnwise_data.t().contiguous()  # stored (cols, rows/2): 2 rows a byte
            out["columnwise_scale_inv"] = t._columnwise_scale_inv[:cols, : rows // 16].t().contiguous()
        return out

    def from_rows(self, arrays, shape, rows, cols, meta, usages):
        out = _empty(("rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv"))
        if "rowwise_data" in arrays:
            out["rowwise_data"] = arrays["rowwise_data"].contiguous().reshape(*shape[:-1], cols // 2)
            out["rowwise_scale_inv"] = zero_padded(arrays["rowwise_scale_inv"], nvfp4_scale_shape((rows, cols)))
            if "amax_rowwise" in arrays:
                out["amax_rowwise"] = arrays["amax_rowwise"].contiguous()
        if "columnwise_data" in arrays:
            out["columnwise_data"] = arrays["columnwise_data"].t().contiguous()
            out["columnwise_scale_inv"] = zero_padded(arrays["columnwise_scale_inv"].t().contiguous(),
                                                 nvfp4_scale_shape((rows, cols), columnwise=True))
        return out

    def cut_refusal(self, t):
        if t._row_scaled_nvfp4:
            return "row-scaled NVFP4 keeps one amax per row, which the shards' re-quantization cannot share"
        return None


#: Tensor class name -> its scheme's form.
SCHEME_FORMS: dict[str, SchemeForm] = {form.tensor_class: form for form in (_Float8(), _MXFP8(), _Float8Block(), _NVFP4())}
