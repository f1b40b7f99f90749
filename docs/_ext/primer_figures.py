"""The primer's figures (``docs/primer.md``), computed with :mod:`refops.formats` and refops' quantizers.

* ``primer-binades.png``: the E4M3 and E5M2 values from 1 to 16 on a linear axis: a fixed count per binade, so
  the step doubles from one binade to the next;
* ``primer-scaling.png``: a gradient-sized tensor against E4M3's range, cast as it is (scale 1) and after current
  scaling; what share of its values survive, from the quantizers' own output;
* ``primer-rounding.png``: round to nearest, ties to even, between two E4M3 neighbours; and satfinite at the top.
"""

from __future__ import annotations

import math
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import refops as te  # noqa: E402
from format_figures import ACCENT, NORMAL, SUBNORMAL, fp8_positive_values, png_bytes  # noqa: E402
from refops import DType  # noqa: E402
from refops.formats import E4M3, E5M2  # noqa: E402

__all__ = ["FIGURES", "gradient_like_tensor"]


def _binades_figure() -> bytes:
    fig, axes = plt.subplots(2, 1, figsize=(9, 3.4), sharex=True)
    colors = (NORMAL, SUBNORMAL)
    for ax, fmt in zip(axes, (E4M3, E5M2)):
        values, _ = fp8_positive_values(fmt)
        for e in range(0, 4):  # the binades [2^e, 2^(e+1))
            inside = values[(values >= 2.0**e) & (values < 2.0 ** (e + 1))]
            ax.vlines(inside, 0, 1, color=colors[e % 2], linewidth=1.4)
            step = (inside[1] - inside[0]).item()
            ax.annotate(f"[{2**e}, {2**(e + 1)}): {len(inside)} values, step {step:g}",
                        (2.0**e, 1.08 + 0.4 * (e % 2)), ha="left", fontsize=8, color=colors[e % 2])
        ax.set_ylim(0, 1.9)
        ax.set_yticks([])
        ax.set_ylabel(fmt.name, rotation=0, ha="right", va="center")
        ax.set_xlim(0.8, 16.2)
    axes[1].set_xlabel("value (linear axis): each binade holds the same number of values, so the step doubles")
    fig.suptitle("E4M3 (3 mantissa bits: 8 values per binade) and E5M2 (2 bits: 4 per binade), from 1 to 16",
                 fontsize=10)
    fig.tight_layout()
    return png_bytes(fig)


def gradient_like_tensor() -> torch.Tensor:
    """4096 Gaussian values with a standard deviation of ``2^-14`` (about 6e-5), the size of many gradients."""
    return torch.randn(64, 64, generator=torch.Generator().manual_seed(0)) * 2.0**-14


def _scaling_figure() -> bytes:
    x = gradient_like_tensor()
    e4m3 = DType.kFloat8E4M3
    as_is = te.Float8Quantizer(torch.ones(1), torch.zeros(1), e4m3, columnwise=False)
    current = te.Float8CurrentScalingQuantizer(e4m3, columnwise=False)
    unscaled, scaled = as_is(x), current(x)  # current(x) also sets current.scale
    scale = current.scale.item()
    fig, axes = plt.subplots(2, 1, figsize=(9, 4.8), sharex=True)
    bins = torch.linspace(-30, 10, 161).numpy()
    for ax, (title, values, t) in zip(axes, (("cast as it is (scale 1)", x, unscaled),
                                            (f"multiplied by s = 448 / amax = {scale:.4g} first", x * scale, scaled))):
        ax.axvspan(-9, -6, color=SUBNORMAL, alpha=0.15, label="E4M3 subnormals (2^-9 to 2^-6)")
        ax.axvspan(-6, math.log2(E4M3.max), color=NORMAL, alpha=0.1, label="E4M3 normals (2^-6 to 448)")
        ax.hist(torch.log2(values.abs()).flatten().numpy(), bins=bins, color=NORMAL)
        survived = (t.dequantize() != 0).float().mean().item() * 100
        ax.set_title(f"{title}: {survived:.1f} % of the values are still nonzero after the cast", fontsize=9)
        ax.set_ylabel("values")
        ax.legend(fontsize=8, loc="upper left")
    axes[1].set_xlabel("log2 |value|")
    fig.tight_layout()
    return png_bytes(fig)


def _rounding_figure() -> bytes:
    fig, (near, top) = plt.subplots(1, 2, figsize=(9, 3.6))
    x = torch.linspace(0.95, 1.55, 1201)
    near.plot(x, E4M3.quantize(x).float(), color=NORMAL, label="RN: E4M3.quantize(x)")
    near.plot(x, x, ":", color="gray", linewidth=0.8, label="exact")
    ties = torch.tensor([1.0625, 1.1875, 1.3125, 1.4375])  # midway between neighbours 1/8 apart
    near.plot(ties, E4M3.quantize(ties).float(), "o", color=ACCENT, markersize=5,
              label="ties: to the even neighbour")
    grid = torch.tensor([1.0, 1.125, 1.25, 1.375, 1.5])
    near.set_xticks(grid.tolist(), [f"{v:g}" for v in grid.tolist()])
    near.set_yticks(grid.tolist())
    near.set_title("Round to nearest, ties to even (E4M3 near 1)", fontsize=9)
    near.set_xlabel("x")
    near.legend(fontsize=8, loc="upper left")
    near.grid(True, alpha=0.3)
    big = torch.linspace(256, 1024, 1537)
    top.plot(big, E4M3.quantize(big).float(), color=NORMAL, label="satfinite: beyond 448 gives 448")
    top.plot([464, 1024], [1024, 1024], "--", color=ACCENT, label="without it: inf (E4M3 has none: NaN)")
    top.plot(big, big, ":", color="gray", linewidth=0.8)
    top.set_title("Saturation at the top of the range (E4M3, max 448)", fontsize=9)
    top.set_xlabel("x")
    top.set_yticks([256, 320, 384, 448, 1024], ["256", "320", "384", "448", "inf"])
    top.legend(fontsize=8, loc="upper left")
    top.grid(True, alpha=0.3)
    fig.tight_layout()
    return png_bytes(fig)


#: File name -> PNG maker.
FIGURES: dict[str, Callable[[], bytes]] = {
    "primer-binades.png": _binades_figure,
    "primer-scaling.png": _scaling_figure,
    "primer-rounding.png": _rounding_figure,
}
