"""The SwiGLU family: ``SwiGLU``, ``SiTUGLU`` and ``ClampedSwiGLU``, with block interleaving.

Like every gated activation, they split the last dim into a gate half ``a``
and a linear half ``b`` and gate the **first** half. With
``glu_interleave_size = s`` the last dim is instead laid out as alternating
blocks ``[a(s), b(s), a(s), b(s), ...]``; the op de-interleaves it to
``[a..., b...]`` before the kernel and re-interleaves the input gradient, so
the math is unchanged and only the memory layout differs.

Quantization is as for every activation (``_ActivationOperation``): the output
leaves through the next op's input quantizer; the grad-input through the
previous op's grad-output quantizer, except with interleaving.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from .activation import _ActivationOperation

__all__ = ["SwiGLU", "SiTUGLU", "ClampedSwiGLU"]


# ------------------------------------------------------------ interleaving
def check_glu_interleave_size(op_name: str, glu_interleave_size: Optional[int]) -> Optional[int]:
    """``None`` or a positive int, else ValueError."""
    if glu_interleave_size is None:
        return None
    if isinstance(glu_interleave_size, bool) or not isinstance(glu_interleave_size, int) or glu_interleave_size <= 0:
        raise ValueError(f"{op_name}: glu_interleave_size must be None or a positive int, got {glu_interleave_size!r}")
    return glu_interleave_size


def check_gated_last_dim(op_name: str, x: torch.Tensor, glu_interleave_size: Optional[int]) -> None:
    """The last dim must split into halves (into whole ``[a(s), b(s)]`` block pairs when interleaved)."""
    block = 2 if glu_interleave_size is None else 2 * glu_interleave_size
    if x.dim() == 0 or x.shape[-1] % block != 0:
        layout = (
            "two halves" if glu_interleave_size is None
            else f"block pairs [a({glu_interleave_size}), b({glu_interleave_size})]"
        )
        raise ValueError(
            f"{op_name}: a gated activation splits the last dim into {layout}, so it must be divisible "
            f"by {block}; got input shape {tuple(x.shape)}"
        )


def deinterleave_glu(x: torch.Tensor, glu_interleave_size: Optional[int]) -> torch.Tensor:
    """``[a(s), b(s), a(s), b(s), ...]`` -> ``[a..., b...]`` along the last dim (identity for None)."""
    if glu_interleave_size is None:
        return x
    shape = x.shape
    blocks = x.reshape(-1, shape[-1] // (2 * glu_interleave_size), 2, glu_interleave_size)
    return blocks.transpose(1, 2).reshape(shape)


def interleave_glu(x: torch.Tensor, glu_interleave_size: Optional[int]) -> torch.Tensor:
    """``[a..., b...]`` -> ``[a(s), b(s), a(s), b(s), ...]`` along the last dim (identity for None)."""
    if glu_interleave_size is None:
        return x
    shape = x.shape
    halves = x.reshape(-1, 2, shape[-1] // (2 * glu_interleave_size), glu_interleave_size)
    return halves.transpose(1, 2).reshape(shape)


def validate_betas(op_name: str, beta1: float, beta2: float) -> tuple[float, float]:
    """SiTU-GLU's betas must be finite and > 0, else ValueError naming the bad one."""
    values = {"beta1": float(beta1), "beta2": float(beta2)}
    for key, value in values.items():
        if not math.isfinite(value) or value <= 0.0:
            raise ValueError(f"{op_name}: {key} must be finite and > 0, got {value}")
    return values["beta1"], values["beta2"]


