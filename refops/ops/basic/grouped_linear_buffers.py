"""What a ``GroupedLinear`` is given, checked: split sizes, bias scales, caller buffers, its parameters.

* ``split_sizes`` (extra input 0): ``G`` non-negative integers summing to the
  number of input rows, read on the host;
* ``scales`` (extra input 1 with ``scale_bias``): one float per input row;
* caller buffers (forward kwargs ``output`` / ``grad_input``): preallocated
  tensors the op writes its output / input grad into. A buffer must be a
  contiguous, grad-free tensor of exactly the needed shape, dtype and device;
  anything else is a ``ValueError`` naming the buffer and the problem. The
  output returned is a *view* of the ``output`` buffer (beyond TE), so autograd
  never marks the buffer itself as requiring grad and it can be reused;
* the group parameters (at the first forward, after materialization): all
  weights and biases share dtype, device and ``requires_grad``, the weights
  share their tensor type, and biases are present iff ``bias=True``; a
  ``RuntimeError`` names the offending index.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

__all__ = [
    "OUTPUT_BUFFER_KEY",
    "GRAD_INPUT_BUFFER_KEY",
    "read_split_sizes",
    "row_slices",
    "check_scales",
    "caller_buffers",
    "check_group_parameters",
    "read_extra_inputs",
]

#: Forward kwarg (``Sequential(op_kwargs={op: {...}})``) naming a tensor the output is written into.
OUTPUT_BUFFER_KEY = "output"
#: Forward kwarg naming a tensor the backward writes the input grad into.
GRAD_INPUT_BUFFER_KEY = "grad_input"


def read_extra_inputs(
    op: Any, extra_inputs: tuple, kwargs: dict[str, Any], in_shape: tuple, out_shape: tuple, dtype: torch.dtype
) -> tuple[list[int], Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(split sizes, scales or None, output buffer or None, grad-input buffer or None)``, all checked."""
    name, num_rows, device = type(op).__name__, math.prod(in_shape[:-1]), op._weight_params()[0].device
    split_sizes = read_split_sizes(name, extra_inputs[0], op.num_groups, num_rows)
    scales = check_scales(name, extra_inputs[1], num_rows, device) if op._scale_bias else None
    return (split_sizes, scales, *caller_buffers(name, kwargs, out_shape, in_shape, dtype, device))


def read_split_sizes(op_name: str, split_sizes: Any, num_groups: int, num_rows: int) -> list[int]:
    """``split_sizes`` as host ints: ``num_groups`` non-negative entries that sum to ``num_rows``."""
    if not isinstance(split_sizes, torch.Tensor):
        raise TypeError(f"{op_name}: split_sizes must be an integer tensor, got {type(split_sizes).__name__}")
    if split_sizes.is_floating_point() or split_sizes.is_complex() or split_sizes.dtype == torch.bool:
        raise TypeError(f"{op_name}: split_sizes must be an integer tensor, got dtype {split_sizes.dtype}")
    if split_sizes.numel() != num_groups:
        raise ValueError(f"{op_name}: Expected {num_groups} splits, but got {split_sizes.numel()}")
    sizes = [int(s) for s in split_sizes.reshape(-1).tolist()]  # the host read (a device sync)
    if any(s < 0 for s in sizes):
        raise ValueError(f"{op_name}: split sizes must be non-negative, got {sizes}")
    if sum(sizes) != num_rows:
        raise ValueError(f"{op_name}: split sizes {sizes} sum to {sum(sizes)}, but the input has {num_rows} rows")
    return sizes


def row_slices(split_sizes: list[int]) -> list[slice]:
    """The consecutive row ranges of the groups."""
    slices, start = [], 0
    for size in split_sizes:
        slices.append(slice(start, start + size))
        start += size
    return slices


def check_scales(op_name: str, scales: Any, num_rows: int, device: torch.device) -> torch.Tensor:
    """The per-row bias scales as a flat tensor of ``num_rows`` floats on ``device``."""
    if not isinstance(scales, torch.Tensor) or not scales.is_floating_point():
        raise TypeError(f"{op_name}: scales must be a floating-point tensor (scale_bias=True)")
    if scales.numel() != num_rows:
        raise ValueError(
            f"{op_name}: scales needs one entry per input row ({num_rows}), got shape {tuple(scales.shape)}"
        )
    if scales.device != device:
        raise ValueError(f"{op_name}: scales is on {scales.device} but the parameters are on {device}")
    return scales.reshape(-1)


def caller_buffers(
    op_name: str,
    kwargs: dict[str, Any],
    out_shape: tuple,
    in_shape: tuple,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """The ``output`` and ``grad_input`` buffers from the forward kwargs (None when absent), checked.

    The fuser has refused any other kwarg (``GroupedLinear.forward_kwargs``).
    """
    buffers = (kwargs.get(OUTPUT_BUFFER_KEY), kwargs.get(GRAD_INPUT_BUFFER_KEY))
    for key, buffer, shape in zip((OUTPUT_BUFFER_KEY, GRAD_INPUT_BUFFER_KEY), buffers, (out_shape, in_shape)):
        if buffer is not None:
            _check_caller_buffer(op_name, key, buffer, shape, dtype, device)
    return buffers


def _check_caller_buffer(
    op_name: str, key: str, buffer: Any, shape: tuple, dtype: torch.dtype, device: torch.device
) -> None:
    if not isinstance(buffer, torch.Tensor):
        raise TypeError(f"{op_name}: the {key!r} buffer must be a torch.Tensor, got {type(buffer).__name__}")
    problems = {
        "shape": (tuple(buffer.shape), tuple(shape)),
        "dtype": (buffer.dtype, dtype),
        "device": (buffer.device, device),
    }
    for what, (got, want) in problems.items():
        if got != want:
            raise ValueError(f"{op_name}: the {key!r} buffer has {what} {got}, but {want} is needed")
    if not buffer.is_contiguous():
        raise ValueError(f"{op_name}: the {key!r} buffer must be contiguous")
    if buffer.requires_grad:
        raise ValueError(f"{op_name}: the {key!r} buffer must not require grad (pass buffer.detach())")


def check_group_parameters(op: Any) -> None:
    """The consistency of ``op``'s weights and biases (see the module docstring)."""
    name = type(op).__name__
    weights = op._weight_params()
    leader = weights[0]
    for g, weight in enumerate(weights):
        label = "Weight" if op.single_grouped_weight else f"Weight {g}"
        _check_like_leader(name, label, weight, leader)
        if type(weight) is not type(leader):
            raise RuntimeError(
                f"{name}: {label} is a {type(weight).__name__}, but the weights are {type(leader).__name__}"
            )
    for g, bias in enumerate(op._bias_params()):
        label = "Bias" if op.single_grouped_bias else f"Bias {g}"
        if op.use_bias and bias is None:
            raise RuntimeError(f"{name}: Expected biases, but {label.lower()} is uninitialized")
        if not op.use_bias and bias is not None:
            raise RuntimeError(f"{name}: Expected no biases, but {label.lower()} is initialized")
        if bias is not None:
            _check_like_leader(name, label, bias, leader)


def _check_like_leader(op_name: str, label: str, param: torch.Tensor, leader: torch.Tensor) -> None:
    expected = (leader.dtype, leader.device, leader.requires_grad)
    found = (param.dtype, param.device, param.requires_grad)
    for what, want, got in zip(("dtype", "device", "requires_grad"), expected, found):
        if want != got:
            raise RuntimeError(f"{op_name}: {label} has {what}={got}, but the weights have {what}={want}")
