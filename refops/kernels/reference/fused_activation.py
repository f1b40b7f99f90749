"""The fused activation + quantize methods (``refops.kernels.fused_activation_interface``) as their definition:
the unfused kernels composed, each one called on ``self``, so the bits are those of the activation kernel run in
fp32 and the quantize kernel run on its unrounded output, whichever backend supplies them."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["FusedActivationReference"]


def _round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x if x.dtype == dtype else x.to(dtype)


class FusedActivationReference:
    """Mixin of :class:`refops.kernels.ReferenceKernels`: every method is the composition its contract names."""

    # The fp32 values v: the activation kernels on fp32 inputs compute in fp32 and their "rounding to the input
    # dtype" is none, so v is exactly what a fused kernel holds before it rounds anything.
    def _forward_fp32(self, x: torch.Tensor, activation: str, params: dict[str, Any]) -> torch.Tensor:
        return self.activation_forward(x.float(), activation, **params)

    def _backward_fp32(self, dy: torch.Tensor, x: torch.Tensor, activation: str,
                       params: dict[str, Any]) -> torch.Tensor:
        return self.activation_backward(dy.float(), x.float(), activation, **params)

    def activation_cast_float8(self, x, activation, *, scale, fp8_dtype, rowwise, columnwise, amax_accumulator=None,
                               **params):
        return self.quantize_float8(self._forward_fp32(x, activation, params), scale, fp8_dtype=fp8_dtype,
                                    rowwise=rowwise, columnwise=columnwise, amax_accumulator=amax_accumulator)

    def activation_amax(self, x, activation, *, out_dtype, **params):
        v = self._forward_fp32(x, activation, params)
        return _round_to(v, out_dtype), self.amax(v)

    def activation_backward_cast_float8(self, grad_output, x, activation, *, scale, fp8_dtype, rowwise, columnwise,
                                        amax_accumulator=None, **params):
        return self.quantize_float8(self._backward_fp32(grad_output, x, activation, params), scale,
                                    fp8_dtype=fp8_dtype, rowwise=rowwise, columnwise=columnwise,
                                    amax_accumulator=amax_accumulator)

    def activation_backward_amax(self, grad_output, x, activation, *, out_dtype, **params):
        v = self._backward_fp32(grad_output, x, activation, params)
        return _round_to(v, out_dtype), self.amax(v)

    def activation_backward_dbias_cast_float8(self, grad_output, x, activation, *, scale, fp8_dtype, rowwise,
                                              columnwise, out_dtype, amax_accumulator=None, **params):
        v = self._backward_fp32(grad_output, x, activation, params)
        arrays = self.quantize_float8(v, scale, fp8_dtype=fp8_dtype, rowwise=rowwise, columnwise=columnwise,
                                      amax_accumulator=amax_accumulator)
        # dbias of fp32 values is an fp32 sum (no rounding), then the one rounding to the compute dtype.
        return (*arrays, _round_to(self.dbias(v), out_dtype))

    def activation_backward_dbias_amax(self, grad_output, x, activation, *, out_dtype, **params):
        v = self._backward_fp32(grad_output, x, activation, params)
        dx = _round_to(v, out_dtype)
        return dx, self.amax(v), _round_to(self.dbias(dx), out_dtype)
