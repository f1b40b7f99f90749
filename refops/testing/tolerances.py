"""TransformerEngine's test tolerances, per dtype and per recipe (``tests/pytorch/utils.py``)."""

from __future__ import annotations

import torch

__all__ = ["dtype_tols", "quantization_tols", "gemm_tols"]

_DTYPE_TOLS: dict[torch.dtype, dict[str, float]] = {
    torch.float16: dict(rtol=1e-3, atol=1e-5),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1e-5),
    torch.float32: dict(rtol=1.3e-6, atol=1e-5),
    torch.float64: dict(rtol=1e-7, atol=1e-7),
    torch.float8_e4m3fn: dict(rtol=0.125, atol=0.0675),
    torch.float8_e5m2: dict(rtol=0.25, atol=0.125),
}
_FP4_TOLS = dict(rtol=0.25, atol=0.125)


def dtype_tols(dtype: torch.dtype) -> dict[str, float]:
    """``{"rtol", "atol"}`` for comparing a result in ``dtype`` with a float64 reference."""
    if dtype not in _DTYPE_TOLS:
        raise ValueError(f"no tolerance defined for {dtype}")
    return dict(_DTYPE_TOLS[dtype])


def gemm_tols(dtype: torch.dtype) -> dict[str, float]:
    """Tolerances for a result that went through a GEMM: fp32 uses fp16's (TE's "TF32 GEMM" rule)."""
    return dtype_tols(torch.float16 if dtype == torch.float32 else dtype)


def quantization_tols(recipe_name: str) -> dict[str, float]:
    """Every FP8 recipe uses E4M3 tolerances; every NVFP4 variant uses E2M1 tolerances."""
    if recipe_name.startswith("nvfp4"):
        return dict(_FP4_TOLS)
    if recipe_name in ("fp8", "fp8_delayed_scaling", "fp8_current_scaling", "mxfp8", "fp8_block_scaling",
                       "delayed", "current", "block", "blockwise"):
        return dtype_tols(torch.float8_e4m3fn)
    raise ValueError(f"unknown quantization scheme {recipe_name!r}")