# --------------------------------------------------------------------- ops
class _InterleavableGLU(_ActivationOperation):
    """A gated activation that also accepts the block-interleaved layout."""

    gated = True

    def __init__(self, *, cache_quantized_input: bool = False, glu_interleave_size: Optional[int] = None) -> None:
        super().__init__(cache_quantized_input=cache_quantized_input)
        self.glu_interleave_size: Optional[int] = check_glu_interleave_size(type(self).__name__,
                                                                            glu_interleave_size)

    def _to_kernel_layout(self, x: torch.Tensor) -> torch.Tensor:
        check_gated_last_dim(type(self).__name__, x, self.glu_interleave_size)
        return deinterleave_glu(x, self.glu_interleave_size)

    def _from_kernel_layout(self, grad: torch.Tensor) -> torch.Tensor:
        return interleave_glu(grad, self.glu_interleave_size)

    def _grad_input_quantizer(self, prev_op_grad_output_quantizer: Any) -> Any:
        # The interleaved grad is re-laid out after the kernel, so it leaves in high precision (as in TE).
        return None if self.glu_interleave_size is not None else prev_op_grad_output_quantizer


class SwiGLU(_InterleavableGLU):
    """``SwiGLU(a, b) = SiLU(a) * b = a * sigmoid(a) * b``; gate on the first half.

    Args:
        cache_quantized_input: save ``x`` for backward as an FP8 E4M3
            current-scaling row-wise copy (see ``_ActivationOperation``).
        glu_interleave_size: ``s`` for the block-interleaved layout
            ``[a(s), b(s), ...]``; the last dim must be divisible by ``2 s``.
            With it, ``dx`` always leaves in high precision (no grad-input
            quantizer), as in TransformerEngine.
    """

    kernel_activation = "swiglu"


class SiTUGLU(_InterleavableGLU):
    """SiTU-GLU: ``y = beta1 tanh(a / beta1) sigmoid(a) * beta2 tanh(b / beta2)``.

    Both factors are soft-capped by ``tanh``, so ``|y| < beta1 * beta2``.

    Args:
        beta1: cap of the gate factor; finite and > 0 (default 4).
        beta2: cap of the linear factor; finite and > 0 (default 25).
        cache_quantized_input, glu_interleave_size: as in :class:`SwiGLU`.
    """

    kernel_activation = "situglu"

    def __init__(
        self,
        *,
        beta1: float = 4.0,
        beta2: float = 25.0,
        cache_quantized_input: bool = False,
        glu_interleave_size: Optional[int] = None,
    ) -> None:
        super().__init__(cache_quantized_input=cache_quantized_input, glu_interleave_size=glu_interleave_size)
        self.beta1, self.beta2 = validate_betas(type(self).__name__, beta1, beta2)

    def kernel_params(self) -> dict[str, Any]:
        return {"beta1": self.beta1, "beta2": self.beta2}


class ClampedSwiGLU(_InterleavableGLU):
    """GPT-OSS SwiGLU: ``y = a' sigmoid(alpha a') * (b' + glu_linear_offset)``.

    ``a' = min(a, limit)`` (upper clamp only) and ``b' = clamp(b, -limit, limit)``.
    A clamped element passes no gradient; the bounds themselves pass it
    (``torch.clamp``'s convention).

    Args:
        limit: clamp bound (default 7).
        alpha: sigmoid scale (default 1.702).
        glu_linear_offset: added to the clamped linear half (default 1; 0 disables it).
        cache_quantized_input, glu_interleave_size: as in :class:`SwiGLU`.
    """

    kernel_activation = "clamped_swiglu"

    def __init__(
        self,
        *,
        limit: float = 7.0,
        alpha: float = 1.702,
        glu_linear_offset: float = 1.0,
        cache_quantized_input: bool = False,
        glu_interleave_size: Optional[int] = None,
    ) -> None:
        super().__init__(cache_quantized_input=cache_quantized_input, glu_interleave_size=glu_interleave_size)
        self.limit: float = limit
        self.alpha: float = alpha
        self.glu_linear_offset: float = glu_linear_offset

    def kernel_params(self) -> dict[str, Any]:
        return {"limit": self.limit, "alpha": self.alpha, "glu_linear_offset": self.glu_linear_offset}
