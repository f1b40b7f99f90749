"""Quantization error against block amax, one figure per recipe, computed with refops' quantizers.

The synthetic tensor has 256 rows of 128 elements; row ``r`` is Gaussian noise scaled so
that its amax is exactly ``2^e_r``, with ``e_r`` running from -30 to 12. The whole tensor's
amax is therefore ``2^12``. Each curve quantizes the tensor once with a refops quantizer,
dequantizes it, and plots each row's SQNR (signal-to-quantization-noise ratio, in dB)
against the row's amax. A scale shared by many rows shows up as a slope: the rows far
below the amax that set the scale fall into the subnormals and then to zero (0 dB).
"""

from __future__ import annotations

import functools
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from format_figures import png_bytes  # noqa: E402
from refops import DType, Float8BlockQuantizer, Float8CurrentScalingQuantizer, Float8Quantizer, MXFP8Quantizer  # noqa: E402
from refops.quantization import NVFP4Quantizer, Quantizer  # noqa: E402

__all__ = ["FIGURES", "ROW_LOG2_AMAX", "synthetic_rows", "row_sqnr_db", "curves"]

ROWS, COLS = 256, 128
ROW_LOG2_AMAX = torch.linspace(-30, 12, ROWS, dtype=torch.float64)
E4M3 = DType.kFloat8E4M3


def synthetic_rows(seed: int = 0) -> torch.Tensor:
    """``(256, 128)`` fp32; row ``r`` has amax exactly ``2^ROW_LOG2_AMAX[r]`` (rounded to fp32)."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(ROWS, COLS, generator=generator)
    unit = noise / noise.abs().amax(dim=1, keepdim=True)  # each row's largest |value| is exactly 1
    return unit * torch.exp2(ROW_LOG2_AMAX).float()[:, None]


def row_sqnr_db(x: torch.Tensor, dequantized: torch.Tensor) -> torch.Tensor:
    """``10 log10(sum x^2 / sum (q - x)^2)`` per row, in float64 (an all-zero row of q gives 0 dB)."""
    x, q = x.double(), dequantized.double()
    signal = x.square().sum(dim=1)
    noise = (q - x).square().sum(dim=1).clamp_min(torch.finfo(torch.float64).tiny)
    return 10 * torch.log10(signal / noise)


def _sqnr(quantizer: Quantizer, x: torch.Tensor) -> torch.Tensor:
    return row_sqnr_db(x, quantizer(x).dequantize(dtype=torch.float32))


def _delayed(scale: float) -> Quantizer:
    return Float8Quantizer(torch.tensor([scale]), torch.zeros(1), E4M3, rowwise=True, columnwise=False)


def curves(recipe: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """``{label: per-row SQNR}`` for one recipe's quantizers on ``x``."""
    amax = x.abs().max().item()
    if recipe == "delayed":
        return {
            "scale 1 (the first step: the history is empty)": _sqnr(_delayed(1.0), x),
            "scale 448/amax (the history saw this amax)": _sqnr(_delayed(448.0 / amax), x),
            "scale 448/(amax/16) (the history saw 16x smaller)": _sqnr(_delayed(448.0 / (amax / 16)), x),
        }
    if recipe == "current":
        return {
            "Float8CurrentScalingQuantizer (E4M3)": _sqnr(Float8CurrentScalingQuantizer(E4M3, columnwise=False), x),
            "same, force_pow_2_scales=True": _sqnr(
                Float8CurrentScalingQuantizer(E4M3, columnwise=False, force_pow_2_scales=True), x
            ),
        }
    if recipe == "mxfp8":
        return {
            "1x32 blocks": _sqnr(MXFP8Quantizer(E4M3, columnwise=False), x),
            "32x32 tiles (with_2d_quantization)": _sqnr(MXFP8Quantizer(E4M3, columnwise=False, with_2d_quantization=True), x),
        }
    if recipe == "fp8_block":
        return {
            "1x128 blocks (block_scaling_dim=1)": _sqnr(
                Float8BlockQuantizer(E4M3, rowwise=True, columnwise=False, block_scaling_dim=1), x
            ),
            "128x128 tiles (block_scaling_dim=2)": _sqnr(
                Float8BlockQuantizer(E4M3, rowwise=True, columnwise=False, block_scaling_dim=2), x
            ),
        }
    if recipe == "nvfp4":
        return {
            "1x16 blocks": _sqnr(NVFP4Quantizer(rowwise=True, columnwise=False), x),
            "16x16 tiles (with_2d_quantization)": _sqnr(
                NVFP4Quantizer(rowwise=True, columnwise=False, with_2d_quantization=True), x
            ),
        }
    raise ValueError(f"unknown recipe {recipe!r}")


_TITLES = {
    "delayed": "Delayed scaling (E4M3): one scale from the amax history",
    "current": "Current scaling (E4M3): one scale from this tensor's amax",
    "mxfp8": "MXFP8: one E8M0 scale per 32 elements",
    "fp8_block": "FP8 block scaling: one fp32 scale per 128 elements (or 128x128 tile)",
    "nvfp4": "NVFP4: E4M3 scale per 16 elements under one fp32 tensor scale",
}


def _draw(ax: plt.Axes, series: dict[str, torch.Tensor], x: torch.Tensor) -> None:
    styles = ["-", "--", "-.", ":"]  # coinciding curves stay visible
    for (label, sqnr), style in zip(series.items(), styles):
        ax.plot(ROW_LOG2_AMAX, sqnr.clamp(-5, 60), style, linewidth=1.2, label=label)
    ax.axvline(torch.log2(x.abs().max().double()).item(), color="gray", linestyle="--", linewidth=0.8)
    ax.set_xlabel("log2(row amax)   (dashed: the tensor's amax)")
    ax.set_ylabel("row SQNR (dB)")
    ax.set_ylim(-5, 60)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")


@functools.lru_cache(maxsize=None)
def _curves_on_synthetic_rows(recipe: str) -> dict[str, torch.Tensor]:
    return curves(recipe, synthetic_rows())


def _recipe_figure(recipe: str) -> bytes:
    x = synthetic_rows()
    fig, ax = plt.subplots(figsize=(9, 3.6))
    _draw(ax, _curves_on_synthetic_rows(recipe), x)
    ax.set_title(_TITLES[recipe], fontsize=10)
    return png_bytes(fig)


def _overview_figure() -> bytes:
    x = synthetic_rows()
    series = {
        _TITLES[r].split(":")[0]: next(iter(_curves_on_synthetic_rows(r).values()))
        for r in ("current", "mxfp8", "fp8_block", "nvfp4")
    }
    fig, ax = plt.subplots(figsize=(9, 3.8))
    _draw(ax, series, x)
    ax.set_title("One tensor, four recipes (E4M3 data for the FP8 recipes, E2M1 for NVFP4)", fontsize=10)
    return png_bytes(fig)


#: File name -> PNG maker.
FIGURES: dict[str, Callable[[], bytes]] = {
    # MXFP8's own curves are flat on this tensor (every block of 32 spans well under E4M3's range), which teaches
    # nothing: its page shows its blocks and scales instead (recipe_figures), and the overview keeps its curve.
    **{f"error-{name.replace('_', '-')}.png": (lambda name=name: _recipe_figure(name)) for name in _TITLES
       if name != "mxfp8"},
    "error-overview.png": _overview_figure,
}
