"""Tensor parallelism of ``BasicLinear``: its configuration and the communication steps TE puts
inside the linear's forward and backward.

Column mode shards ``out_features`` (weight ``(out/W, in)``), row mode shards ``in_features``
(weight ``(out, in/W)``). With sequence parallelism (SP) activations outside the linear are
sharded along dim 0 (the sequence):

===========  ===========================================  =============================================
mode         forward                                      backward
===========  ===========================================  =============================================
column       x gathered (SP) before the GEMM              dy W reduce-scattered (SP) or all-reduced;
                                                          x gathered again (SP) for wgrad
row          x W^T reduce-scattered (SP) or all-reduced   dy gathered (SP) before both GEMMs
===========  ===========================================  =============================================

Gathers of quantized operands (x in column+SP, dy in row+SP) move quantized data; the operand's
quantizer reduces its amax over the TP group (:func:`configure_gathered_quantizers`), so every
shard shares the global scale and the gather is exact. Reductions run in high precision.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from ..collectives import (
    all_gather_rows,
    all_reduce,
    check_process_group,
    check_same_shape_across_ranks,
    get_group_size,
    reduce_scatter_along_first_dim,
)
from ..tensor_parallel_gather import gather_quantized, shard_aligned
from ...quantization.float8 import _PerTensorQuantizer
from ...quantization.quantized_tensor import QuantizedTensor
from ...quantization.quantizer import Quantizer

__all__ = ["TensorParallelConfig", "canonicalize_tensor_parallelism"]

TENSOR_PARALLEL_MODES = (None, "column", "row")


@dataclasses.dataclass(frozen=True)
class TensorParallelConfig:
    """A canonical TP configuration: ``mode`` is None whenever the group has one rank."""

    mode: Optional[str]
    group: Any
    size: int
    sequence_parallel: bool
    local_in_features: int
    local_out_features: int

    @property
    def gathers_input(self) -> bool:
        """Column + SP: x is gathered before the GEMM and again for wgrad."""
        return self.mode == "column" and self.sequence_parallel

    @property
    def gathers_grad_output(self) -> bool:
        """Row + SP: dy is gathered before both backward GEMMs."""
        return self.mode == "row" and self.sequence_parallel


def canonicalize_tensor_parallelism(
    op_name: str,
    *,
    mode: Optional[str],
    group: Any,
    sequence_parallel: bool,
    in_features: int,
    out_features: int,
) -> TensorParallelConfig:
    """TE's rules: a group of one rank (or no TP mode) turns TP and SP off; the sharded size must divide.

    Raises ``ValueError`` for an unknown mode or a size not divisible by the group size.
    """
    if mode not in TENSOR_PARALLEL_MODES:
        raise ValueError(f"{op_name}: tensor_parallel_mode must be None, 'column' or 'row' (got {mode!r})")
    size = get_group_size(group, owner=f"{op_name}: tensor_parallel_group") if mode is not None else 1
    check_process_group(group, owner=f"{op_name}: tensor_parallel_group")  # a wrong type is a mistake even unused
    if size == 1:
        return TensorParallelConfig(None, None, 1, False, in_features, out_features)
    sharded, features = ("out_features", out_features) if mode == "column" else ("in_features", in_features)
    if features % size:
        raise ValueError(
            f"{op_name}: {mode} tensor parallelism shards {sharded}={features}, which is not divisible by the "
            f"tensor-parallel group size {size}"
        )
    local_in = in_features // size if mode == "row" else in_features
    local_out = out_features // size if mode == "column" else out_features
    return TensorParallelConfig(mode, group, size, bool(sequence_parallel), local_in, local_out)


def configure_gathered_quantizers(config: TensorParallelConfig, input_quantizer: Optional[Quantizer],
                                  grad_output_quantizer: Optional[Quantizer]) -> None:
    """Quantizers of gathered operands reduce their amax over the TP group (where the scheme has one).

    Invariant: afterwards the shards of a gathered operand are quantized with one
    global scale, so quantize-then-gather equals gather-then-quantize.
    """
    for gathered, quantizer in ((config.gathers_input, input_quantizer),
                                (config.gathers_grad_output, grad_output_quantizer)):
        if gathered and quantizer is not None and hasattr(quantizer, "with_amax_reduction"):
            quantizer.with_amax_reduction = True
            quantizer.amax_reduction_group = config.group


def check_sharded_input(op_name: str, config: TensorParallelConfig, what: str, tensor: torch.Tensor) -> None:
    """Sequence parallelism shards dim 0, so the tensor needs a dim 0 besides its features; and every rank's
    tensor must have the same shape, or the gathers and reductions fail inside the backend."""
    if config.sequence_parallel and tensor.dim() < 2:
        raise ValueError(
            f"{op_name}: with sequence_parallel the {what} is sharded along dim 0 and needs at least 2 dims, "
            f"got shape {tuple(tensor.shape)}"
        )
    if config.size > 1:
        check_same_shape_across_ranks(tensor, config.group,
                                      what=f"{op_name} ({config.mode} tensor parallel): the {what}")


def quantize_shard(tensor: torch.Tensor, quantizer: Quantizer, *, columnwise: bool) -> torch.Tensor:
    """The shard of a gathered operand as it is gathered and saved.

    Quantized (with ``quantizer``'s amax reduction) when its block grid aligns with dim 0,
    else left in high precision (it is then gathered first and quantized after). Per-tensor
    FP8 keeps row-wise data only: its transpose is rebuilt after the gather. A shard that a
    neighbour already quantized is kept, unless its blocks do not align: then it is
    dequantized and takes the high-precision route (TE's fallback).
    """
    per_tensor = isinstance(quantizer, _PerTensorQuantizer)
    aligned = shard_aligned(quantizer, tensor.shape, columnwise=columnwise and not per_tensor)
    if isinstance(tensor, QuantizedTensor):
        return tensor if aligned else tensor.dequantize()
    if not aligned:
        return tensor
    local = quantizer.copy()
    local.set_usage(rowwise=True, columnwise=columnwise and not per_tensor)
    return local(tensor)


def gather_shard(shard: torch.Tensor, config: TensorParallelConfig, quantizer: Optional[Quantizer], *,
                 rowwise: bool, columnwise: bool) -> torch.Tensor:
    """All-gather a shard along dim 0 with the usages a GEMM reads.

    A quantized shard is gathered quantized; a high-precision one is gathered and then
    quantized with ``quantizer`` (if given) for those usages.
    """
    if isinstance(shard, QuantizedTensor):
        full = gather_quantized(shard, config.group, columnwise=columnwise)
        if not rowwise and columnwise and full.has_usage("rowwise"):
            full.update_usage(rowwise_usage=False)
        return full
    full = all_gather_rows(shard, config.group)
    if quantizer is None:
        return full
    q = quantizer.copy()
    q.set_usage(rowwise=rowwise, columnwise=columnwise)
    return q(full)


def reduce_output(config: TensorParallelConfig, y: torch.Tensor, op_name: str) -> torch.Tensor:
    """Row mode: the partial products of the ranks are summed (reduce-scattered along dim 0 with SP)."""
    if config.sequence_parallel:
        return reduce_scatter_along_first_dim(y, config.group, op_name=f"{op_name} (row tensor parallel output)")
    return all_reduce(y, config.group)


def reduce_grad_input(config: TensorParallelConfig, dx: torch.Tensor, op_name: str) -> torch.Tensor:
    """Column mode: the ranks' partial dgrads are summed (reduce-scattered along dim 0 with SP)."""
    if config.sequence_parallel:
        return reduce_scatter_along_first_dim(dx, config.group, op_name=f"{op_name} (column tensor parallel dgrad)")
    return all_reduce(dx, config.group)


def gathered_shape(shape: torch.Size, size: int) -> torch.Size:
    """``shape`` with dim 0 multiplied by the group size (the shape after a gather)."""
    return torch.Size((shape[0] * size, *shape[1:]))


def refuse_tensor_parallel_mode(fused_name: str, linear: Any, mode: str, what: str) -> None:
    """TE's refusals: a row-TP linear's output and a column-TP linear's grad-input are reduced
    in high precision right after the GEMM, so they cannot be quantized or accumulated into."""
    if getattr(linear, "tensor_parallel_mode", None) == mode:
        raise ValueError(
            f"{fused_name}: {what} is not supported for a {mode} tensor-parallel BasicLinear (as in TE: that "
            "tensor is reduced over the group right after the GEMM); the fuser does not fuse it"
        )
