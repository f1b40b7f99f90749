"""Kernels that index memory by hand: right on contiguous inputs, wrong on views.

Both wrap the fixed per-tensor quantizer of :mod:`.quantizer_per_tensor` and re-create only the
address arithmetic of a kernel that takes a raw pointer: which strides it writes the output with,
and where in the storage it starts reading.
"""

from __future__ import annotations

from typing import Any

import torch

import refops as te
from refops.quantization import DType, Float8CurrentScalingQuantizer
from refops.testing import check_quantizer

from .cases import RecallCase
from .quantizer_per_tensor import current_scaling


def _write_with_input_strides(x: torch.Tensor, quantizer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The output is allocated contiguous but written through the input's strides (the bug)."""
    data, scale_inv = current_scaling(x, quantizer)
    if quantizer.columnwise_usage:
        return data, scale_inv
    out = torch.empty(x.shape, dtype=data.dtype)
    out.as_strided(x.shape, x.stride()).copy_(data)  # a transposed input comes out transposed
    return out, scale_inv


def _write_with_output_strides(x: torch.Tensor, quantizer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    data, scale_inv = current_scaling(x, quantizer)
    if quantizer.columnwise_usage:
        return data, scale_inv
    out = torch.empty(x.shape, dtype=data.dtype)
    out.as_strided(out.shape, out.stride()).copy_(data)
    return out, scale_inv


def _read_from_storage_start(x: torch.Tensor, quantizer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel reads from the storage's first element: a view's offset is dropped (the bug)."""
    return current_scaling(x.as_strided(x.shape, x.stride(), 0), quantizer)


def _read_from_view_start(x: torch.Tensor, quantizer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return current_scaling(x.as_strided(x.shape, x.stride(), x.storage_offset()), quantizer)


def _codes_differ(bug, twin, x: torch.Tensor) -> bool:
    quantizer = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=False)
    return not torch.equal(bug(x, quantizer)[0].view(torch.uint8), twin(x, quantizer)[0].view(torch.uint8))


def _check(candidate) -> Any:
    return check_quantizer(candidate, te.recipe.Float8CurrentScaling(), output="data_and_scale_inv")


CASES = [
    RecallCase("fp8_output_written_with_input_strides", "https://github.com/pytorch/FBGEMM/pull/2919", "quantizer",
               "the quantize kernel writes its contiguous output through a non-contiguous input's strides, "
               "so the result comes out transposed",
               lambda: _check(_write_with_input_strides), lambda: _check(_write_with_output_strides),
               lambda: _codes_differ(_write_with_input_strides, _write_with_output_strides, torch.randn(32, 64).t())),
    RecallCase("fp8_input_storage_offset_ignored", "https://github.com/pytorch/FBGEMM/pull/3508", "quantizer",
               "the kernel's load offset ignores where a view starts in its storage",
               lambda: _check(_read_from_storage_start), lambda: _check(_read_from_view_start),
               lambda: _codes_differ(_read_from_storage_start, _read_from_view_start, torch.randn(48, 64)[16:])),
]
