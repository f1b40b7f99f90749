"""The figure of what is particular to each recipe, drawn from what refops' quantizers and ops compute.

* ``recipe-gemms.png`` (recipes/index): the three GEMMs of a ``te.ops.Linear``, recorded by a kernel backend
  that notes which copy (row-wise / column-wise) of each quantized operand every GEMM reads, and its shape;
* ``recipe-current-scaling.png``: one amax for the whole tensor sets one scale, so an outlier moves every value;
* ``recipe-delayed-timeline.png``: eight training steps under ``DelayedScaling``: each step's input amax, the
  scale its cast used (from earlier steps' amaxes) and the amax history after each update;
* ``recipe-mxfp8-blocks.png``: 1x32 and 32x1 blocks with their E8M0 scales, and the padded scale matrix;
* ``recipe-fp8-block-layouts.png``: 1x128 blocks and 128x128 tiles with their fp32 power-of-two scales;
* ``recipe-nvfp4-scales.png``: NVFP4's two levels: E4M3 block scales under one fp32 tensor scale.

Every number drawn comes from a quantizer's output (``dequantize()``, ``gemm_operand(usage)``) or a recipe
state; nothing is recomputed by hand here. Seeds are fixed, so the PNGs are byte-identical between builds.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

import refops as te  # noqa: E402
from format_figures import ACCENT, NORMAL, SUBNORMAL, png_bytes  # noqa: E402
from refops import DType  # noqa: E402
from refops.formats import E4M3  # noqa: E402
from refops.kernels import ReferenceKernels, use_backend  # noqa: E402
from refops.kernels.gemm_numerics import gemm_role  # noqa: E402
from refops.kernels.reference.gemm_operands import gemm_operands  # noqa: E402
from refops.quantization import NVFP4Quantizer  # noqa: E402
from refops.recipe import DelayedScaling, Float8CurrentScaling, Format, MXFP8BlockScaling  # noqa: E402

__all__ = ["FIGURES", "record_linear_gemms", "delayed_scaling_steps"]

E4M3_DTYPE = DType.kFloat8E4M3
GRAY = "#9a9a9a"


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------------------------- the three GEMMs
class _RecordingKernels(ReferenceKernels):
    """The reference kernels, noting for every GEMM the copy and stored shape of each quantized operand."""

    name = "docs-recording"

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[tuple[str, tuple[int, int], tuple[int, ...]]]]] = []

    def gemm(self, a, b, *, trans_a=False, trans_b=False, role=None, **kwargs):
        operands = gemm_operands(a, b, trans_a=trans_a, trans_b=trans_b, values=False)
        read = [(op.usage, op.shape, tuple(op.data.shape)) for op in operands]
        self.calls.append((gemm_role(role, trans_a=trans_a, trans_b=trans_b), read))
        return super().gemm(a, b, trans_a=trans_a, trans_b=trans_b, role=role, **kwargs)


def record_linear_gemms(recipe, m: int = 256, k: int = 128, n: int = 64):
    """``[(gemm, [(usage, nominal (rows, cols), stored data shape), ...]), ...]`` of one training step."""
    torch.manual_seed(0)
    layer = te.ops.Linear(k, n, bias=False)
    x = torch.randn(m, k, requires_grad=True)
    backend = _RecordingKernels()
    with use_backend(backend):
        with te.autocast(recipe=recipe):
            y = layer(x)
        y.sum().backward()
    return backend.calls


_GEMM_MATH = {"fprop": "y = x W$^T$", "dgrad": "dx = dy W", "wgrad": "dW = dy$^T$ x"}


def _gemm_figure() -> bytes:
    m, k, n = 256, 128, 64
    names = {(m, k): "x", (n, k): "W", (m, n): "dy"}
    dims = {m: "M (tokens)", k: "K (in_features)", n: "N (out_features)"}
    calls = record_linear_gemms(Float8CurrentScaling(), m, k, n)
    mxfp8 = {role: read for role, read in record_linear_gemms(MXFP8BlockScaling(), m, k, n)}
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.6))
    colors = {"rowwise": NORMAL, "columnwise": SUBNORMAL}
    for ax, (role, read) in zip(axes, calls):
        contracted = read[0][2][1]  # both copies are stored with the contracted dim last
        ax.set_title(f"{role}: {_GEMM_MATH[role]}\ncontracts {dims[contracted]} = {contracted}", fontsize=10)
        x0 = 0.0
        for (usage, nominal, stored), (_, _, stored_mx) in zip(read, mxfp8[role]):
            name = names[nominal]
            h, w = stored[0] / 256 * 2.4, stored[1] / 256 * 2.4  # drawn as stored: rows down, last dim across
            ax.add_patch(Rectangle((x0, 3 - h), w, h, facecolor=colors[usage], alpha=0.25, edgecolor=colors[usage]))
            steps = 8
            for i in range(1, steps):  # stripes along the contracted dim: the stored last dim
                ax.plot([x0, x0 + w], [3 - h * i / steps] * 2, color=colors[usage], linewidth=0.6)
            label = f"{name} {usage}\nstored {stored[0]}x{stored[1]}"
            if stored_mx != stored:
                label += f"\n(MXFP8: {stored_mx[0]}x{stored_mx[1]})"
            ax.text(x0 + w / 2, 3 - h - 0.12, label, ha="center", va="top", fontsize=8)
            x0 += max(w, 0.9) + 0.55
        ax.set_xlim(-0.4, 4.0)
        ax.set_ylim(0, 3.1)
        ax.set_aspect("equal")
        ax.axis("off")
    fig.suptitle(
        "Each GEMM reads, of each operand, the copy whose stored rows (the stripes) run along the dim it "
        "contracts; recorded from one\ntraining step of te.ops.Linear(128, 64) on 256 tokens under Float8CurrentScaling (blue: row-wise, orange: "
        "column-wise)", fontsize=9,
    )
    fig.tight_layout()
    return png_bytes(fig)


# ----------------------------------------------------------------------------------------------- current scaling
def _current_scaling_figure() -> bytes:
    bulk = torch.randn(8192, generator=_generator(1))
    with_outlier = bulk.clone()
    with_outlier[0] = 200 * bulk.abs().max()
    fig, axes = plt.subplots(2, 1, figsize=(9, 4.6), sharex=True)
    bins = torch.linspace(-24, 10, 137)
    for ax, (title, x) in zip(axes, (("no outlier", bulk), ("one value 200x the others", with_outlier))):
        quantizer = te.Float8CurrentScalingQuantizer(E4M3_DTYPE, columnwise=False)
        decoded = quantizer(x[None]).dequantize()[0]
        scaled = (x.double() * quantizer.scale.double()).abs()
        ax.axvspan(-9, -6, color=SUBNORMAL, alpha=0.15, label="E4M3 subnormals")
        ax.axvspan(-6, math.log2(448), color=NORMAL, alpha=0.1, label="E4M3 normals")
        ax.hist(torch.log2(scaled[scaled > 0]).numpy(), bins=bins.numpy(), color=NORMAL)
        ax.axvline(math.log2(448), color=ACCENT, linestyle="--", linewidth=0.9)
        zeros = float((decoded[x != 0] == 0).float().mean() * 100)
        subnormal = float(((decoded != 0) & (decoded.abs() * quantizer.scale < 2**-6)).float().mean() * 100)
        ax.set_title(
            f"{title}: amax A = {quantizer.amax.item():.4g}, scale s = RN(448 / A) = {quantizer.scale.item():.4g};"
            f"  {subnormal:.1f} % subnormal, {zeros:.2f} % zero", fontsize=9,
        )
        ax.set_ylabel("values")
        ax.legend(fontsize=8, loc="upper left")
    axes[1].set_xlabel("log2 |x * s|   (the whole tensor's amax lands on 448, dashed)")
    fig.tight_layout()
    return png_bytes(fig)


# ----------------------------------------------------------------------------------------------- delayed scaling
DELAYED_INPUT_AMAX = (100.0, 100.0, 800.0, 100.0, 100.0, 100.0, 100.0, 25.0)
DELAYED_HISTORY_LEN = 4


@functools.lru_cache(maxsize=None)
def delayed_scaling_steps() -> list[dict]:
    """One dict per training step of a ``te.ops.Linear`` under ``DelayedScaling(amax_history_len=4)``.

    ``amax``: the input's amax; ``scale_used``: the input quantizer's scale during the step; ``clipped``: whether
    that cast saturated (its largest decoded value is ``448 * scale_inv``, below the amax); ``history``: the slot's
    ``amax_history`` after the update; ``scale_after``: the scale the update chose for the next step.
    """
    torch.manual_seed(0)
    recipe = DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=DELAYED_HISTORY_LEN)
    layer = te.ops.Linear(32, 32)
    linear = layer.basic_ops[0]
    unit = torch.randn(64, 32, generator=_generator(2))
    unit = unit / unit.abs().max()
    steps = []
    for amax in DELAYED_INPUT_AMAX:
        before = linear.get_quantizer("forward", 0)  # None before the first forward builds the recipe state
        scale_used = 1.0 if before is None else before.scale.item()
        x = amax * unit
        probe = te.Float8Quantizer(torch.tensor([scale_used]), torch.zeros(1), E4M3_DTYPE, columnwise=False)
        probe_t = probe(x)  # the cast the step's forward makes of its input, with the same scale
        kept = probe_t.dequantize().abs().max()
        with te.autocast(recipe=recipe):
            y = layer(x)
        y.sum().backward()
        quantizer = linear.get_quantizer("forward", 0)  # the input's slot
        state, slot = quantizer.recipe_slot
        steps.append({
            "amax": x.abs().max().item(),
            "scale_used": scale_used,
            "clipped": bool(kept < x.abs().max() and kept == 448 * probe_t.gemm_operand("rowwise").scale_inv),
            "history": state.amax_history[:, slot].tolist(),
            "scale_after": quantizer.scale.item(),
        })
    return steps


def _delayed_timeline_figure() -> bytes:
    steps = delayed_scaling_steps()
    n = len(steps)
    index = torch.arange(1, n + 1)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.2), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    amax = torch.tensor([s["amax"] for s in steps])
    ceiling = torch.tensor([448.0 / s["scale_used"] for s in steps])
    top.bar(index, torch.log2(ceiling), color=NORMAL, alpha=0.2, width=0.8,
            label="448 / s: the largest value the step's cast can hold")
    top.plot(index, torch.log2(amax), "o", color=NORMAL, label="the input's amax this step")
    clipped = [i for i, s in enumerate(steps) if s["clipped"]]
    top.plot(index[clipped], torch.log2(amax[clipped]), "o", color=ACCENT, markersize=9, fillstyle="none",
             label="clipped: saturated at 448 / s")
    for i, s in enumerate(steps):
        top.annotate(f"s={s['scale_used']:.3g}", (i + 1, math.log2(448.0 / s["scale_used"])), ha="center",
                     va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
    top.set_ylabel("log2(value)")
    top.set_ylim(3, 11.5)
    top.legend(fontsize=8, loc="upper left", ncols=3)
    top.set_title("Delayed scaling: each step casts with the scale the previous updates chose "
                  f"(amax_history_len={DELAYED_HISTORY_LEN}, \"max\")", fontsize=10)
    history = torch.tensor([s["history"][1:] for s in steps]).t()  # rows 1..L-1 after each update
    shown = torch.where(history > 0, torch.log2(history.clamp_min(1e-30)), torch.full_like(history, float("nan")))
    bottom.imshow(shown.numpy(), aspect="auto", cmap="Blues", vmin=2, vmax=11,
                  extent=(0.5, n + 0.5, history.shape[0] + 0.5, 0.5))
    for row in range(history.shape[0]):
        for col in range(n):
            value = history[row, col].item()
            bottom.text(col + 1, row + 1, f"{value:g}" if value else "-", ha="center", va="center", fontsize=8)
    bottom.set_yticks(range(1, history.shape[0] + 1), [f"h[{r}]" for r in range(1, history.shape[0] + 1)])
    bottom.set_xticks(index.tolist(), [f"step {i}\nnext s={s['scale_after']:.3g}" for i, s in zip(index.tolist(), steps)],
                      fontsize=8)
    bottom.set_title("amax_history after each step's update (oldest at top; the roll drops h[1], appends this step's "
                     "amax)\nnext s = 448 / max(history window)", fontsize=9)
    fig.tight_layout()
    return png_bytes(fig)


# ------------------------------------------------------------------------------------------------- block layouts
def _graded(m: int, k: int, seed: int, row_binades: float, col_binades: float) -> torch.Tensor:
    """``(m, k)`` Gaussian values whose magnitude grows smoothly down the rows and across the columns."""
    noise = torch.randn(m, k, generator=_generator(seed))
    rows = torch.linspace(0, row_binades, m)[:, None]
    cols = torch.linspace(0, col_binades, k)[None, :]
    return noise * torch.exp2(rows + cols)


def _block_image(ax, log2_scale: torch.Tensor, block: tuple[int, int], shape: tuple[int, int], title: str,
                 vmin: float, vmax: float):
    """Each element colored by the log2 of its block's scale, with the block edges drawn."""
    image = log2_scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[: shape[0], : shape[1]]
    shown = ax.imshow(image.numpy(), cmap="viridis", vmin=vmin, vmax=vmax, interpolation="nearest", aspect="auto")
    for r in range(0, shape[0] + 1, block[0]):
        if block[0] > 1 or r % 8 == 0:
            ax.axhline(r - 0.5, color="white", linewidth=0.4 if block[0] == 1 else 1.2)
    for c in range(0, shape[1] + 1, block[1]):
        if block[1] > 1 or c % 8 == 0:
            ax.axvline(c - 0.5, color="white", linewidth=0.4 if block[1] == 1 else 1.2)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("k (last dim)")
    ax.set_ylabel("m (rows)")
    return shown


