"""Activations with per-row post-scaling: the middle op of a grouped MLP.

``y = scales[..., None] * act(x)``, where ``scales`` (one value per row, shape
``x.shape[:-1]``) is the op's one extra input, typically the router
probabilities of a mixture-of-experts layer. Gradients::

    dx      = act'(x) applied to (scales[..., None] * dy)
    dscales = sum over the last dim of act(x) * dy

Arithmetic: ``act`` comes from the kernel seam evaluated in fp32; the scaling,
``dx`` and ``dscales`` are formed in fp32 and each result is rounded once
(``y`` and ``dx`` to the compute dtype, ``dscales`` to the dtype of ``scales``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Iterable, Optional

import torch

from ...kernels import current_backend
from .._common import SUPPORTED_COMPUTE_DTYPES, check_tensor, compute_dtype, maybe_dequantize
from ..op import BasicOperation, OperationContext
from .swiglu import (
    ClampedSwiGLU,
    check_gated_last_dim,
    check_glu_interleave_size,
    deinterleave_glu,
    interleave_glu,
    validate_betas,
)

__all__ = ["ScaledSwiGLU", "ScaledSiTUGLU", "ScaledClampedQGeGLU", "ScaledSReLU"]


class _ScaledActivation(BasicOperation):
    """``y = scales[..., None] * act(x)`` with ``scales`` as extra input 0.

    Forward: the compute dtype is the ``torch.autocast`` dtype if active, else
    the input's dtype. ``scales`` may be fp32, fp16 or bf16 (it is used in
    fp32). ``(x, scales)`` are saved. No quantizer fusion (as in TE): the
    neighbours' quantizers are ignored, a quantized input or grad-output is
    dequantized, and ``y`` and ``dx`` leave in high precision.
    """

    num_extra_inputs: int = 1
    #: Name of the activation in the kernel table (``refops.kernels``).
    kernel_activation: ClassVar[str]
    gated: ClassVar[bool] = False

    def __init__(self, *, activation_recompute_in_mlp: bool = False) -> None:
        super().__init__()
        self.activation_recompute_in_mlp: bool = activation_recompute_in_mlp
        self.glu_interleave_size: Optional[int] = None

    def kernel_params(self) -> dict[str, Any]:
        """Keyword parameters passed to the activation kernels (none by default)."""
        return {}

    def _check_runnable(self) -> None:
        """Hook for configurations that only a fused path could run."""

    # ------------------------------------------------------------- kernels
    def _act32(self, x: torch.Tensor) -> torch.Tensor:
        """``act(x)`` in fp32, with ``x`` in the kernels' ``[a..., b...]`` layout."""
        return current_backend().activation_forward(x.float(), self.kernel_activation, **self.kernel_params())

    def _act_backward32(self, dact: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``act'(x)`` applied to the fp32 gradient ``dact``; fp32 result."""
        return current_backend().activation_backward(dact, x.float(), self.kernel_activation, **self.kernel_params())

    def _kernel_layout(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            check_gated_last_dim(type(self).__name__, x, self.glu_interleave_size)
        return deinterleave_glu(x, self.glu_interleave_size)

    # ---------------------------------------------------------- unfused API
    def op_forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError(
            f"{type(self).__name__} has {self.num_extra_inputs} extra tensor input (the scales), "
            "so it implements `fuser_forward` instead of `op_forward`"
        )

    def op_backward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{type(self).__name__} has {self.num_extra_inputs} extra tensor input (the scales), "
            "so it implements `fuser_backward` instead of `op_backward`"
        )

    # ------------------------------------------------------------- forward
    def fuser_forward(
        self,
        basic_op_ctxs: list[OperationContext],
        input_: torch.Tensor,
        *,
        basic_op_extra_inputs: list[tuple[torch.Tensor, ...]],
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
        basic_op_kwargs: list[dict[str, Any]],
    ) -> tuple[torch.Tensor, list[tuple[()]]]:
        name = type(self).__name__
        self._check_runnable()
        scales = basic_op_extra_inputs[0][0]
        check_tensor(name, "input", input_, dtype=input_.dtype)
        dtype = compute_dtype(name, input_, input_.dtype)
        self._check_scales(input_, scales)
        x = maybe_dequantize(input_, dtype).contiguous()

        act = self._act32(self._kernel_layout(x))
        y = (act * scales.float().unsqueeze(-1)).to(dtype)

        ctx = basic_op_ctxs[0]
        if ctx.requires_grad:
            ctx.save_for_backward(x, scales)
            ctx.dtype = dtype
            ctx.input_requires_grad = True
            ctx.extra_input_requires_grad = scales.requires_grad
        return y, [()]

    def _check_scales(self, input_: torch.Tensor, scales: Any) -> None:
        name = type(self).__name__
        if not isinstance(scales, torch.Tensor):
            raise TypeError(f"{name}: expected scales to be a torch.Tensor, got {type(scales).__name__}")
        if scales.dtype not in SUPPORTED_COMPUTE_DTYPES:
            raise TypeError(f"{name}: scales has dtype {scales.dtype}; supported are float32, float16, bfloat16")
        if scales.device != input_.device:
            raise ValueError(f"{name}: scales is on {scales.device} but the input is on {input_.device}")
        if input_.dim() == 0 or tuple(scales.shape) != tuple(input_.shape[:-1]):
            raise ValueError(
                f"{name}: expected scales with shape input.shape[:-1] = {tuple(input_.shape[:-1])} "
                f"(one per row), got {tuple(scales.shape)}"
            )

    # ------------------------------------------------------------ backward
    def fuser_backward(
        self,
        basic_op_ctxs: list[OperationContext],
        grad_output: torch.Tensor,
        *,
        basic_op_grad_extra_outputs: list[tuple[torch.Tensor, ...]],
    ) -> tuple[Optional[torch.Tensor], Iterable[tuple[()]], Iterable[tuple[Optional[torch.Tensor]]]]:
        self._check_runnable()
        ctx = basic_op_ctxs[0]
        x, scales = ctx.saved_tensors
        x_kernel = self._kernel_layout(x)
        dy = maybe_dequantize(grad_output, torch.float32)
        dx = None
        if ctx.input_requires_grad:
            dact = dy * scales.float().unsqueeze(-1)
            dx = interleave_glu(self._act_backward32(dact, x_kernel), self.glu_interleave_size).to(ctx.dtype)
        dscales = None
        if ctx.extra_input_requires_grad:
            dscales = (self._act32(x_kernel) * dy).sum(dim=-1).to(scales.dtype)
        return dx, [()], [(dscales,)]


class _ScaledGLU(_ScaledActivation):
    """A scaled gated activation; the fused grouped-MLP recompute mode is rejected."""

    gated = True

    def __init__(self, glu_interleave_size: Optional[int] = None, *, activation_recompute_in_mlp: bool = False) -> None:
        name = type(self).__name__
        if activation_recompute_in_mlp:
            raise ValueError(f"{name} does not support activation recomputation in the fused grouped MLP")
        super().__init__(activation_recompute_in_mlp=activation_recompute_in_mlp)
        self.glu_interleave_size = check_glu_interleave_size(name, glu_interleave_size)


class ScaledSwiGLU(_ScaledGLU):
    """``y = scales[..., None] * SiLU(a) * b`` (see :class:`~refops.ops.basic.swiglu.SwiGLU`).

    Args:
        glu_interleave_size: ``s`` for the block-interleaved layout ``[a(s), b(s), ...]``.
        activation_recompute_in_mlp: must be False (ValueError otherwise).
    """

    kernel_activation = "swiglu"


class ScaledSiTUGLU(_ScaledGLU):
    """``y = scales[..., None] * SiTUGLU(a, b)`` (see :class:`~refops.ops.basic.swiglu.SiTUGLU`).

    Args:
        glu_interleave_size, activation_recompute_in_mlp: as in :class:`ScaledSwiGLU`.
        beta1, beta2: the SiTU-GLU caps; finite and > 0.
    """

    kernel_activation = "situglu"

    def __init__(
        self,
        glu_interleave_size: Optional[int] = None,
        *,
        activation_recompute_in_mlp: bool = False,
        beta1: float = 4.0,
        beta2: float = 25.0,
    ) -> None:
        super().__init__(glu_interleave_size, activation_recompute_in_mlp=activation_recompute_in_mlp)
        self.beta1, self.beta2 = validate_betas(type(self).__name__, beta1, beta2)

    def kernel_params(self) -> dict[str, Any]:
        return {"beta1": self.beta1, "beta2": self.beta2}


class ScaledClampedQGeGLU(_ScaledGLU):
    """``y = scales[..., None] * ClampedSwiGLU(a, b)``: clamped quick-GELU GLU, post-scaled.

    The numerics are :class:`~refops.ops.basic.swiglu.ClampedSwiGLU`'s, held in
    the submodule ``_clamped`` (as in TransformerEngine).

    Args:
        glu_interleave_size, activation_recompute_in_mlp: as in :class:`ScaledSwiGLU`.
        limit, alpha, glu_linear_offset: as in ``ClampedSwiGLU`` (defaults 7, 1.702, 1).
    """

    kernel_activation = "clamped_swiglu"

    def __init__(
        self,
        glu_interleave_size: Optional[int] = None,
        *,
        activation_recompute_in_mlp: bool = False,
        limit: float = 7.0,
        alpha: float = 1.702,
        glu_linear_offset: float = 1.0,
    ) -> None:
        super().__init__(glu_interleave_size, activation_recompute_in_mlp=activation_recompute_in_mlp)
        self._clamped = ClampedSwiGLU(limit=limit, alpha=alpha, glu_linear_offset=glu_linear_offset)

    def kernel_params(self) -> dict[str, Any]:
        return self._clamped.kernel_params()


class ScaledSReLU(_ScaledActivation):
    """``y = scales[..., None] * max(x, 0)^2``.

    Args:
        activation_recompute_in_mlp: stored; only a fused grouped-MLP path can
            honour it, so running this op with it set raises RuntimeError.
    """

    kernel_activation = "srelu"

    def __init__(self, *, activation_recompute_in_mlp: bool = False) -> None:
        super().__init__(activation_recompute_in_mlp=activation_recompute_in_mlp)

    def _check_runnable(self) -> None:
        if self.activation_recompute_in_mlp:
            raise RuntimeError(
                f"{type(self).__name__}(activation_recompute_in_mlp=True) requires the fused grouped MLP path"
            )
