"""The kernel interface: the one seam between the ops and the arithmetic.

Ops, fused ops and the fuser never compute on tensors directly; they call the
methods below on the active backend (:func:`refops.kernels.current_backend`).
:class:`refops.kernels.reference.ReferenceKernels` implements every method in
plain torch and *is* the numerical specification. Other backends (``fastpath``)
subclass it and override what they accelerate, so a method they do not override
falls back to the reference arithmetic by construction.

Conventions shared by every method:

* Inputs are fp32, fp16 or bf16 (or, from the recipes issue on, quantized tensors
  where a method says so). Element-wise and normalization arithmetic runs in fp32
  and the result is rounded once to the output dtype.
* ``torch.autocast`` never applies inside a kernel: the caller has already chosen
  the compute dtype.
* Shapes: "rows" means the product of all leading dims; the last dim is the
  feature dim.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable

import torch

__all__ = ["KernelBackend"]


def _autocast_disabled(method: Callable) -> Callable:
    """Run ``method`` with torch.autocast off: the caller already chose the compute dtype."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with contextlib.ExitStack() as stack:
            for device_type in ("cpu", "cuda"):
                if torch.is_autocast_enabled(device_type):
                    stack.enter_context(torch.autocast(device_type, enabled=False))
            return method(*args, **kwargs)

    wrapper.__wrapped_kernel__ = True  # type: ignore[attr-defined]
    return wrapper


class KernelBackend:
    """Abstract set of kernels. Subclasses implement every method."""

    #: Name under which the backend is registered (``refops.use_backend(name)``).
    name: str = "abstract"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Every kernel a subclass defines runs with torch.autocast disabled, so no
        # backend can forget it.
        super().__init_subclass__(**kwargs)
        for attr, value in list(vars(cls).items()):
            if (
                callable(value)
                and not attr.startswith("_")
                and hasattr(KernelBackend, attr)
                and not getattr(value, "__wrapped_kernel__", False)
            ):
                setattr(cls, attr, _autocast_disabled(value))

    # ------------------------------------------------------------------ GEMM
    def gemm(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        *,
        trans_a: bool = False,
        trans_b: bool = False,
        out_dtype: torch.dtype,
        alpha: float = 1.0,
        out: torch.Tensor | None = None,
        accumulate: bool = False,
    ) -> torch.Tensor:
        """``alpha * op(a) @ op(b)`` (``+ out`` when ``accumulate``), rounded to ``out_dtype``.

        ``op(t)`` is ``t.T`` when the matching ``trans_*`` flag is set. ``a`` and ``b``
        are 2-D. When ``out`` is given the result is written into it and returned.
        """
        raise NotImplementedError

    # ------------------------------------------------------------ element-wise
    def activation_forward(self, x: torch.Tensor, activation: str, **params: Any) -> torch.Tensor:
        """``act(x)`` for a unary activation, or ``act(a) * b`` for a gated one.

        Gated activations split the last dim into halves ``a`` (first) and ``b``
        (second) and gate the first half. The result has ``x``'s dtype.
        """
        raise NotImplementedError

    def activation_backward(
        self, grad_output: torch.Tensor, x: torch.Tensor, activation: str, **params: Any
    ) -> torch.Tensor:
        """Gradient of :meth:`activation_forward` w.r.t. ``x``, in ``grad_output``'s dtype."""
        raise NotImplementedError

    def bias_activation_forward(
        self, x: torch.Tensor, bias: torch.Tensor | None, activation: str, **params: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(act(x + bias), x + bias)``: the activation input is returned for backward.

        ``x + bias`` is rounded to ``x``'s dtype before the activation, exactly as
        the unfused Bias op followed by the activation op would do.
        """
        raise NotImplementedError

    def activation_backward_dbias(
        self, grad_output: torch.Tensor, x: torch.Tensor, activation: str, **params: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(dx, dbias)``: :meth:`activation_backward` followed by :meth:`dbias` of its result."""
        raise NotImplementedError

    def dbias(self, grad_output: torch.Tensor) -> torch.Tensor:
        """Sum over every leading dim in fp32, rounded to ``grad_output``'s dtype."""
        raise NotImplementedError

    # ----------------------------------------------------------- normalization
    def layer_norm_forward(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        *,
        eps: float,
        zero_centered_gamma: bool,
        out_dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(y, mean, rstd)`` over the trailing ``weight.numel()`` elements of each row.

        ``y = (x - mean) * rstd * gamma + beta`` with ``rstd = 1/sqrt(var + eps)``,
        biased variance, ``gamma = weight`` (``1 + weight`` if zero-centered). ``mean``
        and ``rstd`` are fp32 with one entry per row.
        """
        raise NotImplementedError

    def layer_norm_backward(
        self,
        grad_output: torch.Tensor,
        x: torch.Tensor,
        mean: torch.Tensor,
        rstd: torch.Tensor,
        weight: torch.Tensor,
        *,
        zero_centered_gamma: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(dx, dweight, dbias)`` of :meth:`layer_norm_forward`."""
        raise NotImplementedError

    def rms_norm_forward(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        *,
        eps: float,
        zero_centered_gamma: bool,
        out_dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(y, rstd)`` with ``y = x * rstd * gamma``, ``rstd = 1/sqrt(mean(x^2) + eps)``."""
        raise NotImplementedError

    def rms_norm_backward(
        self,
        grad_output: torch.Tensor,
        x: torch.Tensor,
        rstd: torch.Tensor,
        weight: torch.Tensor,
        *,
        zero_centered_gamma: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(dx, dweight)`` of :meth:`rms_norm_forward`."""
        raise NotImplementedError

    def l2_normalize_forward(self, x: torch.Tensor, *, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(y, rsqrt_norm)`` with ``y = x * rsqrt(sum(x^2) + eps)`` over the last dim."""
        raise NotImplementedError

    def l2_normalize_backward(
        self, grad_output: torch.Tensor, x: torch.Tensor, rsqrt_norm: torch.Tensor, *, eps: float
    ) -> torch.Tensor:
        """``dx = r * (dy - x * sum(x * dy) / (sum(x^2) + eps))`` with ``r`` the saved rsqrt_norm."""
        raise NotImplementedError