def _mxfp8_figure() -> bytes:
    m, k = 64, 128
    x = _graded(m, k, seed=3, row_binades=6, col_binades=4)
    t = te.MXFP8Quantizer(E4M3_DTYPE)(x)
    rowwise, columnwise = t.gemm_operand("rowwise", values=False), t.gemm_operand("columnwise", values=False)
    # E8M0 byte e means 2^(e - 127): the valid region of each scale matrix, as log2 of the decode scale.
    row_log2 = rowwise.scale_inv[:m, : k // 32].float() - 127
    col_log2 = columnwise.scale_inv[: m // 32, :k].float() - 127
    vmin, vmax = min(row_log2.min(), col_log2.min()).item(), max(row_log2.max(), col_log2.max()).item()
    fig, axes = plt.subplots(1, 3, figsize=(10, 4.0), gridspec_kw={"width_ratios": [4, 4, 1.6]}, layout="constrained")
    shown = _block_image(axes[0], row_log2, (1, 32), (m, k), f"row-wise: 1x32 blocks\nscales {tuple(row_log2.shape)} "
                         "[m, k/32]", vmin, vmax)
    _block_image(axes[1], col_log2, (32, 1), (m, k), f"column-wise: 32x1 blocks, data not transposed\nscales "
                 f"{tuple(col_log2.shape)} [m/32, k]", vmin, vmax)
    stored = rowwise.scale_inv.float()
    padded = torch.where(torch.arange(stored.shape[0])[:, None] < m, stored - 127, torch.tensor(float("nan")))
    cmap = plt.get_cmap("viridis").copy()
    cmap.set_bad("#dddddd")
    axes[2].imshow(padded.numpy(), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    axes[2].set_title(f"row-wise scales\nas stored: {tuple(stored.shape)}\n(gray: zero padding)", fontsize=9)
    axes[2].set_xticks(range(stored.shape[1]))
    axes[2].set_xlabel("k/32")
    bar = fig.colorbar(shown, ax=axes[:2].tolist(), shrink=0.85, pad=0.02)
    bar.set_label("E8M0 scale: log2 = byte - 127", fontsize=8)
    fig.suptitle(f"MXFP8 on a {m}x{k} tensor whose magnitude grows down and across: each block of 32 gets a "
                 "power-of-two scale (a byte)", fontsize=9)
    return png_bytes(fig)


def _fp8_block_figure() -> bytes:
    m, k = 256, 384
    x = _graded(m, k, seed=4, row_binades=8, col_binades=6)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), layout="constrained")
    shown = None
    panels = []
    for dim in (1, 2):
        quantizer = te.Float8BlockQuantizer(E4M3_DTYPE, rowwise=True, columnwise=True, block_scaling_dim=dim)
        t = quantizer(x)
        rowwise = t.gemm_operand("rowwise", values=False)
        stored = tuple(rowwise.scale_inv.shape)
        if dim == 1:  # stored [k/128, m] (M contiguous): transposed back to [m, k/128] to draw
            log2 = torch.log2(rowwise.scale_inv[: math.ceil(k / 128), :m].t())
            block, label = (1, 128), f"1x128 blocks (activations, gradients)\nscales stored {stored}: [k/128, m]"
        else:
            log2 = torch.log2(rowwise.scale_inv[: math.ceil(m / 128), : math.ceil(k / 128)])
            block, label = (128, 128), f"128x128 tiles (weights)\nscales stored {stored}: [m/128, k/128], padded"
        panels.append((log2, block, label))
    vmin = min(p[0].min().item() for p in panels)
    vmax = max(p[0].max().item() for p in panels)
    for ax, (log2, block, label) in zip(axes, panels):
        shown = _block_image(ax, log2, block, (m, k), label, vmin, vmax)
    bar = fig.colorbar(shown, ax=axes.tolist(), shrink=0.85, pad=0.02)
    bar.set_label("log2 of the fp32 scale_inv (a power of two)", fontsize=8)
    fig.suptitle(f"FP8 block scaling on a {m}x{k} tensor whose magnitude grows down and across: one scale per "
                 "block of 128, or per 128x128 tile", fontsize=9)
    return png_bytes(fig)


# ------------------------------------------------------------------------------------------------------- NVFP4
NVFP4_BLOCKS = 256
NVFP4_SPAN = 24  # binades between the loudest and the quietest block


def nvfp4_two_level_tensor() -> torch.Tensor:
    """``(16, 256)``: 256 blocks of 16; block ``i`` has amax ``2^(-24 i / 255)``, exactly (the first is the
    tensor's amax, 1)."""
    noise = torch.randn(NVFP4_BLOCKS, 16, generator=_generator(5))
    unit = noise / noise.abs().amax(dim=1, keepdim=True)
    log2_amax = -torch.linspace(0, NVFP4_SPAN, NVFP4_BLOCKS)
    return (unit * torch.exp2(log2_amax)[:, None]).reshape(16, 256)


def _nvfp4_figure() -> bytes:
    x = nvfp4_two_level_tensor()
    t = NVFP4Quantizer(rowwise=True, columnwise=False)(x)
    operand = t.gemm_operand("rowwise", values=False)
    global_amax = operand.amax.item()
    block_amax = x.reshape(NVFP4_BLOCKS, 16).abs().amax(dim=1)
    s_b = E4M3.to_fp32(operand.scale_inv[:16, :16]).reshape(-1)  # the stored E4M3 bytes, decoded
    decoded = t.dequantize().reshape(NVFP4_BLOCKS, 16)
    relative = torch.log2(block_amax / global_amax)
    # From the format: E4M3's smallest normal is 2^-6 and half its smallest subnormal, 2^-10, rounds to zero.
    smallest_normal = torch.finfo(E4M3.torch_dtype).smallest_normal
    normal_binades = math.log2(E4M3.max / smallest_normal)
    zero_binades = math.log2(E4M3.max / (smallest_normal * torch.finfo(E4M3.torch_dtype).eps / 2))
    fig, (scales, values) = plt.subplots(2, 1, figsize=(9, 5.4), sharex=True)
    normal = s_b >= 2**-6
    sub = (s_b > 0) & ~normal
    scales.plot(relative, torch.log2(block_amax / global_amax * 448), ":", color=GRAY,
                label="448 * b / A: the scale each block asks for")
    scales.plot(relative[normal], torch.log2(s_b[normal]), ".", color=NORMAL, label="stored E4M3 scale: normal")
    scales.plot(relative[sub], torch.log2(s_b[sub]), ".", color=SUBNORMAL, label="subnormal (coarser)")
    zero = s_b == 0
    scales.plot(relative[zero], torch.full((int(zero.sum()),), -11.0), "x", color=ACCENT, markersize=4,
                label="scale 0 (below 2^-10 rounds to zero)")
    scales.axhline(math.log2(448), color=GRAY, linewidth=0.6)
    scales.axhline(-6, color=GRAY, linewidth=0.6)
    scales.axhline(-9, color=GRAY, linewidth=0.6)
    scales.set_ylabel("log2(block scale s_b)")
    scales.set_title(
        f"Level 1, the tensor: A = {global_amax:g}, S_enc = 2688 / A maps the loudest block's scale to 448.   "
        "Level 2, each block of 16:\ns_b = E4M3(b * S_enc / 6): E4M3's scales (448 down to 2^-9) span "
        f"{math.log2(E4M3.max / 2**-9):.1f} binades of block amax; a block {zero_binades:.1f} binades down gets 0",
        fontsize=9,
    )
    scales.legend(fontsize=8, loc="lower right")
    blocks = x.reshape(NVFP4_BLOCKS, 16).double()
    noise = (decoded.double() - blocks).square().sum(dim=1).clamp_min(torch.finfo(torch.float64).tiny)
    sqnr = 10 * torch.log10(blocks.square().sum(dim=1) / noise)
    values.plot(relative, sqnr, ".", color=NORMAL, label="block SQNR after the round trip")
    values.axvline(-normal_binades, color=SUBNORMAL, linestyle="--", linewidth=0.9,
                   label=f"{normal_binades:.1f} binades down: s_b leaves E4M3's normals")
    values.axvline(-zero_binades, color=ACCENT, linestyle="--", linewidth=0.9,
                   label=f"{zero_binades:.1f} binades down: s_b rounds to 0, the block to 0")
    values.set_ylabel("block SQNR (dB)")
    values.set_xlabel("log2(b / A): how far below the tensor's amax a block is")
    values.legend(fontsize=8, loc="upper left")
    for ax in (scales, values):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return png_bytes(fig)


#: File name -> PNG maker.
FIGURES: dict[str, Callable[[], bytes]] = {
    "recipe-gemms.png": _gemm_figure,
    "recipe-current-scaling.png": _current_scaling_figure,
    "recipe-delayed-timeline.png": _delayed_timeline_figure,
    "recipe-mxfp8-blocks.png": _mxfp8_figure,
    "recipe-fp8-block-layouts.png": _fp8_block_figure,
    "recipe-nvfp4-scales.png": _nvfp4_figure,
}
