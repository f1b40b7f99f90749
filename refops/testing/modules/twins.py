"""The twins the numerics tier runs beside the reference (:mod:`.numerics` judges with them).

* :class:`LegitNumericsKernels`: the reference kernels changed only where a correct implementation may
  differ (the order of a GEMM's sums, TF32 operands for fp32 GEMMs, a tensor core's truncated partial
  sums for quantized GEMMs, element-wise kernels in float64 rounded once), all at once;
* :class:`Float64Kernels` and :func:`float64_twin` / :func:`run_float64`: the same pipeline in float64,
  no quantization (quantized weights dequantized).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Iterator

import torch

from ...kernels import use_backend
from ...kernels.reference import ReferenceKernels
from ...kernels.reference.gemm import epilogue_fp32
from ...kernels.reference.gemm_hopper import round_to_tf32
from ...kernels.reference.gemm_operands import dequantize_gemm_operands
from ...quantization.quantized_tensor import QuantizedTensor
from .distributed_models import deepcopy_sharing_groups

__all__ = ["LegitNumericsKernels", "Float64Kernels", "float64_twin", "float64_context", "run_float64", "legit_context",
           "truncate_mantissa", "round_to_tf32"]


def truncate_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """fp32 ``x`` with only ``bits`` explicit mantissa bits kept (rounded toward zero)."""
    drop = 23 - bits
    mask = ~((1 << drop) - 1)
    return (x.float().contiguous().view(torch.int32) & mask).view(torch.float32)


class LegitNumericsKernels(ReferenceKernels):
    """The reference kernels, changed only where a correct implementation may differ (see the module doc)."""

    name = "refops-legit-numerics"

    #: Fast-accumulation emulation of quantized GEMMs: chunk length along K and partial-sum mantissa bits.
    chunk = 32
    partial_bits = 13

    def gemm(self, a, b, *, trans_a=False, trans_b=False, out_dtype, alpha=1.0, out=None, accumulate=False,
             role=None, bias=None):
        quantized = isinstance(a, QuantizedTensor) or isinstance(b, QuantizedTensor)
        a, b = dequantize_gemm_operands(a, b, trans_a=trans_a, trans_b=trans_b)
        a2 = (a.t() if trans_a else a).float()
        b2 = (b.t() if trans_b else b).float()
        if quantized:
            result = self._fast_accumulation(a2, b2)
        else:
            if a.dtype == torch.float32 and b.dtype == torch.float32:
                a2, b2 = round_to_tf32(a2), round_to_tf32(b2)
            result = torch.matmul(a2.flip(-1), b2.flip(0))  # the sums in another order
        result = epilogue_fp32(result, alpha=alpha, out=out, accumulate=accumulate, bias=bias)
        if out is not None:
            out.copy_(result.to(out.dtype))
            return out
        return result.to(out_dtype)

    def _fast_accumulation(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        k = a.shape[-1]
        total = torch.zeros(a.shape[0], b.shape[-1], dtype=torch.float32, device=a.device)
        for start in range(0, k, self.chunk):
            partial = torch.matmul(a[:, start:start + self.chunk], b[start:start + self.chunk])
            total = total + truncate_mantissa(partial, self.partial_bits)
        return total

    def activation_forward(self, x, activation, **params):
        with _float_is_double(x):
            y = super().activation_forward(x.double(), activation, **params)
        return y.to(x.dtype)

    def activation_backward(self, grad_output, x, activation, **params):
        # One rounding instead of two: the grad is handed on in fp32 for the next kernel (a quantizer, a GEMM) to
        # round once, as TE's fused dGELU+quantize does.
        with _float_is_double(x):
            dx = super().activation_backward(grad_output.double(), x.double(), activation, **params)
        return dx.to(torch.float32)

    def dbias(self, grad_output):
        return grad_output.reshape(-1, grad_output.shape[-1]).double().sum(dim=0).to(grad_output.dtype)


class Float64Kernels(ReferenceKernels):
    """The reference kernels computing in float64 where their operands are float64 (the float64 twin)."""

    name = "refops-float64-twin"


_ORIGINAL_FLOAT = torch.Tensor.float


def _float_keeping_double(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return self if self.dtype == torch.float64 else _ORIGINAL_FLOAT(self, *args, **kwargs)


@contextlib.contextmanager
def _float_is_double(_: Any = None) -> Iterator[None]:
    """Within the block ``t.float()`` of a float64 tensor is the tensor itself: the reference kernels, which
    upcast to fp32 to compute, compute in float64 on float64 operands."""
    previous = torch.Tensor.float
    torch.Tensor.float = _float_keeping_double  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.float = previous  # type: ignore[method-assign]


@contextlib.contextmanager
def _float64_allowed() -> Iterator[None]:
    from ...ops import _common

    previous = _common.SUPPORTED_COMPUTE_DTYPES
    _common.SUPPORTED_COMPUTE_DTYPES = tuple(previous) + (torch.float64,)
    try:
        with _float_is_double(), use_backend(Float64Kernels()):
            yield
    finally:
        _common.SUPPORTED_COMPUTE_DTYPES = previous


def float64_twin(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module`` whose parameters are float64 (quantized ones dequantized: the same values)."""
    twin = deepcopy_sharing_groups(module)
    for sub in twin.modules():
        for name, p in list(sub.named_parameters(recurse=False)):
            values = p.dequantize(dtype=torch.float32) if isinstance(p, QuantizedTensor) else p.detach()
            setattr(sub, name, torch.nn.Parameter(values.to(torch.float64), requires_grad=p.requires_grad))
        for name, b in list(sub.named_buffers(recurse=False)):
            if b is not None and b.is_floating_point():
                setattr(sub, name, b.to(torch.float64))
    return twin


def run_float64(module: torch.nn.Module, run: Callable[[ContextManager[Any]], Any]) -> Any:
    """``run(context)`` with the context in which refops computes in float64 without quantization."""
    from ...quantization.state import autocast

    @contextlib.contextmanager
    def context():
        with _float64_allowed(), autocast(enabled=False):
            yield

    return run(context())


@contextlib.contextmanager
def float64_context() -> Iterator[None]:
    """The context in which refops computes in float64 without quantization (the float64 twin runs in it)."""
    from ...quantization.state import autocast

    with _float64_allowed(), autocast(enabled=False):
        yield


def legit_context(reference_context: Callable[[], ContextManager[Any]]) -> Callable[[], ContextManager[Any]]:
    """The reference's context with :class:`LegitNumericsKernels` selected inside it."""

    @contextlib.contextmanager
    def context():
        with reference_context(), use_backend(LegitNumericsKernels()):
            yield

    return context
