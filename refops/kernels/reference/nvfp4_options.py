"""NVFP4 quantization's option checks: the shapes, dtypes and option combinations TE's kernels accept.

The reference (``quant_nvfp4.quantize_nvfp4``) and the fast path check their inputs with these same
functions, so both refuse exactly the same calls with the same messages.
"""

from __future__ import annotations

import torch

from ...layouts import NVFP4_BLOCK_SIZE as BLOCK

__all__ = ["SUPPORTED_DTYPES", "check_random_bytes", "validate_options"]

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_random_bytes(name: str, random_bytes: torch.Tensor | None, shape: tuple[int, int], needed: bool) -> None:
    """Stochastic rounding's bytes: given exactly when ``needed``, uint8 of ``shape`` (one per element)."""
    if not needed:
        if random_bytes is not None:
            raise ValueError(f"quantize_nvfp4: {name} given but not used (needs stochastic_rounding and that usage)")
        return
    if random_bytes is None:
        raise ValueError(f"quantize_nvfp4: stochastic_rounding needs {name}, one uint8 per element of shape {shape}")
    if random_bytes.dtype != torch.uint8 or tuple(random_bytes.shape) != shape:
        raise ValueError(
            f"quantize_nvfp4: {name} must be uint8 of shape {shape}, "
            f"got {random_bytes.dtype} of shape {tuple(random_bytes.shape)}"
        )


def validate_options(x2d: torch.Tensor, o: dict) -> None:
    """Reject shapes, dtypes and option combinations TE's kernels do not support (``o``: quantize_nvfp4's flags)."""
    if not isinstance(x2d, torch.Tensor) or x2d.ndim != 2:
        raise ValueError(f"quantize_nvfp4: expected a 2D tensor (M, K), got {getattr(x2d, 'shape', type(x2d))}")
    if x2d.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"quantize_nvfp4: expected float32, float16 or bfloat16 input, got {x2d.dtype}")
    m, k = x2d.shape
    if not (o["rowwise"] or o["columnwise"]):
        raise ValueError("quantize_nvfp4: at least one of rowwise / columnwise must be True")
    if k % BLOCK != 0:
        raise ValueError(f"quantize_nvfp4: K (last dim) must be a multiple of {BLOCK}, got shape {(m, k)}")
    if (o["columnwise"] or o["with_2d_quantization"]) and m % BLOCK != 0:
        raise ValueError(
            f"quantize_nvfp4: M (first dim) must be a multiple of {BLOCK} for columnwise or 2D quantization, "
            f"got shape {(m, k)}"
        )
    if o["with_rht"] and o["columnwise"] and x2d.dtype != torch.bfloat16:
        raise ValueError(f"quantize_nvfp4: the random Hadamard transform needs bfloat16 input, got {x2d.dtype}")
    if o["with_2d_quantization"] and o["with_rht"]:
        raise ValueError("quantize_nvfp4: 2D (16x16) quantization cannot be combined with the RHT")
    if o["use_4over6"]:
        if o["stochastic_rounding"]:
            raise ValueError("quantize_nvfp4: 4over6 cannot be combined with stochastic rounding")
        if o["with_rht"]:
            raise ValueError("quantize_nvfp4: 4over6 cannot be combined with the random Hadamard transform")
        if o["e4m3_max_4over6"] not in (256.0, 448.0):
            raise ValueError(f"quantize_nvfp4: e4m3_max_4over6 must be 256 or 448, got {o['e4m3_max_4over6']}")
        if o["err_mode"] not in ("MAE", "MSE"):
            raise ValueError(f"quantize_nvfp4: err_mode must be 'MAE' or 'MSE', got {o['err_mode']!r}")
    if o["row_scaled"]:
        excluded = (("with_rht", "the RHT"), ("with_2d_quantization", "2D quantization"), ("stochastic_rounding", "SR"))
        for flag, what in excluded:
            if o[flag]:
                raise ValueError(f"quantize_nvfp4: row-scaled NVFP4 cannot be combined with {what}")
