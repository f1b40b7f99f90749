"""The quantize rows' objects: each side's quantizer of a recipe, the arrays whose bytes both sides must share, and
the ``torch.compile`` peers of MXFP8 and NVFP4 (no TE kernel on sm_90)."""

from __future__ import annotations

from typing import Any, Callable

import torch


def refops_quantizer(recipe: str, device: torch.device) -> Any:
    from refops.quantization import (
        DType,
        Float8BlockQuantizer,
        Float8CurrentScalingQuantizer,
        Float8Quantizer,
        MXFP8Quantizer,
        NVFP4Quantizer,
    )

    e4m3 = DType.kFloat8E4M3
    if recipe == "fp8_current":
        return Float8CurrentScalingQuantizer(e4m3, device, rowwise=True, columnwise=True)
    if recipe == "fp8_delayed":
        return Float8Quantizer(torch.ones(1, device=device), torch.zeros(1, device=device), e4m3, rowwise=True,
                               columnwise=True)
    if recipe.startswith("fp8_block"):
        return Float8BlockQuantizer(e4m3, rowwise=True, columnwise=True,
                                    block_scaling_dim=1 if recipe.endswith("1x128") else 2)
    if recipe == "mxfp8":
        return MXFP8Quantizer(e4m3, rowwise=True, columnwise=True)
    if recipe == "nvfp4":
        return NVFP4Quantizer(rowwise=True, columnwise=True)
    raise ValueError(f"refops_quantizer: unknown recipe {recipe!r}")


#: The quantize rows TE has a kernel for on sm_90.
TE_QUANTIZERS = ("fp8_current", "fp8_delayed", "fp8_block_1x128", "fp8_block_128x128")


def te_quantizer(recipe: str, device: torch.device) -> Any:
    """TE's quantizer of the same class and options as :func:`refops_quantizer` for ``recipe``."""
    from refops.testing.transformer_engine import te_quantizer as te_quantizer_like

    if recipe not in TE_QUANTIZERS:
        raise ValueError(f"te_quantizer: no TE quantizer for {recipe!r} on this GPU")
    return te_quantizer_like(refops_quantizer(recipe, device), device=device)


def quantized_arrays(q: Any, recipe: str, m: int, k: int) -> dict[str, torch.Tensor]:
    """The data of both usages and the valid region of the scales of a TE or refops quantized tensor
    (``quantized_fields``: the padding of a scale array is no byte either side promises)."""
    from refops.testing.transformer_engine import quantized_fields

    row, col = quantized_fields(q, "rowwise"), quantized_fields(q, "columnwise")
    if recipe in ("fp8_current", "fp8_delayed"):
        return {"data": row["data"], "transpose": col["data"], "scale_inv": row["scale_inv"][:1]}
    bk, bm = -(-k // 128), -(-m // 128)
    if recipe == "fp8_block_1x128":
        valid = {"row": (bk, m), "col": (bm, k)}
    elif recipe == "fp8_block_128x128":
        valid = {"row": (bm, bk), "col": (bk, bm)}
    else:
        raise ValueError(f"quantized_arrays: {recipe!r}")
    return {"row data": row["data"], "col data": col["data"],
            "row scales": row["scale_inv"][: valid["row"][0], : valid["row"][1]],
            "col scales": col["scale_inv"][: valid["col"][0], : valid["col"][1]]}


def compare_bytes(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> tuple[bool, str]:
    """Whether every array holds the same bytes; otherwise which differ and how."""
    problems = []
    for name, a in ours.items():
        b = theirs.get(name)
        if a is None or b is None:
            if (a is None) != (b is None):
                problems.append(f"{name}: present on one side only")
            continue
        if tuple(a.shape) != tuple(b.shape):
            problems.append(f"{name}: shape {tuple(a.shape)} vs {tuple(b.shape)}")
            continue
        ab, bb = a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
        differ = int((ab != bb).sum())
        if differ:
            problems.append(f"{name}: {differ} of {ab.numel()} bytes")
    return not problems, "; ".join(problems)


def compile_peer(recipe: str) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    """The torch.compile'd peer of an MXFP8 / NVFP4 row+col quantization (same bytes as refops)."""
    if recipe == "mxfp8":
        import peers

        def peer(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            row, row_scale = peers.mxfp8(x)
            col_t, col_scale_t = peers.mxfp8(x.t())  # blocks of 32 along dim 0 = row-wise blocks of x^T
            return row, row_scale, col_t.t(), col_scale_t.t()
    else:
        import nvfp4_vs_compile

        def peer(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return nvfp4_vs_compile.peer(x, True)
    return torch.compile(peer, fullgraph=True, dynamic=False)


def refops_peer_outputs(q: Any, recipe: str, m: int, k: int) -> tuple[torch.Tensor, ...]:
    """refops's arrays in the order and region the compile peer returns them."""
    if recipe == "mxfp8":
        return (q._rowwise_data, q._rowwise_scale_inv[:m, : k // 32], q._columnwise_data,
                q._columnwise_scale_inv[: m // 32, :k])
    return (q._rowwise_data.reshape(m, k // 2), q._rowwise_scale_inv[:m, : k // 16], q._amax_rowwise,
            q._columnwise_data.reshape(k, m // 2), q._columnwise_scale_inv[:k, : m // 16])
