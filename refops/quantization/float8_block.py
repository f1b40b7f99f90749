"""FP8 block scaling: ``Float8BlockwiseQTensor`` and ``Float8BlockQuantizer`` (``docs/recipes/fp8-block.md``).

1x128 blocks (``block_scaling_dim=1``; inputs and grads by default) or 128x128
tiles (``=2``; weights by default), one fp32 scale per block:
``s = compute_scale_from_amax(amax, fmax, pow2, eps, value_for_inf = max of the
input dtype)``, ``q = Q_F(RN(x * s))``, ``scale_inv = RN(1/s)``. The column-wise
data is transposed, ``(K, *lead)``: for 1D it is quantized separately along M,
for 2D it is the exact transpose of the row-wise bytes and scales. Scale tensors
are in TE's GEMM-ready padded layout (see :mod:`refops.layouts`).
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch

from ..kernels import current_backend
from ..layouts import (
    FP8_BLOCK_SIZE,
    columnwise_layout,
    columnwise_shape,
    float8_block_scale_shape,
    float8_block_scale_valid_shape,
    rowwise_layout,
    rows_cols,
    zero_padded,
)
from .quantized_tensor import QuantizedTensor
from .quantizer import DType, Quantizer, canonicalize_fp8_dtype, torch_fp8_dtype

__all__ = ["Float8BlockwiseQTensor", "Float8BlockQuantizer"]


class Float8BlockwiseQTensor(QuantizedTensor):
    """FP8 data with fp32 block scales (TE's constructor keywords: ``rowwise_data``,
    ``rowwise_scale_inv``, ``columnwise_data``, ``columnwise_scale_inv``, ``fp8_dtype``,
    ``quantizer``, ``is_2D_scaled``)."""

    _ROWWISE = ("_rowwise_data", "_rowwise_scale_inv")
    _COLUMNWISE = ("_columnwise_data", "_columnwise_scale_inv")
    _GEMM_FORMAT = "float8_block"
    _CTOR_TENSORS = {
        "rowwise_data": "_rowwise_data",
        "rowwise_scale_inv": "_rowwise_scale_inv",
        "columnwise_data": "_columnwise_data",
        "columnwise_scale_inv": "_columnwise_scale_inv",
    }
    _CTOR_META = {"fp8_dtype": ("_fp8_dtype", DType.kFloat8E4M3), "is_2D_scaled": ("_is_2D_scaled", True)}

    def _validate(self) -> None:
        self._fp8_dtype = canonicalize_fp8_dtype(self._fp8_dtype)
        self._is_2D_scaled = bool(self._is_2D_scaled)

    def _usage_arrays(self, usage: str) -> tuple[torch.Tensor, torch.Tensor]:
        if usage == "columnwise":
            return self._columnwise_data, self._columnwise_scale_inv
        return self._rowwise_data, self._rowwise_scale_inv

    def _gemm_arrays(self, usage: str, rows: int, last: int) -> dict[str, Any]:
        # The bytes with the contracted dim last: row-wise (rows, last) or the transposed copy (last, rows);
        # the GEMM-ready scales of that 2-D view.
        data, scale_inv = self._usage_arrays(usage)
        data = data.reshape(rows, last) if usage == "rowwise" else data.reshape(last, rows)
        return {"data": data, "scale_inv": scale_inv, "fp8_dtype": torch_fp8_dtype(self._fp8_dtype),
                "block_scaling_dim": 2 if self._is_2D_scaled else 1}

    def _dequantize_usage(self, usage: str, dtype: torch.dtype) -> torch.Tensor:
        columnwise = usage == "columnwise"
        data, scale_inv = self._usage_arrays(usage)
        values = current_backend().dequantize_float8_block(
            data,
            scale_inv,
            fp8_dtype=torch_fp8_dtype(self._fp8_dtype),
            columnwise=columnwise,
            block_scaling_dim=2 if self._is_2D_scaled else 1,
            out_dtype=dtype,
        )
        if columnwise and self.dim() > 0:
            return rowwise_layout(values, self.shape)
        return values.contiguous()

    def _derive_usage(self, usage: str) -> None:
        """2D only: one orientation is the exact transpose of the other (bytes and tile scales)."""
        if not self._is_2D_scaled:
            super()._derive_usage(usage)
        layout = dict(block_scaling_dim=2)
        if usage == "columnwise":
            self._columnwise_data = columnwise_layout(self._rowwise_data)
            rows, cols = float8_block_scale_valid_shape(self.shape, **layout)
            self._columnwise_scale_inv = zero_padded(self._rowwise_scale_inv[:rows, :cols].t(),
                                                     float8_block_scale_shape(self.shape, columnwise=True, **layout))
        else:
            self._rowwise_data = rowwise_layout(self._columnwise_data, self.shape)
            rows, cols = float8_block_scale_valid_shape(self.shape, columnwise=True, **layout)
            self._rowwise_scale_inv = zero_padded(self._columnwise_scale_inv[:rows, :cols].t(),
                                                  float8_block_scale_shape(self.shape, **layout))


class Float8BlockQuantizer(Quantizer):
    """TE's ``Float8BlockQuantizer(fp8_dtype, *, rowwise, columnwise, amax_epsilon=0.0,
    force_pow_2_scales=True, block_scaling_dim=2)``."""

    tensor_class = Float8BlockwiseQTensor

    def __init__(
        self,
        fp8_dtype: Any,
        *,
        rowwise: bool,
        columnwise: bool,
        amax_epsilon: float = 0.0,
        force_pow_2_scales: bool = True,
        block_scaling_dim: int = 2,
    ) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        if block_scaling_dim not in (1, 2):
            raise ValueError(f"Float8BlockQuantizer: block_scaling_dim must be 1 or 2, got {block_scaling_dim}")
        self.dtype = canonicalize_fp8_dtype(fp8_dtype)
        self.block_len = FP8_BLOCK_SIZE
        self.amax_epsilon = float(amax_epsilon)
        self.force_pow_2_scales = bool(force_pow_2_scales)
        self.block_scaling_dim = block_scaling_dim

    def is_quantizable(self, inp: torch.Tensor) -> bool:
        """Whether ``inp`` supports a quantized all-gather (TE's meaning): 2+ dims whose last dim and product of
        leading dims are multiples of 128 (whole blocks along both)."""
        m, k = rows_cols(inp.shape)
        return inp.dim() >= 2 and k % FP8_BLOCK_SIZE == 0 and m % FP8_BLOCK_SIZE == 0

    def _quantize_arrays(self, tensor: torch.Tensor, *, rowwise: bool, columnwise: bool) -> dict[str, Any]:
        if tensor.dim() == 0:
            raise ValueError(f"{type(self).__name__}: FP8 block scaling needs a tensor of at least 1 dim (its blocks "
                             "run along the last dim), got a 0-D tensor")
        row_data, row_scale, col_data, col_scale = current_backend().quantize_float8_block(
            tensor,
            fp8_dtype=torch_fp8_dtype(self.dtype),
            rowwise=rowwise,
            columnwise=columnwise,
            block_scaling_dim=self.block_scaling_dim,
            force_pow_2_scales=self.force_pow_2_scales,
            amax_epsilon=self.amax_epsilon,
        )
        return {
            "rowwise_data": row_data,
            "rowwise_scale_inv": row_scale,
            "columnwise_data": col_data,
            "columnwise_scale_inv": col_scale,
            "fp8_dtype": self.dtype,
        }

    def _tensor_meta(self) -> dict[str, Any]:
        return {"fp8_dtype": self.dtype, "is_2D_scaled": self.block_scaling_dim == 2}

    def get_scale_shape(self, shape: Iterable[int], columnwise: bool) -> tuple[int, int]:
        """GEMM-ready scale shape (TE's ``get_scale_shape``; :func:`refops.layouts.float8_block_scale_shape`)."""
        return float8_block_scale_shape(shape, columnwise=columnwise, block_scaling_dim=self.block_scaling_dim)

    def get_columnwise_shape(self, shape: Iterable[int]) -> tuple[int, ...]:
        """``(d_n, d_1, ..., d_{n-1})``: the last dim moves to the front."""
        return columnwise_shape(shape)

    def make_empty(
        self,
        shape: Iterable[int],
        *,
        dtype: torch.dtype = torch.float32,
        device: Optional[torch.device | str] = None,
        requires_grad: bool = False,
    ) -> Float8BlockwiseQTensor:
        shape = torch.Size(shape)
        device = torch.device("cpu") if device is None else torch.device(device)
        arrays: dict[str, Optional[torch.Tensor]] = {}
        for usage, enabled in (("rowwise", self.rowwise_usage), ("columnwise", self.columnwise_usage)):
            columnwise = usage == "columnwise"
            data_shape = self.get_columnwise_shape(shape) if columnwise else shape
            arrays[f"{usage}_data"] = torch.empty(data_shape, dtype=torch.uint8, device=device) if enabled else None
            arrays[f"{usage}_scale_inv"] = (
                torch.empty(self.get_scale_shape(shape, columnwise), dtype=torch.float32, device=device)
                if enabled
                else None
            )
        return Float8BlockwiseQTensor(
            shape, dtype, device=device, requires_grad=requires_grad, quantizer=self, **arrays, **self._tensor_meta()
        )

    def _config(self) -> dict[str, Any]:
        return {
            **super()._config(),
            "fp8_dtype": int(self.dtype),
            "amax_epsilon": self.amax_epsilon,
            "force_pow_2_scales": self.force_pow_2_scales,
            "block_scaling_dim": self.block_scaling_dim,
        }

    @classmethod
    def _from_config(cls, config: dict[str, Any], tensors: dict[str, torch.Tensor], device: torch.device):
        return cls(DType(config.pop("fp8_dtype")), **config)
