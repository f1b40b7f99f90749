"""MXFP8: ``MXFP8Tensor`` and ``MXFP8Quantizer`` (``docs/recipes/mxfp8.md``).

1x32 blocks along the last dim (row-wise) and 32x1 blocks along the leading
dims (column-wise, data **not** transposed), each with an E8M0 scale byte
``e`` (decode ``2^(e-127)``). With ``with_2d_quantization`` (forward weights
under ``MXFP8BlockScaling(enable_2d_quantization=True)``) one scale serves each
32x32 tile and both usages hold the same bytes. Shapes need ``M % 32 == 0`` and
``K % 32 == 0``. Scale tensors are kept in the compact padded layout (not the
cuBLAS swizzle, ``docs/recipes/index.md#the-cublas-scale-swizzle``).
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch

from ..kernels import current_backend
from ..kernels.reference.quant_mxfp8 import check_mxfp8_shape
from ..layouts import mxfp8_scale_shape
from .quantized_tensor import QuantizedTensor
from .quantizer import DType, Quantizer, canonicalize_fp8_dtype, torch_fp8_dtype

__all__ = ["MXFP8Tensor", "MXFP8Quantizer"]


class MXFP8Tensor(QuantizedTensor):
    """FP8 data with one E8M0 byte per 32 elements, per usage.

    TE's constructor keywords: ``rowwise_data``, ``rowwise_scale_inv``,
    ``columnwise_data``, ``columnwise_scale_inv`` (all uint8), ``fp8_dtype``,
    ``quantizer``, ``with_gemm_swizzled_scales`` (only False: scales are compact).
    """

    _ROWWISE = ("_rowwise_data", "_rowwise_scale_inv")
    _COLUMNWISE = ("_columnwise_data", "_columnwise_scale_inv")
    _GEMM_FORMAT = "mxfp8"
    _CTOR_TENSORS = {
        "rowwise_data": "_rowwise_data",
        "rowwise_scale_inv": "_rowwise_scale_inv",
        "columnwise_data": "_columnwise_data",
        "columnwise_scale_inv": "_columnwise_scale_inv",
    }
    _CTOR_META = {
        "fp8_dtype": ("_fp8_dtype", DType.kFloat8E4M3),
        "with_gemm_swizzled_scales": ("_with_gemm_swizzled_scales", False),
    }

    def _validate(self) -> None:
        self._fp8_dtype = canonicalize_fp8_dtype(self._fp8_dtype)
        if self._with_gemm_swizzled_scales:
            raise NotImplementedError("refops keeps MXFP8 scales in the compact layout (with_gemm_swizzled_scales=False)")

    def _usage_arrays(self, usage: str) -> tuple[torch.Tensor, torch.Tensor]:
        if usage == "rowwise":
            return self._rowwise_data, self._rowwise_scale_inv
        return self._columnwise_data, self._columnwise_scale_inv

    def _gemm_arrays(self, usage: str, rows: int, last: int) -> dict[str, Any]:
        data, scale_inv = self._usage_arrays(usage)  # both usages keep the nominal shape: (rows, last)
        return {"data": data.reshape(rows, last), "scale_inv": scale_inv,
                "fp8_dtype": torch_fp8_dtype(self._fp8_dtype)}

    def _dequantize_usage(self, usage: str, dtype: torch.dtype) -> torch.Tensor:
        data, scale_inv = self._usage_arrays(usage)
        return current_backend().dequantize_mxfp8(
            data, scale_inv, fp8_dtype=torch_fp8_dtype(self._fp8_dtype), columnwise=usage == "columnwise", out_dtype=dtype
        )


class MXFP8Quantizer(Quantizer):
    """TE's ``MXFP8Quantizer(fp8_dtype, *, rowwise=True, columnwise=True, with_2d_quantization=False)``."""

    tensor_class = MXFP8Tensor
    #: TE's fused MXFP8 kernel rounds the activation to the compute dtype before its block amaxes (so the
    #: default :meth:`~refops.quantization.quantizer.Quantizer.quantize_unrounded` holds), but sums dbias first.
    dbias_from_unrounded = True

    def __init__(
        self,
        fp8_dtype: Any,
        *,
        rowwise: bool = True,
        columnwise: bool = True,
        with_2d_quantization: bool = False,
    ) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.dtype = canonicalize_fp8_dtype(fp8_dtype)
        self.with_2d_quantization = bool(with_2d_quantization)

    def is_quantizable(self, inp: torch.Tensor) -> bool:
        """Whether ``inp`` meets the shape requirement (2+ dims, ``M % 32 == 0``, ``K % 32 == 0``)."""
        try:
            check_mxfp8_shape(inp.shape)
        except ValueError:
            return False
        return True

    def _quantize_arrays(self, tensor: torch.Tensor, *, rowwise: bool, columnwise: bool) -> dict[str, Any]:
        row_data, row_scale, col_data, col_scale = current_backend().quantize_mxfp8(
            tensor,
            fp8_dtype=torch_fp8_dtype(self.dtype),
            rowwise=rowwise,
            columnwise=columnwise,
            with_2d_quantization=self.with_2d_quantization,
        )
        return {
            "rowwise_data": row_data,
            "rowwise_scale_inv": row_scale,
            "columnwise_data": col_data,
            "columnwise_scale_inv": col_scale,
            "fp8_dtype": self.dtype,
        }

    def _tensor_meta(self) -> dict[str, Any]:
        return {"fp8_dtype": self.dtype}

    def get_scale_shape(self, shape: Iterable[int], columnwise: bool) -> tuple[int, int]:
        """Padded scale shape (:func:`refops.layouts.mxfp8_scale_shape`): row-wise ``(⌈M⌉128, ⌈K/32⌉4)``,
        column-wise ``(⌈M/32⌉4, ⌈K⌉128)``."""
        return mxfp8_scale_shape(shape, columnwise=columnwise)

    def make_empty(
        self,
        shape: Iterable[int],
        *,
        dtype: torch.dtype = torch.float32,
        device: Optional[torch.device | str] = None,
        requires_grad: bool = False,
    ) -> MXFP8Tensor:
        shape = torch.Size(shape)
        check_mxfp8_shape(shape)
        device = torch.device("cpu") if device is None else torch.device(device)
        arrays: dict[str, Optional[torch.Tensor]] = {}
        for usage, enabled in (("rowwise", self.rowwise_usage), ("columnwise", self.columnwise_usage)):
            data = torch.empty(shape, dtype=torch.uint8, device=device) if enabled else None
            scale = None
            if enabled:
                scale = torch.empty(self.get_scale_shape(shape, usage == "columnwise"), dtype=torch.uint8, device=device)
            arrays[f"{usage}_data"], arrays[f"{usage}_scale_inv"] = data, scale
        return MXFP8Tensor(
            shape, dtype, device=device, requires_grad=requires_grad, quantizer=self, fp8_dtype=self.dtype, **arrays
        )

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "fp8_dtype": int(self.dtype), "with_2d_quantization": self.with_2d_quantization}

    @classmethod
    def _from_config(cls, config: dict[str, Any], tensors: dict[str, torch.Tensor], device: torch.device):
        return cls(DType(config.pop("fp8_dtype")), **config)
