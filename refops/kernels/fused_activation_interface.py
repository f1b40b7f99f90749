"""The fused activation + quantize kernels of the seam (``docs/recipes/fused-activations.md``).

TransformerEngine's activation kernels take the next op's quantizer and quantize the activation's
fp32 result in the same pass; these methods are that pass, in plain arrays. ``v`` below is the
activation's fp32 result, never rounded: ``act(float(x))`` forward, ``float(dy) * act'(float(x))``
backward (for a gated activation, :meth:`KernelBackend.activation_forward`'s halves and product rule,
``v`` then having the output's last dim). Each method is, by definition, a composition of the
unfused kernels; the reference implements it as exactly that composition
(``refops.kernels.reference.fused_activation``), so a backend that fuses the pass must give its bits.

* ``*_cast_float8`` (delayed scaling's fully fused path): ``quantize_float8(v, scale, ...)``, one
  rounding from fp32 to FP8; the amax recorded into ``amax_accumulator`` is ``v``'s. Returns
  :meth:`KernelBackend.quantize_float8`'s ``(rowwise_data, scale_inv, columnwise_data, scale_inv)``.
* ``*_amax`` (current scaling's first pass): ``(RN_out_dtype(v), amax(v))``: the values rounded
  once to ``out_dtype`` and the fp32 ``(1,)`` amax of the **unrounded** values (NaNs skipped).
* ``*_dbias_*`` (the ``BackwardActivationBias`` fusion) add the bias grad, rounded once to
  ``out_dtype``: summed in fp32 over every leading dim from ``v`` itself for the cast
  (delayed scaling) and from ``RN_out_dtype(v)`` for the amax pass (current scaling), as
  :attr:`refops.quantization.quantizer.Quantizer.dbias_from_unrounded` states per scheme.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["FusedActivationInterface"]


class FusedActivationInterface:
    """The fused activation + quantize methods of :class:`refops.kernels.KernelBackend`."""

    def activation_cast_float8(
        self,
        x: torch.Tensor,
        activation: str,
        *,
        scale: torch.Tensor,
        fp8_dtype: torch.dtype,
        rowwise: bool,
        columnwise: bool,
        amax_accumulator: torch.Tensor | None = None,
        **params: Any,
    ) -> tuple[Any, ...]:
        """``quantize_float8(v, scale, ...)`` with ``v = act(float(x))`` in fp32, not rounded first."""
        raise NotImplementedError

    def activation_amax(
        self, x: torch.Tensor, activation: str, *, out_dtype: torch.dtype, **params: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(RN_out_dtype(v), amax(v))`` with ``v = act(float(x))`` in fp32."""
        raise NotImplementedError

    def activation_backward_cast_float8(
        self,
        grad_output: torch.Tensor,
        x: torch.Tensor,
        activation: str,
        *,
        scale: torch.Tensor,
        fp8_dtype: torch.dtype,
        rowwise: bool,
        columnwise: bool,
        amax_accumulator: torch.Tensor | None = None,
        **params: Any,
    ) -> tuple[Any, ...]:
        """``quantize_float8(v, scale, ...)`` with ``v = float(dy) * act'(float(x))`` in fp32."""
        raise NotImplementedError

    def activation_backward_amax(
        self, grad_output: torch.Tensor, x: torch.Tensor, activation: str, *, out_dtype: torch.dtype, **params: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(RN_out_dtype(v), amax(v))`` with ``v = float(dy) * act'(float(x))`` in fp32."""
        raise NotImplementedError

    def activation_backward_dbias_cast_float8(
        self,
        grad_output: torch.Tensor,
        x: torch.Tensor,
        activation: str,
        *,
        scale: torch.Tensor,
        fp8_dtype: torch.dtype,
        rowwise: bool,
        columnwise: bool,
        out_dtype: torch.dtype,
        amax_accumulator: torch.Tensor | None = None,
        **params: Any,
    ) -> tuple[Any, ...]:
        """:meth:`activation_backward_cast_float8`'s four arrays and the bias grad
        ``RN_out_dtype(sum_rows v)``, summed in fp32 from the unrounded ``v``."""
        raise NotImplementedError

    def activation_backward_dbias_amax(
        self, grad_output: torch.Tensor, x: torch.Tensor, activation: str, *, out_dtype: torch.dtype, **params: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(dx, amax, dbias)``: :meth:`activation_backward_amax`'s ``dx = RN_out_dtype(v)`` and
        ``amax(v)``, and ``dbias(dx)``, the fp32 sum of the rounded values rounded to ``out_dtype``."""
        raise NotImplementedError
