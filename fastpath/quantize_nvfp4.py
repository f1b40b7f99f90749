"""NVFP4 quantize and dequantize: CUDA kernels, bit-identical to the reference.

The specification is ``refops.kernels.reference.quant_nvfp4``; options are validated
with the reference's own checks before any kernel runs.

===========================  ==============================================================
method                        kernels (``fastpath/kernels/``)
===========================  ==============================================================
quantize_nvfp4                pass 1: ``nvfp4.cu: nvfp4_amax_*`` or, for the column-wise
                              RHT, ``nvfp4_rht_amax_bf16``; pass 2: ``nvfp4_quantize_<v>_*``
                              (one kernel per option set: persistent, 64-row x 256-byte tiles
                              through a cp.async double buffer, last tile first)
dequantize_nvfp4              ``nvfp4_dequantize_rows_*`` / ``nvfp4_dequantize_cols_*``
                              (column-wise: one 64 k x 256 m tile per block of 512 threads,
                              a block per tile, 4 blocks resident per SM, one shared tile)
===========================  ==============================================================

What runs the reference instead (``super()``), and why: CPU tensors, dtypes other than
fp32/fp16/bf16, empty or non-2-D inputs, dequantize inputs in layouts the kernels do not
index (column-wise data whose K is not a multiple of 16, strided scale rows), and:

* Row-scaled NVFP4 (``row_scaled=True``): one amax (and S_enc) per row of x and per
  column for the column-wise copy; a forward-activation-only option that would need its
  own per-row and per-column amax pass and per-row scale plumbing through the tile
  kernel. It stays on the reference (the tests check the fallback is exact).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from refops.kernels.reference.quant_nvfp4 import check_random_bytes, validate_options
from refops.layouts import ceil_div, nvfp4_scale_shape, nvfp4_scale_valid_shape, rows_cols

from . import _cuda
from ._cuda import f32, get_kernel, i32, i64, ptr
from ._quantize_launch import _SUFFIX, _THREADS, _aligned, _fast_input, _on_cuda, _run, _sm_count

__all__ = ["Nvfp4Kernels"]


class Nvfp4Kernels:
    """Mixin overriding ``quantize_nvfp4`` and ``dequantize_nvfp4`` of ``KernelBackend``."""

    def quantize_nvfp4(self, x, *, rowwise, columnwise, with_2d_quantization=False, with_rht=False,
                       with_random_sign_mask=True, stochastic_rounding=False, random_bytes_rowwise=None,
                       random_bytes_columnwise=None, use_4over6=False, e4m3_max_4over6=256.0, err_mode="MAE",
                       row_scaled=False, amax_rowwise=None, amax_columnwise=None):
        options = dict(
            rowwise=rowwise, columnwise=columnwise, with_2d_quantization=with_2d_quantization, with_rht=with_rht,
            with_random_sign_mask=with_random_sign_mask, stochastic_rounding=stochastic_rounding,
            random_bytes_rowwise=random_bytes_rowwise, random_bytes_columnwise=random_bytes_columnwise,
            use_4over6=use_4over6, e4m3_max_4over6=e4m3_max_4over6, err_mode=err_mode, row_scaled=row_scaled,
        )
        # Given global amaxes (amax reduction under tensor parallelism) go to the reference: the kernels
        # compute their own amax in pass 1.
        reduced = amax_rowwise is not None or amax_columnwise is not None
        if reduced or not (_fast_input(x) and x.ndim == 2 and not row_scaled and _on_cuda(x, random_bytes_rowwise)
                           and _on_cuda(x, random_bytes_columnwise)):
            return super().quantize_nvfp4(x, **options, amax_rowwise=amax_rowwise, amax_columnwise=amax_columnwise)
        err_mode = err_mode.upper()
        e4m3_max_4over6 = float(e4m3_max_4over6)
        validate_options(x, dict(rowwise=rowwise, columnwise=columnwise, with_2d_quantization=with_2d_quantization,
                                 with_rht=with_rht, stochastic_rounding=stochastic_rounding, use_4over6=use_4over6,
                                 e4m3_max_4over6=e4m3_max_4over6, err_mode=err_mode, row_scaled=row_scaled))
        m, k = x.shape
        check_random_bytes("random_bytes_rowwise", random_bytes_rowwise, (m, k), stochastic_rounding and rowwise)
        check_random_bytes("random_bytes_columnwise", random_bytes_columnwise, (k, m),
                            stochastic_rounding and columnwise)
        return _quantize_nvfp4(
            _aligned(x), rowwise=rowwise, columnwise=columnwise, two_d=with_2d_quantization,
            rht=with_rht and columnwise, sign_mask=with_random_sign_mask,
            random_rowwise=_aligned(random_bytes_rowwise) if stochastic_rounding and rowwise else None,
            random_columnwise=_aligned(random_bytes_columnwise) if stochastic_rounding and columnwise else None,
            use_4over6=use_4over6, e4m3_max=e4m3_max_4over6 if use_4over6 else 448.0, mse=err_mode == "MSE",
        )

    def dequantize_nvfp4(self, data, scale_inv, amax, *, shape, columnwise, e4m3_max, out_dtype):
        plan = _dequantize_nvfp4_plan(data, scale_inv, amax, shape, columnwise, out_dtype)
        if plan is None:
            return super().dequantize_nvfp4(data, scale_inv, amax, shape=shape, columnwise=columnwise,
                                            e4m3_max=e4m3_max, out_dtype=out_dtype)
        rows, cols, a = plan
        q = _aligned(data)
        dev = data.device
        out = torch.empty(tuple(shape), dtype=out_dtype, device=dev)
        common = (ptr(scale_inv), i32(scale_inv.stride(0)), ptr(a), i32(int(a.numel() == rows and rows > 1)),
                  f32(np.float32(1.0 / (6.0 * e4m3_max))), ptr(out))
        sfx = _SUFFIX[out_dtype]
        if columnwise:  # tiles of 64 k x 256 m, 512 threads (16-bit outputs) or 64 k x 64 m, _THREADS (fp32),
            # one per block: a block per tile (DEQ_COLS_THREADS / DEQ_COLS_MINB in nvfp4.cu: 4 resident per SM for
            # 16-bit outputs, 6 for fp32)
            wide = out.element_size() == 2
            tiles = ceil_div(rows, 64) * ceil_div(cols, 256 if wide else 64)
            _run("nvfp4.cu", f"nvfp4_dequantize_cols_{sfx}", (tiles,), 512 if wide else _THREADS,
                 (ptr(q), i32(rows), i32(cols), *common), dev)
        else:  # grid-stride over 16-blocks (fp32) or 32-block chunks: one wave of resident blocks
            # (DEQ_ROWS_MINB in nvfp4.cu: 6 per SM for 16-bit outputs, 8 for fp32), no partial last wave
            per_sm = 6 if out.element_size() == 2 else 8
            blocks = min(ceil_div(rows * cols // 16, _THREADS), per_sm * _sm_count(dev.index or 0))
            _run("nvfp4.cu", f"nvfp4_dequantize_rows_{sfx}", (blocks,), _THREADS,
                 (ptr(q), i64(rows), i64(cols), *common), dev)
        return out


def _quantize_nvfp4(x: torch.Tensor, *, rowwise: bool, columnwise: bool, two_d: bool, rht: bool, sign_mask: bool,
                    random_rowwise: torch.Tensor | None, random_columnwise: torch.Tensor | None, use_4over6: bool,
                    e4m3_max: float, mse: bool) -> tuple[Any, ...]:
    """Validated, aligned ``x`` ``(M, K)``: pass 1 (global amaxes, one streaming read), pass 2 (data and scales)."""
    amaxes = nvfp4_global_amaxes(x, rowwise=rowwise, columnwise=columnwise, rht=rht, sign_mask=sign_mask)
    return nvfp4_cast(x, amaxes, rowwise=rowwise, columnwise=columnwise, two_d=two_d, rht=rht, sign_mask=sign_mask,
                      random_rowwise=random_rowwise, random_columnwise=random_columnwise, use_4over6=use_4over6,
                      e4m3_max=e4m3_max, mse=mse)


def nvfp4_global_amaxes(x: torch.Tensor, *, rowwise: bool, columnwise: bool, rht: bool,
                        sign_mask: bool) -> torch.Tensor:
    """Pass 1: ``[row-wise amax, column-wise amax]`` (fp32) of a validated, aligned ``x`` ``(M, K)``; 0 where
    that orientation is not asked.

    Both are max |x| except that with the column-wise RHT the second is the amax of the bf16 RHT outputs.
    One streaming read of ``x``; the benchmark times it on its own, as the amax pass of FP8 current scaling.
    """
    m, k = x.shape
    dev = x.device
    sms = _sm_count(dev.index or 0)
    amaxes = torch.zeros(2, dtype=torch.float32, device=dev)  # one fill for both orientations
    row_amax = amaxes[0:1] if rowwise else None
    col_amax = amaxes[1:2] if columnwise else None
    if rht:  # the column-wise amax is taken over the bf16 RHT outputs
        tasks = (m // 16) * (k // 4)
        # one wave of resident blocks (80 registers a thread: 3 blocks per SM on sm_90), each taking an equal share
        # of the chunks: 8 blocks per SM, as for the plain amax, ran 2.67 waves, the last a third empty
        wave = _cuda.resident_blocks(get_kernel("nvfp4.cu", "nvfp4_rht_amax_bf16", dev.index), dev.index, _THREADS,
                                     fallback_per_sm=2)
        _run("nvfp4.cu", "nvfp4_rht_amax_bf16", (max(1, min(ceil_div(tasks, _THREADS), wave)),), _THREADS,
             (ptr(x), i32(m), i32(k), i32(int(sign_mask)), ptr(row_amax), ptr(col_amax)), dev)
    else:  # both orientations see the same values
        n16 = x.numel() * x.element_size() // 16  # K % 16 == 0: whole 16-byte vectors
        _run("nvfp4.cu", f"nvfp4_amax_{_SUFFIX[x.dtype]}", (max(1, min(ceil_div(n16, 4 * _THREADS), 8 * sms)),),
             _THREADS, (ptr(x), i64(n16), ptr(row_amax), ptr(col_amax)), dev)
    return amaxes


def nvfp4_cast(x: torch.Tensor, amaxes: torch.Tensor, *, rowwise: bool, columnwise: bool, two_d: bool, rht: bool,
               sign_mask: bool, random_rowwise: torch.Tensor | None, random_columnwise: torch.Tensor | None,
               use_4over6: bool, e4m3_max: float, mse: bool) -> tuple[Any, ...]:
    """Pass 2: the data and block scales of each asked orientation, given pass 1's ``amaxes``.

    Returns ``(row_data, row_scale, row_amax, col_data, col_scale, col_amax)`` as ``quantize_nvfp4`` does
    (``None`` for an orientation not asked; the amaxes are views of ``amaxes``).
    """
    m, k = x.shape
    dev = x.device
    sfx = _SUFFIX[x.dtype]
    row_amax = amaxes[0:1] if rowwise else None
    col_amax = amaxes[1:2] if columnwise else None
    u8 = functools.partial(torch.empty, dtype=torch.uint8, device=dev)
    row_data = u8(m, k // 2) if rowwise else None
    col_data = u8(k, m // 2) if columnwise else None
    row_scale = _nvfp4_scale_tensor(m, k, dev) if rowwise else None
    col_scale = _nvfp4_scale_tensor(k, m, dev) if columnwise else None
    sr = random_rowwise is not None or random_columnwise is not None
    if use_4over6:
        variant = "4o6_2d" if two_d else "4o6"
    elif rht:
        variant = "sr_rht" if sr else "rht"
    else:
        variant = "_".join(["2d"] * two_d + ["sr"] * sr) or "std"
    tiles = ceil_div(m, 64) * ceil_div(k, 256 // x.element_size())  # 64 rows x 256 bytes
    name = f"nvfp4_quantize_{variant}_{sfx}"
    # persistent blocks, one wave of them (MINB in nvfp4.cu: 3 per SM; 4 for 1x16 4over6, 2 for SR with the RHT)
    wave = _cuda.resident_blocks(get_kernel("nvfp4.cu", name, dev.index), dev.index, _THREADS, fallback_per_sm=2)
    _run("nvfp4.cu", name, (max(1, min(tiles, wave)),), _THREADS,
         (ptr(x), i32(m), i32(k),
          ptr(row_data), ptr(row_scale), i32(row_scale.shape[1] if rowwise else 0), ptr(row_amax), ptr(random_rowwise),
          ptr(col_data), ptr(col_scale), i32(col_scale.shape[1] if columnwise else 0), ptr(col_amax),
          ptr(random_columnwise), i32(int(mse)), f32(np.float32(6.0 * e4m3_max)), i32(int(sign_mask))), dev)
    return row_data, row_scale, row_amax, col_data, col_scale, col_amax


def _nvfp4_scale_tensor(rows: int, cols: int, device: torch.device) -> torch.Tensor:
    """Scale bytes for data ``rows x cols``: the kernel writes ``[:rows, :cols/16]``; padding (if any) is zero."""
    shape = nvfp4_scale_shape((rows, cols))
    padded = shape != nvfp4_scale_valid_shape((rows, cols))
    return (torch.zeros if padded else torch.empty)(shape, dtype=torch.uint8, device=device)


def _dequantize_nvfp4_plan(data: torch.Tensor, scale_inv: torch.Tensor, amax: Any, shape: Any, columnwise: bool,
                           out_dtype: torch.dtype) -> tuple[int, int, torch.Tensor] | None:
    """``(rows, cols, amax fp32)`` when the kernels take these inputs as the reference reads them, else None."""
    if len(shape) == 0 or not _on_cuda(data, scale_inv) or out_dtype not in _SUFFIX:
        return None
    m, k = rows_cols(tuple(int(d) for d in shape))
    rows, cols = (k, m) if columnwise else (m, k)
    if (cols % 16 != 0 or data.dtype != torch.uint8 or tuple(data.shape) != (rows, cols // 2) or rows * cols == 0
            or scale_inv.dtype != torch.uint8 or scale_inv.dim() != 2 or scale_inv.stride(1) != 1
            or scale_inv.shape[0] < rows or scale_inv.shape[1] < cols // 16 or (columnwise and rows % 16 != 0)):
        return None
    a = torch.as_tensor(amax, dtype=torch.float32, device=data.device).reshape(-1).contiguous()
    if a.numel() not in (1, rows):
        return None
    return rows, cols, a
