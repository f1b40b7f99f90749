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

from .fused_activation_interface import FusedActivationInterface

__all__ = ["KernelBackend"]


def _cpu_or_cuda_autocast() -> bool:
    return torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")


#: One C call per kernel instead of two (every kernel call pays it): any autocast on; a device type other
#: than cpu/cuda then only builds an empty context below.
_autocast_on: Callable[[], bool] = getattr(torch._C, "_is_any_autocast_enabled", _cpu_or_cuda_autocast)


def _autocast_disabled(method: Callable) -> Callable:
    """Run ``method`` with torch.autocast off: the caller already chose the compute dtype."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _autocast_on():
            return method(*args, **kwargs)  # nothing to disable (the common case: no context to build)
        with contextlib.ExitStack() as stack:
            for device_type in ("cpu", "cuda"):
                if torch.is_autocast_enabled(device_type):
                    stack.enter_context(torch.autocast(device_type, enabled=False))
            return method(*args, **kwargs)

    wrapper.__wrapped_kernel__ = True  # type: ignore[attr-defined]
    return wrapper


class KernelBackend(FusedActivationInterface):
    """Abstract set of kernels. Subclasses implement every method (the fused activation + quantize
    ones are stated in :mod:`refops.kernels.fused_activation_interface`)."""

    #: Name under which the backend is registered (``refops.use_backend(name)``).
    name: str = "abstract"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Every kernel a subclass provides (itself or through a mixin) runs with
        # torch.autocast disabled, so no backend can forget it.
        super().__init_subclass__(**kwargs)
        for attr in dir(KernelBackend):
            value = getattr(cls, attr, None)
            if attr.startswith("_") or not callable(value) or getattr(value, "__wrapped_kernel__", False):
                continue
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
        role: str | None = None,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``alpha * op(a) @ op(b)`` (``+ out`` when ``accumulate``) ``+ bias``, rounded to ``out_dtype``.

        ``op(t)`` is ``t.T`` when the matching ``trans_*`` flag is set. ``a`` and ``b``
        are 2-D. When ``out`` is given the result is written into it and returned.

        ``bias`` (a plain 1-D tensor of ``op(b)``'s column count, any float dtype) is added to every row
        of the fp32 result, after ``alpha`` and ``accumulate``, in fp32, before the one rounding to
        ``out_dtype``: a cuBLAS bias epilogue, as TE's ``general_gemm(bias=...)`` computes it.

        Either operand may be a ``refops.quantization.QuantizedTensor``. It is
        dequantized (exactly, to fp32) from the usage blocked along the dim the GEMM
        contracts: ``op(a) = a`` contracts a's last dim -> row-wise; ``trans_a``
        contracts a's first dim -> column-wise; ``op(b) = b.T`` (``trans_b``) ->
        row-wise; ``op(b) = b`` -> column-wise. Then the fp32 GEMM runs as above.
        A missing usage is an error. The kernels see a quantized operand only as the plain
        arrays of its ``gemm_operand(usage)`` (``refops.kernels.GemmOperand``), which may
        also be passed directly.

        ``role`` (``"fprop"``, ``"dgrad"``, ``"wgrad"``; None infers it from TE's layouts:
        ``trans_b`` fprop, ``trans_a`` wgrad, neither dgrad) picks the accumulation TE's
        per-tensor FP8 recipes ask of the GEMM under ``refops.gemm_numerics("hopper")``
        (fprop fast accumulation, dgrad and wgrad the split accumulator); the exact
        numerics do not depend on it.
        """
        raise NotImplementedError

    # ---------------------------------------------------------- quantization
    # docs/recipes/index.md and each recipe's page are the specification; every byte is reproducible from
    # these arguments (plain tensors and scalars). ``fp8_dtype`` is
    # ``torch.float8_e4m3fn`` or ``torch.float8_e5m2``; quantized data is returned
    # as uint8 bytes. Quantize methods return ``(rowwise_data, rowwise_scale_inv,
    # columnwise_data, columnwise_scale_inv)`` with None for a usage not asked for.
    # Every array's shape and padding is defined in ``refops.layouts``. These docstrings
    # are each kernel's contract, written once: the reference kernels
    # (``refops.kernels.reference``) and the fast path implement them under the same
    # method and argument names.
    def amax(self, x: torch.Tensor) -> torch.Tensor:
        """``max |x|`` over all elements as fp32 shape (1,): exact, NaNs skipped, empty gives 0."""
        raise NotImplementedError

    def delayed_scaling_update(
        self, amax_history: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, *, numerator: float,
        algorithm: str,
    ) -> None:
        """One delayed-scaling recipe update, in place (``docs/recipes/delayed-scaling.md#the-arithmetic``).

        ``amax_history`` fp32 ``(L, n)``, ``scale`` fp32 ``(n,)``, ``amax`` fp32 ``(n,)``: the slots' new
        amaxes (``amax_history[0]``, or its all-reduction; it may be that very row). For each slot with
        ``amax != 0`` (NaN counts as used): the history becomes ``[0, old[2], ..., old[L-1], amax]``, and
        ``scale = RN(fp32(numerator) / m)`` where ``m`` is the max of ``old[1:]`` and ``amax`` folded with
        ``fmaxf`` from 0 (``algorithm="max"``) or ``amax`` (``"most_recent"``), kept where ``m`` is not
        finite and positive, ``+inf`` becoming FLT_MAX. Slots with ``amax == 0`` are left alone.
        ``numerator`` is ``fmax * 2^-margin`` (a Python float, rounded to fp32).
        """
        raise NotImplementedError

    def compute_scale_from_amax(
        self,
        amax: torch.Tensor,
        *,
        fmax: float,
        force_pow_2_scales: bool,
        amax_epsilon: float,
        value_for_inf: float,
    ) -> torch.Tensor:
        """Element-wise fp32 scale from amax (TE ``compute_scale_from_amax``).

        ``a = eps`` if ``a < eps``; ``a`` in {0, inf, NaN} gives 1; else
        ``s = RN(fmax / a)``, ``+inf`` becomes ``value_for_inf``; with pow2 the
        mantissa bits are zeroed (``bits & 0xFF800000``, rounds down): ``docs/recipes/index.md#the-scale-from-an-amax``.
        """
        raise NotImplementedError

    def quantize_float8(
        self,
        x: torch.Tensor,
        scale: torch.Tensor,
        *,
        fp8_dtype: torch.dtype,
        rowwise: bool,
        columnwise: bool,
        amax_accumulator: torch.Tensor | None = None,
    ) -> tuple[Any, ...]:
        """Per-tensor cast ``q = Q_F(RN(x * scale))`` (saturating RNE), ``scale_inv = RN(1/scale)``.

        ``scale``: fp32, one element. Row-wise data has ``x``'s shape; column-wise data
        is the transpose of the same bytes, shape ``(K, *lead)``; both share the (1,)
        ``scale_inv``. ``amax_accumulator`` (fp32, one element) becomes
        ``fmax(itself, amax(x))`` in place (delayed-scaling amax recording).
        """
        raise NotImplementedError

    def dequantize_float8(
        self, data: torch.Tensor, scale_inv: torch.Tensor, *, fp8_dtype: torch.dtype, out_dtype: torch.dtype
    ) -> torch.Tensor:
        """``RN(float(q) * scale_inv)`` in fp32, rounded once to ``out_dtype``; ``data``'s shape."""
        raise NotImplementedError

    def quantize_mxfp8(
        self,
        x: torch.Tensor,
        *,
        fp8_dtype: torch.dtype,
        rowwise: bool,
        columnwise: bool,
        with_2d_quantization: bool = False,
    ) -> tuple[Any, ...]:
        """MXFP8 (``docs/recipes/mxfp8.md``): per 1x32 (row-wise) / 32x1 (column-wise) block, or 32x32 tile if 2D.

        ``e = e8m0_round_up(RN(amax * fl(1/fmax)))``, ``q = Q_F(x * 2^(127-e))``.
        Needs ``M % 32 == 0`` and ``K % 32 == 0``. Data keeps ``x``'s shape in both
        usages (not transposed). uint8 scales ``[m, k/32]`` / ``[m/32, k]``, zero-padded to
        ``refops.layouts.mxfp8_scale_shape``. With ``with_2d_quantization`` one ``e`` per
        32x32 tile serves both usages: their data is byte-identical.
        """
        raise NotImplementedError

    def dequantize_mxfp8(
        self,
        data: torch.Tensor,
        scale_inv: torch.Tensor,
        *,
        fp8_dtype: torch.dtype,
        columnwise: bool,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        """``float(q) * 2^(e-127)`` in fp32, rounded once to ``out_dtype``; ``data``'s shape."""
        raise NotImplementedError

    def quantize_float8_block(
        self,
        x: torch.Tensor,
        *,
        fp8_dtype: torch.dtype,
        rowwise: bool,
        columnwise: bool,
        block_scaling_dim: int,
        force_pow_2_scales: bool,
        amax_epsilon: float,
    ) -> tuple[Any, ...]:
        """FP8 block scaling (``docs/recipes/fp8-block.md``): 1x128 blocks (dim 1) or 128x128 tiles (dim 2).

        Per block: ``s = compute_scale_from_amax(amax, fmax, pow2, eps,
        value_for_inf = finfo(x.dtype).max)``, ``q = Q_F(RN(x * s))``,
        ``scale_inv = RN(1/s)``. Column-wise data is transposed, ``(K, *lead)``.
        fp32 GEMM-ready scales, zero-padded to ``refops.layouts.float8_block_scale_shape``
        (1D row-wise ``[k/128, m]``, column-wise ``[m/128, k]``; 2D row-wise
        ``[m/128, k/128]``, column-wise the transposed row-wise bytes and scales).
        """
        raise NotImplementedError

    def dequantize_float8_block(
        self,
        data: torch.Tensor,
        scale_inv: torch.Tensor,
        *,
        fp8_dtype: torch.dtype,
        columnwise: bool,
        block_scaling_dim: int,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        """``RN(float(q) * scale_inv_block)`` in fp32, rounded once to ``out_dtype``; ``data``'s shape.

        ``data`` is row-wise ``(*lead, K)`` or, with ``columnwise``, ``(K, *lead)``.
        """
        raise NotImplementedError

    def quantize_nvfp4(
        self,
        x: torch.Tensor,
        *,
        rowwise: bool,
        columnwise: bool,
        with_2d_quantization: bool = False,
        with_rht: bool = False,
        with_random_sign_mask: bool = True,
        stochastic_rounding: bool = False,
        random_bytes_rowwise: torch.Tensor | None = None,
        random_bytes_columnwise: torch.Tensor | None = None,
        use_4over6: bool = False,
        e4m3_max_4over6: float = 256.0,
        err_mode: str = "MAE",
        row_scaled: bool = False,
        amax_rowwise: torch.Tensor | None = None,
        amax_columnwise: torch.Tensor | None = None,
    ) -> tuple[Any, ...]:
        """NVFP4 (``docs/recipes/nvfp4.md``) of 2-D ``x`` ``(M, K)``; the arithmetic, step by step, is
        ``reference.quant_nvfp4.quantize_nvfp4``'s.

        Returns ``(rowwise_data, rowwise_scale_inv, rowwise_amax, columnwise_data,
        columnwise_scale_inv, columnwise_amax)``: packed E2M1 uint8 ``(M, K/2)`` /
        ``(K, M/2)`` (transposed, RHT applied when ``with_rht``), E4M3 scale bytes
        padded to ``refops.layouts.nvfp4_scale_shape``, fp32 amax ``(1,)`` (per data
        row if ``row_scaled``). Stochastic
        rounding consumes the given random bytes (one uint8 per element of
        ``(M, K)`` / ``(K, M)``), so every byte is reproducible. ``amax_rowwise`` /
        ``amax_columnwise`` replace the computed global amaxes (amax reduction).
        """
        raise NotImplementedError

    def nvfp4_amax(
        self,
        x: torch.Tensor,
        *,
        rowwise: bool,
        columnwise: bool,
        with_rht: bool = False,
        with_random_sign_mask: bool = True,
        row_scaled: bool = False,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The global amaxes ``quantize_nvfp4`` would compute, ``(rowwise, columnwise)`` (column-wise after the RHT)."""
        raise NotImplementedError

    def dequantize_nvfp4(
        self,
        data: torch.Tensor,
        scale_inv: torch.Tensor,
        amax: torch.Tensor,
        *,
        shape: tuple[int, ...],
        columnwise: bool,
        e4m3_max: float,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        """``e2m1(q) * RN(RN(s_b * A) * fl(1/(6*E)))`` in fp32, rounded once; nominal ``shape``.

        ``data`` is ``(M, K/2)``, or ``(K, M/2)`` with ``columnwise`` (transposed back;
        an RHT is not undone).
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
