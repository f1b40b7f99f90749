"""Figures of the element formats, computed with :mod:`refops.formats` (every value decoded from its bits).

* E4M3 and E5M2: every positive finite value on a log2 axis, and the relative step to
  the next value (constant per binade for normals, growing through the subnormals);
* E2M1: the 15 distinct values and the round-to-nearest-even staircase with its ties;
* E8M0: the power-of-two grid, and MXFP8's rule that turns a block amax into a scale
  byte (rounded *up*, so the scaled block max lands in (fmax/2, fmax]).
"""

from __future__ import annotations

import io
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from refops.formats import (  # noqa: E402
    E4M3,
    E5M2,
    Float8Format,
    e2m1_round_nearest_even,
    e2m1_to_fp32,
    e8m0_from_fp32,
    e8m0_to_fp32,
    fp32_from_bits,
)

__all__ = ["FIGURES", "fp8_positive_values", "png_bytes"]

NORMAL, SUBNORMAL, ACCENT = "#1f77b4", "#ff7f0e", "#d62728"
_MANTISSA_BITS = {"E4M3": 3, "E5M2": 2}


def png_bytes(fig: plt.Figure) -> bytes:
    """The figure as PNG bytes, without a timestamp or version stamp (so rebuilds are byte-identical)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def fp8_positive_values(fmt: Float8Format) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, is_subnormal)``: every positive finite value of ``fmt``, ascending, decoded from its byte."""
    codes = torch.arange(128, dtype=torch.uint8)  # sign bit clear
    values = fmt.to_fp32(codes)
    keep = torch.isfinite(values) & (values > 0)
    exponent_field = codes.to(torch.int64) >> _MANTISSA_BITS[fmt.name]
    return values[keep].double(), (exponent_field == 0)[keep]


def _fp8_figure(fmt: Float8Format) -> bytes:
    values, subnormal = fp8_positive_values(fmt)
    log2 = torch.log2(values)
    fig, (grid, step) = plt.subplots(2, 1, figsize=(9, 4.2), sharex=True, gridspec_kw={"height_ratios": [1, 2]})
    grid.vlines(log2[~subnormal], 0, 1, color=NORMAL, linewidth=0.8, label=f"normal ({int((~subnormal).sum())})")
    grid.vlines(log2[subnormal], 0, 1, color=SUBNORMAL, linewidth=0.8, label=f"subnormal ({int(subnormal.sum())})")
    grid.set_yticks([])
    grid.legend(loc="upper left", fontsize=8, ncols=2)
    grid.set_title(
        f"{fmt.name}: the {len(values)} positive finite values "
        f"(min subnormal 2^{int(log2[0])}, min normal 2^{int(log2[int(subnormal.sum())])}, max {fmt.max:g})"
    )
    relative = (values[1:] - values[:-1]) / values[:-1] * 100
    step.step(log2[:-1], relative, where="post", color=NORMAL)
    step.set_yscale("log")
    step.set_ylabel("step to next value (%)")
    step.set_xlabel("log2(value)")
    step.grid(True, which="both", alpha=0.3)
    return png_bytes(fig)


def _e2m1_figure() -> bytes:
    codes = torch.arange(16, dtype=torch.uint8)
    values = e2m1_to_fp32(codes)
    x = torch.linspace(-7, 7, 2801)
    rounded = e2m1_to_fp32(e2m1_round_nearest_even(x))
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    fig, (grid, stairs) = plt.subplots(2, 1, figsize=(9, 4.6), sharex=True, gridspec_kw={"height_ratios": [1, 3]})
    grid.vlines(values, 0, 1, color=NORMAL, linewidth=1.5)
    for v in values.unique().tolist():
        grid.annotate(f"{v:g}", (v, 1.05), ha="center", fontsize=7)
    grid.set_ylim(0, 1.5)
    grid.set_yticks([])
    grid.set_title("E2M1 (NVFP4 element): 16 codes, 15 values (+0 and -0); max 6, no inf, no NaN")
    stairs.plot(x, rounded, color=NORMAL, label="RNE, satfinite (values above 6 give 6)")
    tie_values = e2m1_to_fp32(e2m1_round_nearest_even(ties))
    stairs.plot(ties, tie_values, "o", color=ACCENT, markersize=4, label="ties go to the even code")
    stairs.plot(x, x, ":", color="gray", linewidth=0.8, label="exact")
    stairs.set_xlabel("input (after multiplying by the block's encode scale)")
    stairs.set_ylabel("E2M1 value")
    stairs.legend(fontsize=8, loc="upper left")
    stairs.grid(True, alpha=0.3)
    return png_bytes(fig)


def _e8m0_figure() -> bytes:
    exponents = torch.arange(255, dtype=torch.uint8)  # 255 is NaN
    grid_log2 = torch.log2(e8m0_to_fp32(exponents).double())
    amax = torch.logspace(-4, 10, 1401, base=2.0)
    inv_fmax = fp32_from_bits(torch.tensor([0x3B124925]))  # fl(1/448)
    scale = e8m0_to_fp32(e8m0_from_fp32(amax * inv_fmax)).double()
    fig, (grid, rule) = plt.subplots(2, 1, figsize=(9, 4.8), gridspec_kw={"height_ratios": [1, 3]})
    grid.vlines(grid_log2, 0, 1, color=NORMAL, linewidth=0.5)
    grid.set_yticks([])
    grid.set_xlabel("log2(value)")
    grid.set_title("E8M0 (MXFP8 block scale): byte e means 2^(e-127); 0 is 2^-127, 255 is NaN; no zero, no sign")
    rule.plot(torch.log2(amax), torch.log2(amax.double() / 448), ":", color="gray", label="log2(amax / 448)")
    rule.step(torch.log2(amax), torch.log2(scale), where="post", color=NORMAL, label="log2 of the E8M0 scale")
    rule.plot(torch.log2(amax), torch.log2(amax.double() / scale), color=ACCENT,
              label="log2(amax / scale): the block max after scaling")
    rule.axhline(torch.log2(torch.tensor(448.0)).item(), color=ACCENT, linestyle="--", linewidth=0.8)
    rule.set_xlabel("log2(block amax)")
    rule.legend(fontsize=8, loc="lower right")
    rule.grid(True, alpha=0.3)
    rule.set_title("MXFP8 rounds amax/448 UP to a power of two: the scaled block max lies in (224, 448]", fontsize=9)
    fig.tight_layout()
    return png_bytes(fig)


#: File name -> PNG maker.
FIGURES: dict[str, Callable[[], bytes]] = {
    "format-e4m3.png": lambda: _fp8_figure(E4M3),
    "format-e5m2.png": lambda: _fp8_figure(E5M2),
    "format-e2m1.png": _e2m1_figure,
    "format-e8m0.png": _e8m0_figure,
}
