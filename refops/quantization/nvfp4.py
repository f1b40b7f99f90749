"""NVFP4: ``NVFP4Tensor`` and ``NVFP4Quantizer`` (``docs/recipes/nvfp4.md``).

E2M1 data packed two per byte, one E4M3 scale byte per 16 elements (per 16x16
tile for 2D weights) and one fp32 amax per tensor (per row when row-scaled).
The column-wise copy is **transposed** ``(K, M/2)`` and, with the random
Hadamard transform (RHT), holds the transform of ``x^T`` along M: its values are
in the Hadamard domain, which cancels in a GEMM whose two operands both carry it
(wgrad). Numerics: :mod:`refops.kernels.reference.quant_nvfp4`.

Stochastic rounding draws its random bytes (one per element) from torch's
generator of the tensor's device and hands them to the kernel, so a backend
reproduces every byte from the same bytes (TE's Philox stream is not reproduced).
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch

from ..kernels import current_backend
from ..layouts import NVFP4_BLOCK_SIZE, nvfp4_data_shape, nvfp4_scale_shape, rows_cols
from .quantized_tensor import QuantizedTensor
from .quantizer import DType, Quantizer

__all__ = ["NVFP4Tensor", "NVFP4Quantizer"]


def _check_shape(shape: Iterable[int]) -> None:
    shape = tuple(shape)
    m, k = rows_cols(shape)
    if len(shape) < 2 or m % NVFP4_BLOCK_SIZE or k % NVFP4_BLOCK_SIZE:
        raise ValueError(
            f"NVFP4 quantization needs a tensor of at least 2 dims whose last dim and product of leading dims "
            f"are multiples of {NVFP4_BLOCK_SIZE}; got shape {shape} (M={m}, K={k})"
        )


class NVFP4Tensor(QuantizedTensor):
    """Packed E2M1 data, E4M3 block scales and fp32 amaxes per usage.

    TE's constructor keywords: ``rowwise_data`` ``(*lead, K/2)``, ``rowwise_scale_inv``,
    ``columnwise_data`` ``(K, M/2)``, ``columnwise_scale_inv``, ``amax_rowwise``,
    ``amax_columnwise``, ``fp4_dtype``, ``quantizer``, ``with_gemm_swizzled_scales``
    (False only), ``row_scaled_nvfp4``, ``nvfp4_e4m3_max`` (448, or 256 under 4over6);
    refops adds ``columnwise_rht`` (the column-wise copy is in the Hadamard domain).
    """

    _ROWWISE = ("_rowwise_data", "_rowwise_scale_inv", "_amax_rowwise")
    _COLUMNWISE = ("_columnwise_data", "_columnwise_scale_inv", "_amax_columnwise")
    _GEMM_FORMAT = "nvfp4"
    _CTOR_TENSORS = {
        "rowwise_data": "_rowwise_data",
        "rowwise_scale_inv": "_rowwise_scale_inv",
        "amax_rowwise": "_amax_rowwise",
        "columnwise_data": "_columnwise_data",
        "columnwise_scale_inv": "_columnwise_scale_inv",
        "amax_columnwise": "_amax_columnwise",
    }
    _CTOR_META = {
        "fp4_dtype": ("_fp4_dtype", DType.kFloat4E2M1),
        "with_gemm_swizzled_scales": ("_with_gemm_swizzled_scales", False),
        "row_scaled_nvfp4": ("_row_scaled_nvfp4", False),
        "nvfp4_e4m3_max": ("_nvfp4_e4m3_max", 448),
        "columnwise_rht": ("_columnwise_rht", False),
    }

    def _validate(self) -> None:
        if self._fp4_dtype != DType.kFloat4E2M1:
            raise ValueError(f"NVFP4Tensor: fp4_dtype must be DType.kFloat4E2M1, got {self._fp4_dtype!r}")
        self._fp4_dtype = DType.kFloat4E2M1
        if self._with_gemm_swizzled_scales:
            raise NotImplementedError("refops keeps NVFP4 scales in the compact layout (with_gemm_swizzled_scales=False)")

    def _usage_arrays(self, usage: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(data, scale_inv, amax)`` of ``usage``, the data as its orientation's 2-D view (packed)."""
        m, k = rows_cols(self.shape)
        if usage == "rowwise":
            return self._rowwise_data.reshape(m, k // 2), self._rowwise_scale_inv, self._amax_rowwise
        return self._columnwise_data, self._columnwise_scale_inv, self._amax_columnwise

    def _gemm_arrays(self, usage: str, rows: int, last: int) -> dict[str, Any]:
        data, scale_inv, amax = self._usage_arrays(usage)
        return {"data": data, "scale_inv": scale_inv, "amax": amax, "e4m3_max": float(self._nvfp4_e4m3_max),
                "hadamard": usage == "columnwise" and bool(self._columnwise_rht)}

    def _dequantize_usage(self, usage: str, dtype: torch.dtype) -> torch.Tensor:
        data, scale, amax = self._usage_arrays(usage)
        return current_backend().dequantize_nvfp4(
            data, scale, amax, shape=tuple(self.shape), columnwise=usage == "columnwise",
            e4m3_max=float(self._nvfp4_e4m3_max), out_dtype=dtype,
        )

    def _dequantize_impl(self, dtype: torch.dtype, usage: Optional[str]) -> torch.Tensor:
        if usage is None and not self.has_usage("rowwise") and self._columnwise_rht:
            raise RuntimeError(
                "NVFP4Tensor holds only column-wise data in the Hadamard (RHT) domain; it has no plain values. "
                "Pass usage='columnwise' to read the transformed values (as a wgrad GEMM does)"
            )
        return super()._dequantize_impl(dtype, usage)


class NVFP4Quantizer(Quantizer):
    """TE's ``NVFP4Quantizer`` (same keywords; ``fp4_dtype`` must be ``DType.kFloat4E2M1``).

    ``with_rht`` applies the RHT to the column-wise copy (bf16 input only);
    ``with_post_rht_amax`` is accepted for TE compatibility: the column-wise amax
    with RHT is always taken after the transform. ``with_2d_quantization``: 16x16
    tiles; ``stochastic_rounding``: SR from torch's generator; ``row_scaled_nvfp4``:
    one amax per row; ``nvfp4_use_4over6`` with ``nvfp4_e4m3_max`` (256 or 448) and
    ``nvfp4_4over6_err_mode`` ("MAE"/"MSE").

    ``with_amax_reduction``: each global amax (column-wise: after the RHT) is
    all-reduced with MAX over ``amax_reduction_group`` before the scales are
    computed, so shards of one tensor quantized on different ranks share their
    global scale and can be all-gathered (TE's two-pass quantization). With
    ``row_scaled_nvfp4`` only the column-wise amaxes (one per column of ``x``,
    spanning the ranks' rows) are reduced; the row-wise ones belong to local rows.
    """

    tensor_class = NVFP4Tensor

    def __init__(
        self,
        fp4_dtype: Any = DType.kFloat4E2M1,
        rowwise: bool = True,
        columnwise: bool = True,
        with_amax_reduction: bool = False,
        amax_reduction_group: Any = None,
        with_rht: bool = False,
        with_post_rht_amax: bool = False,
        with_2d_quantization: bool = False,
        stochastic_rounding: bool = False,
        with_random_sign_mask: bool = True,
        row_scaled_nvfp4: bool = False,
        nvfp4_use_4over6: bool = False,
        nvfp4_e4m3_max: int = 448,
        nvfp4_4over6_err_mode: str = "MAE",
    ) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        if fp4_dtype != DType.kFloat4E2M1:
            raise ValueError(f"NVFP4Quantizer: fp4_dtype must be DType.kFloat4E2M1, got {fp4_dtype!r}")
        self.dtype = DType.kFloat4E2M1
        self.with_amax_reduction = bool(with_amax_reduction)
        self.amax_reduction_group = amax_reduction_group
        self.with_rht = bool(with_rht)
        self.with_post_rht_amax = bool(with_post_rht_amax)
        self.with_2d_quantization = bool(with_2d_quantization)
        self.stochastic_rounding = bool(stochastic_rounding)
        self.with_random_sign_mask = bool(with_random_sign_mask)
        self.row_scaled_nvfp4 = bool(row_scaled_nvfp4)
        self.nvfp4_use_4over6 = bool(nvfp4_use_4over6)
        self.nvfp4_e4m3_max = int(nvfp4_e4m3_max)
        self.nvfp4_4over6_err_mode = str(nvfp4_4over6_err_mode).upper()

    @property
    def e4m3_max(self) -> int:
        """The ``E`` of the global scale: ``nvfp4_e4m3_max`` under 4over6, else 448."""
        return self.nvfp4_e4m3_max if self.nvfp4_use_4over6 else 448

    def is_quantizable(self, inp: torch.Tensor) -> bool:
        """Whether ``inp`` supports a quantized all-gather (TE's meaning): 2+ dims with ``M % 16 == 0`` and
        ``K % 16 == 0``, and never for row-scaled NVFP4, whose per-row amaxes shards cannot share."""
        if self.row_scaled_nvfp4:
            return False
        try:
            _check_shape(inp.shape)
        except ValueError:
            return False
        return True

    def _quantize_unrounded(self, values: torch.Tensor, *, dtype: torch.dtype) -> NVFP4Tensor:
        """The global amax from the fp32 ``values``, the blocks (their amaxes, scales and codes) from the values
        rounded to ``dtype`` (TE's ``FUSED_ACTIVATION_AMAX_NVFP4``). With the RHT or per-row amaxes TE's
        quantizer takes its own amaxes, so this is the unfused path (round, then quantize)."""
        if self.with_rht or self.row_scaled_nvfp4:
            return super()._quantize_unrounded(values, dtype=dtype)
        values = self._high_precision_input(values).detach()
        _check_shape(values.shape)
        x2d = values.reshape(rows_cols(values.shape))
        row, col = current_backend().nvfp4_amax(x2d, rowwise=self.rowwise_usage, columnwise=self.columnwise_usage)
        amaxes = {"amax_rowwise": row, "amax_columnwise": col}
        dist = torch.distributed
        if self.with_amax_reduction and dist.is_available() and dist.is_initialized():
            for amax in (row, col):
                if amax is not None:
                    dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=self.amax_reduction_group)
        return self._quantize_new(values.to(dtype), amaxes={k: v for k, v in amaxes.items() if v is not None})

    def _quantize_arrays(self, tensor: torch.Tensor, *, rowwise: bool, columnwise: bool,
                         amaxes: Optional[dict[str, torch.Tensor]] = None) -> dict[str, Any]:
        """``amaxes``: the global amaxes to scale by, taken elsewhere (default: ``tensor``'s, reduced over the
        group with amax reduction)."""
        _check_shape(tensor.shape)
        m, k = rows_cols(tensor.shape)
        x2d = tensor.reshape(m, k)
        random_rowwise = random_columnwise = None
        if self.stochastic_rounding:
            draw = lambda shape: torch.randint(0, 256, shape, dtype=torch.uint8, device=tensor.device)  # noqa: E731
            random_rowwise = draw((m, k)) if rowwise else None
            random_columnwise = draw((k, m)) if columnwise else None
        row_data, row_scale, row_amax, col_data, col_scale, col_amax = current_backend().quantize_nvfp4(
            x2d,
            rowwise=rowwise,
            columnwise=columnwise,
            with_2d_quantization=self.with_2d_quantization,
            with_rht=self.with_rht,
            with_random_sign_mask=self.with_random_sign_mask,
            stochastic_rounding=self.stochastic_rounding,
            random_bytes_rowwise=random_rowwise,
            random_bytes_columnwise=random_columnwise,
            use_4over6=self.nvfp4_use_4over6,
            e4m3_max_4over6=float(self.nvfp4_e4m3_max),
            err_mode=self.nvfp4_4over6_err_mode,
            row_scaled=self.row_scaled_nvfp4,
            **(self._reduced_amaxes(x2d, rowwise=rowwise, columnwise=columnwise) if amaxes is None else amaxes),
        )
        if row_data is not None:
            row_data = row_data.reshape(nvfp4_data_shape(tensor.shape))
        return {
            "rowwise_data": row_data,
            "rowwise_scale_inv": row_scale,
            "amax_rowwise": row_amax,
            "columnwise_data": col_data,
            "columnwise_scale_inv": col_scale,
            "amax_columnwise": col_amax,
            **self._tensor_meta(),
        }

    def _reduced_amaxes(self, x2d: torch.Tensor, *, rowwise: bool, columnwise: bool) -> dict[str, torch.Tensor]:
        """Keyword arguments with the group's global amaxes; empty without amax reduction.

        Invariant: every rank of ``amax_reduction_group`` quantizes with the same
        global amax per orientation (the MAX of the ranks' own), so quantizing each
        shard equals quantizing the gathered tensor.
        """
        dist = torch.distributed
        if not (self.with_amax_reduction and dist.is_available() and dist.is_initialized()):
            return {}
        if dist.get_world_size(self.amax_reduction_group) == 1:
            return {}
        row, col = current_backend().nvfp4_amax(
            x2d, rowwise=rowwise, columnwise=columnwise, with_rht=self.with_rht,
            with_random_sign_mask=self.with_random_sign_mask, row_scaled=self.row_scaled_nvfp4,
        )
        out = {}
        if row is not None and not self.row_scaled_nvfp4:
            dist.all_reduce(row, op=dist.ReduceOp.MAX, group=self.amax_reduction_group)
            out["amax_rowwise"] = row
        if col is not None:
            dist.all_reduce(col, op=dist.ReduceOp.MAX, group=self.amax_reduction_group)
            out["amax_columnwise"] = col
        return out

    def _tensor_meta(self) -> dict[str, Any]:
        return {
            "fp4_dtype": self.dtype,
            "row_scaled_nvfp4": self.row_scaled_nvfp4,
            "nvfp4_e4m3_max": self.e4m3_max,
            "columnwise_rht": self.with_rht,
        }

    def get_scale_shape(self, shape: Iterable[int], columnwise: bool) -> tuple[int, int]:
        """Row-wise ``(⌈M⌉128, ⌈K/16⌉4)``; column-wise ``(⌈K⌉128, ⌈M/16⌉4)``
        (:func:`refops.layouts.nvfp4_scale_shape`)."""
        return nvfp4_scale_shape(shape, columnwise=columnwise)

    def make_empty(
        self,
        shape: Iterable[int],
        *,
        dtype: torch.dtype = torch.float32,
        device: Optional[torch.device | str] = None,
        requires_grad: bool = False,
    ) -> NVFP4Tensor:
        shape = torch.Size(shape)
        _check_shape(shape)
        device = torch.device("cpu") if device is None else torch.device(device)
        m, k = rows_cols(shape)
        arrays: dict[str, Optional[torch.Tensor]] = dict.fromkeys(NVFP4Tensor._CTOR_TENSORS)
        if self.rowwise_usage:
            arrays["rowwise_data"] = torch.empty(nvfp4_data_shape(shape), dtype=torch.uint8, device=device)
            arrays["rowwise_scale_inv"] = torch.empty(self.get_scale_shape(shape, False), dtype=torch.uint8, device=device)
            arrays["amax_rowwise"] = torch.zeros(m if self.row_scaled_nvfp4 else 1, device=device)
        if self.columnwise_usage:
            arrays["columnwise_data"] = torch.empty(nvfp4_data_shape(shape, columnwise=True), dtype=torch.uint8,
                                                    device=device)
            arrays["columnwise_scale_inv"] = torch.empty(self.get_scale_shape(shape, True), dtype=torch.uint8, device=device)
            arrays["amax_columnwise"] = torch.zeros(k if self.row_scaled_nvfp4 else 1, device=device)
        return NVFP4Tensor(shape, dtype, device=device, requires_grad=requires_grad, quantizer=self, **arrays,
                           **self._tensor_meta())

    def _config(self) -> dict[str, Any]:
        return {
            **super()._config(),
            "with_rht": self.with_rht,
            "with_post_rht_amax": self.with_post_rht_amax,
            "with_2d_quantization": self.with_2d_quantization,
            "stochastic_rounding": self.stochastic_rounding,
            "with_random_sign_mask": self.with_random_sign_mask,
            "row_scaled_nvfp4": self.row_scaled_nvfp4,
            "nvfp4_use_4over6": self.nvfp4_use_4over6,
            "nvfp4_e4m3_max": self.nvfp4_e4m3_max,
            "nvfp4_4over6_err_mode": self.nvfp4_4over6_err_mode,
        }
