"""The all-gather along dim 0 of tensor parallelism: plain tensors bit for bit, quantized ones quantized.

Invariant: gathering the ranks' quantized shards gives, byte for byte, the quantized tensor that quantizing
the gathered high-precision tensor would give, provided the shards were quantized with the same global
scale (per-tensor FP8: the same ``scale``; NVFP4: the same global amax). Current scaling and NVFP4 get that
from amax reduction over the group (``with_amax_reduction``); delayed scaling from the recipe's amax
reduction (``autocast(amax_reduction_group=...)``). A gather checks that the ranks' global scales are equal
and raises ``ValueError`` otherwise, instead of silently using one rank's scale.

What a quantized gather keeps (rows ``m`` = product of the leading dims of one rank's shard):

* per-tensor FP8: the row-wise bytes travel; the transpose is rebuilt from the gathered bytes (as in TE,
  FP8 does not gather transposed data), so the gathered tensor always holds row-wise data;
* MXFP8, FP8 block scaling, NVFP4: the row-wise data and scales the shard holds, and the column-wise ones
  when asked (needs ``m`` a multiple of 32 for MXFP8 and of 16 for NVFP4; for FP8 block scaling, of 128
  with 2-D tiles or column-wise data, none for the row-wise 1x128 copy); row-scaled NVFP4's row-wise amaxes
  are concatenated.

When a shard's block grid does not align with dim 0, :func:`quantize_then_gather` gathers the high-precision
shards and quantizes the result (TE's fallback); an already quantized shard that does not align is a
``ValueError``.

The gather itself is the sharding layer's one quantized gather (``refops.sharding.quantized_gather``, which
FSDP2 uses too): that layer sits above ops and installs it here with :func:`install_quantized_gather` when
``refops`` is imported.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch

from ..quantization.float8 import Float8Tensor, _PerTensorQuantizer
from ..quantization.float8_block import Float8BlockQuantizer
from ..quantization.mxfp8 import MXFP8Quantizer
from ..quantization.nvfp4 import NVFP4Quantizer
from ..quantization.quantized_tensor import QuantizedTensor
from ..quantization.quantizer import Quantizer
from .collectives import all_gather_rows, get_group_size

__all__ = ["gather_along_first_dim", "gather_quantized", "quantize_then_gather", "shard_aligned",
           "install_quantized_gather"]

_ROW_MULTIPLE = {MXFP8Quantizer: 32, NVFP4Quantizer: 16}
#: How a gather's refusal names a whole-tensor array.
_SHARED_NAMES = {"fp8_scale_inv": "scale_inv", "amax_rowwise": "row-wise amax", "amax_columnwise": "column-wise amax"}
_OWNER = "gather_along_first_dim"

_quantized_gather: Optional[Callable[..., QuantizedTensor]] = None


def install_quantized_gather(gather: Callable[..., QuantizedTensor]) -> None:
    """Set the quantized all-gather: ``gather(shard, group, *, usages, what, disagreement)`` returns every rank's
    shard concatenated along dim 0 with ``usages``, raising ``disagreement(kw, rows)`` when the ranks'
    whole-tensor array ``kw`` differ (``refops.sharding.quantized_gather.all_gather_quantized``)."""
    global _quantized_gather
    _quantized_gather = gather


def shard_aligned(quantizer: Quantizer, shape: torch.Size, *, columnwise: bool) -> bool:
    """Whether shards of ``shape`` quantize to whole blocks, so their quantized gather is exact."""
    if len(shape) < 2:
        return isinstance(quantizer, _PerTensorQuantizer)
    m = math.prod(shape[:-1])
    if isinstance(quantizer, Float8BlockQuantizer):
        needs_128 = quantizer.block_scaling_dim == 2 or columnwise
        return not needs_128 or m % 128 == 0
    for cls, multiple in _ROW_MULTIPLE.items():
        if isinstance(quantizer, cls):
            return m % multiple == 0
    return isinstance(quantizer, _PerTensorQuantizer)


def quantize_then_gather(tensor: torch.Tensor, quantizer: Quantizer, group: Any) -> QuantizedTensor:
    """Quantize this rank's shard with ``quantizer``, then gather it quantized.

    The result has ``quantizer``'s usages. Per-tensor FP8 quantizes row-wise only and
    rebuilds the transpose after the gather. A shard whose block grid does not align with
    dim 0 is gathered in high precision and quantized after.
    """
    columnwise = quantizer.columnwise_usage
    if not shard_aligned(quantizer, tensor.shape, columnwise=columnwise):
        return quantizer(all_gather_rows(tensor, group))
    local_quantizer = quantizer
    if isinstance(quantizer, _PerTensorQuantizer) and columnwise:
        local_quantizer = quantizer.copy()
        local_quantizer.set_usage(rowwise=True, columnwise=False)
    return gather_quantized(local_quantizer(tensor), group, columnwise=columnwise)


def _disagreement(tensor: QuantizedTensor) -> Callable[[str, torch.Tensor], Exception]:
    def error(kw: str, values: torch.Tensor) -> Exception:
        return ValueError(
            f"{_OWNER}: the ranks' {type(tensor).__name__} {_SHARED_NAMES.get(kw, kw)} differ "
            f"({values.flatten().tolist()}); a quantized all-gather shares one global scale, so reduce the amax "
            "over the group first (with_amax_reduction on the quantizer, or autocast(amax_reduction_group=...) "
            "for delayed scaling)"
        )

    return error


def gather_quantized(tensor: QuantizedTensor, group: Any, *, columnwise: Optional[bool] = None) -> QuantizedTensor:
    """All-gather a quantized tensor along dim 0, keeping its usages (``columnwise`` overrides one).

    Raises ``ValueError`` for a shard whose block grid does not align with dim 0, for column-wise data asked
    of a shard without it, and for ranks whose global scales differ.
    """
    if tensor.dim() < 1:
        raise ValueError(f"{_OWNER}: cannot gather a 0-dim tensor along dim 0")
    if columnwise is None:
        columnwise = tensor.has_usage("columnwise")
    quantizer = tensor.quantizer
    if quantizer is not None and not isinstance(tensor, Float8Tensor):
        if not shard_aligned(quantizer, tensor.shape, columnwise=tensor.has_usage("columnwise")):
            raise ValueError(
                f"{_OWNER}: a {type(tensor).__name__} shard of shape {tuple(tensor.shape)} does not "
                "quantize to whole blocks along dim 0, so it cannot be gathered in quantized form; gather the "
                "high-precision tensor (gather_along_first_dim(x, group, quantizer=q)) instead"
            )
    if isinstance(tensor, Float8Tensor):  # the row-wise bytes always travel; the transpose follows from them
        usages = ("rowwise", "columnwise") if columnwise else ("rowwise",)
    else:
        if columnwise and not tensor.has_usage("columnwise"):
            raise ValueError(f"{_OWNER}: the {type(tensor).__name__} has no column-wise data to gather")
        usages = tuple(u for u, kept in (("rowwise", tensor.has_usage("rowwise")), ("columnwise", columnwise)) if kept)
    if _quantized_gather is None:  # only when refops.sharding was never imported (``import refops`` imports it)
        raise RuntimeError(f"{_OWNER}: the quantized all-gather is installed by refops.sharding; import refops")
    return _quantized_gather(tensor, group, usages=usages, what=_OWNER, disagreement=_disagreement(tensor))


def gather_along_first_dim(
    tensor: torch.Tensor, group: Any = None, *, quantizer: Optional[Quantizer] = None
) -> torch.Tensor:
    """All-gather along dim 0: the result is every rank's ``tensor`` concatenated in rank order.

    * a plain tensor without ``quantizer``: gathered as is (its dtype, bit for bit);
    * a plain tensor with ``quantizer``: quantized locally, then gathered quantized; the
      caller sets the quantizer's amax reduction group where the scheme has a global scale;
    * a :class:`QuantizedTensor`: gathered quantized (data and scales), see :func:`gather_quantized`.

    With one rank it only quantizes (if asked). Every rank must pass the same trailing shape.
    """
    if isinstance(tensor, QuantizedTensor):
        return tensor if get_group_size(group) == 1 else gather_quantized(tensor, group)
    if quantizer is not None:
        return quantizer(tensor) if get_group_size(group) == 1 else quantize_then_gather(tensor, quantizer, group)
    if get_group_size(group) == 1:
        return tensor
    return all_gather_rows(tensor, group)
