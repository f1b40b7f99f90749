"""``BasicLinear``: ``y = x W^T``, the GEMM at the centre of every pipeline, in high precision or quantized."""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Optional

import torch

from ...kernels import current_backend
from ...quantization.float8 import Float8Quantizer
from ...quantization.quantized_tensor import QuantizedTensor
from ...quantization.quantizer import QuantizerRole
from ...quantization.state import get_autocast_recipe
from .._common import check_tensor, compute_dtype, maybe_dequantize, to_compute_dtype
from ..op import BasicOperation, OperationContext
from ..parameter_lifecycle import canonicalize_device, canonicalize_dtype
from ..quantized_weights import QuantizedWeights
from ..sizes import check_size
from . import basic_linear_tp as tp

__all__ = ["BasicLinear"]


def _flatten(t: torch.Tensor, features: int) -> torch.Tensor:
    """``(rows, features)``; a quantized tensor keeps its leading dims (the GEMM flattens it)."""
    return t if isinstance(t, QuantizedTensor) else t.reshape(-1, features)


def _plain_rows(t: torch.Tensor, dtype: torch.dtype, features: int) -> torch.Tensor:
    """A plain ``(rows, features)`` tensor in ``dtype``: dequantized if quantized, else cast for autocast."""
    t = t.dequantize(dtype=dtype) if isinstance(t, QuantizedTensor) else to_compute_dtype(t, dtype)
    return t if t.dim() == 2 else t.reshape(-1, features)


class BasicLinear(QuantizedWeights, BasicOperation):
    """``y = x W^T`` over the last dim (any leading shape).

    Parameters: ``weight`` of shape ``(out_features, in_features)``, initialized
    with ``kaiming_uniform_(a=sqrt(5))`` like ``torch.nn.Linear``; a
    ``QuantizedTensor`` if built inside ``refops.quantized_model_init``.

    Quantized compute (inside ``refops.autocast``): the input and the weight are
    quantized with forward quantizers 0 and 1 (an already quantized input or
    weight is used as is), the grad-output with backward quantizer 0; the GEMMs
    read each operand's usage blocked along their contracted dim. Under
    ``backward_override`` the backward runs in high precision ("high_precision":
    on the original tensors; "dequantized": on the dequantized forward operands).
    The output leaves quantized only when the next op's input quantizer is a
    delayed-scaling ``Float8Quantizer`` (as in TE); for every other quantizer the
    next op quantizes its own input, with identical bytes (TE raises instead).

    Fused ops may set requests on this op's context before calling its
    forward or backward (:mod:`refops.ops.fused.one_rounding`): ``gemm_alpha``
    scales the GEMMs' products, ``gemm_out_fp32`` keeps the output (forward)
    or dgrad (backward) in fp32, unquantized, for the fused op's one rounding,
    and ``gemm_bias`` (forward) is added in the forward GEMM's epilogue, before
    its one rounding to the compute dtype (the output is then not quantized).

    Args:
        in_features, out_features: sizes of the input's and output's last dim.
        device: where the weight lives; ``"meta"`` defers allocation to the first
            forward (or an explicit ``reset_parameters()``).
        dtype: fp32, fp16 or bf16 (default: torch's default dtype).
        tensor_parallel_mode: None, "column" (shard ``out_features``) or "row" (shard
            ``in_features``); the weight has the local shape. A group of one rank turns
            it off; a sharded size not divisible by the group size is a ``ValueError``.
        tensor_parallel_group: the ``torch.distributed`` group (None: the default group).
        sequence_parallel: activations outside the linear are sharded along dim 0:
            column mode gathers x before the GEMM, row mode reduce-scatters the output
            (see :mod:`refops.ops.basic.basic_linear_tp`).
        rng_state_tracker_function: returns an object whose ``fork()`` context wraps
            the weight's random initialization.
        accumulate_into_main_grad: accumulate wgrad into ``weight.main_grad``
            (which must exist) instead of returning it.
        userbuffers_options: communication overlap; not supported (must be None).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        device: Optional[torch.device | str] = None,
        dtype: Optional[torch.dtype] = None,
        tensor_parallel_mode: Optional[str] = None,
        tensor_parallel_group: Any = None,
        sequence_parallel: bool = False,
        rng_state_tracker_function: Optional[Callable[[], Any]] = None,
        accumulate_into_main_grad: bool = False,
        userbuffers_options: Optional[dict[str, Any]] = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        in_features = check_size(name, "in_features", in_features)
        out_features = check_size(name, "out_features", out_features)
        if userbuffers_options is not None:
            raise NotImplementedError(f"{name}: userbuffers communication overlap is not implemented in refops")
        device = canonicalize_device(device)
        dtype = canonicalize_dtype(dtype, op_name=name)
        self.in_features = in_features
        self.out_features = out_features
        self._tp = tp.canonicalize_tensor_parallelism(
            name, mode=tensor_parallel_mode, group=tensor_parallel_group, sequence_parallel=sequence_parallel,
            in_features=in_features, out_features=out_features,
        )
        self.tensor_parallel_mode = self._tp.mode
        self.tensor_parallel_group = self._tp.group
        self.tensor_parallel_size = self._tp.size
        self.sequence_parallel = self._tp.sequence_parallel
        self.local_in_features = self._tp.local_in_features
        self.local_out_features = self._tp.local_out_features
        self._rng_state_tracker_function = rng_state_tracker_function
        self._accumulate_into_main_grad = accumulate_into_main_grad
        self.weight = torch.nn.Parameter(
            torch.empty(self.local_out_features, self.local_in_features, device=device, dtype=dtype)
        )
        self._capture_quantized_model_init()
        self._initialize_or_defer(device)

    def init_parameter(self, name: str, tensor: torch.Tensor) -> None:
        fork = (
            self._rng_state_tracker_function().fork()
            if self._rng_state_tracker_function is not None
            else contextlib.nullcontext()
        )
        with fork:
            torch.nn.init.kaiming_uniform_(tensor, a=math.sqrt(5))

    # ------------------------------------------------------------ quantizers
    def num_quantizers(self, mode: str) -> int:
        return 2 if mode == "forward" else 1

    def get_quantizer_roles(self, mode: str) -> list[QuantizerRole]:
        kinds = ("input", "weight") if mode == "forward" else ("grad_output",)
        return [QuantizerRole(module_type="linear", tensor_type=k, name=getattr(self, "name", "") or "") for k in kinds]

    def _weight_quantizer_slot(self, name: str) -> Optional[int]:
        return 1 if name == "weight" else None

    def reset_recipe_state(self, *, recipe: Any) -> None:
        super().reset_recipe_state(recipe=recipe)
        if recipe is None:
            return
        self.get_quantizer("forward", 0).internal = True
        self.get_quantizer("backward", 0).internal = True
        weight_quantizer = self.get_quantizer("forward", 1)
        weight = self._parameters.get("weight")
        weight_quantizer.internal = not (self._with_quantized_weight or isinstance(weight, QuantizedTensor))
        if isinstance(weight, QuantizedTensor):  # keep the usages the stored weight has
            weight_quantizer.set_usage(rowwise=weight.has_usage("rowwise"), columnwise=weight.has_usage("columnwise"))
        tp.configure_gathered_quantizers(self._tp, self.get_quantizer("forward", 0), self.get_quantizer("backward", 0))

    def _set_quantizer_usages(self, *, input_requires_grad: bool, weight_requires_grad: bool, override: Any) -> None:
        """Which copies each operand needs: column-wise ones only for the backward GEMMs that read them."""
        quantized_backward = override is None
        self.get_quantizer("forward", 0).set_usage(rowwise=True, columnwise=weight_requires_grad and quantized_backward)
        self.get_quantizer("forward", 1).set_usage(rowwise=True, columnwise=input_requires_grad and quantized_backward)
        self.get_quantizer("backward", 0).set_usage(rowwise=input_requires_grad, columnwise=weight_requires_grad)

    def pre_fuser_forward(self, *, requires_grad: bool) -> None:
        """Set quantizer usages before neighbours quantize for this op."""
        recipe = get_autocast_recipe()
        if recipe is None or self._quantizers is None:
            return
        self._set_quantizer_usages(
            input_requires_grad=requires_grad,
            weight_requires_grad=requires_grad and self.weight.requires_grad,
            override=recipe.backward_override,
        )

    def check_input(self, input_: torch.Tensor) -> None:
        weight = self.weight
        check_tensor(type(self).__name__, "input", input_, dtype=weight.dtype, device=self.parameter_device(),
                     last_dim=self.local_in_features)
        tp.check_sharded_input(type(self).__name__, self._tp, "input", input_)

    # ---------------------------------------------------------------- forward
    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        name = type(self).__name__
        weight, cfg = self.weight, self._tp
        dtype = compute_dtype(name, input_, weight.dtype)
        check_tensor(name, "input", input_, dtype=weight.dtype, device=weight.device, last_dim=self.local_in_features)
        tp.check_sharded_input(name, cfg, "input", input_)
        recipe = get_autocast_recipe() if self._quantizers is not None else None
        override = recipe.backward_override if recipe is not None else None
        input_requires_grad = ctx.requires_grad
        weight_requires_grad = ctx.requires_grad and weight.requires_grad

        x = _flatten(input_, self.local_in_features)
        input_quantizer = None
        if recipe is not None:
            self._set_quantizer_usages(
                input_requires_grad=input_requires_grad, weight_requires_grad=weight_requires_grad, override=override
            )
            input_quantizer = self.get_quantizer("forward", 0)
            w_op = weight if isinstance(weight, QuantizedTensor) else self.get_quantizer("forward", 1)(
                to_compute_dtype(weight, dtype)
            )
        else:
            w_op = maybe_dequantize(weight, dtype)
        x_local, x_op = self._forward_input(x, dtype, input_quantizer, weight_requires_grad and override is None)
        gemm_bias = getattr(ctx, "gemm_bias", None)
        extra = {} if gemm_bias is None else {"bias": gemm_bias}  # backends of the older signature keep working
        y = current_backend().gemm(x_op, w_op, trans_b=True, alpha=getattr(ctx, "gemm_alpha", 1.0),
                                   out_dtype=torch.float32 if getattr(ctx, "gemm_out_fp32", False) else dtype, **extra)
        if input_.dim() != 2 or cfg.gathers_input:  # a 2-D input's rows are already the output's
            out_lead = tp.gathered_shape(input_.shape, cfg.size)[:-1] if cfg.gathers_input else input_.shape[:-1]
            y = y.reshape(*out_lead, self.local_out_features)
        if cfg.mode == "row":  # TE drops the output quantizer: the sum is taken in high precision
            y = tp.reduce_output(cfg, y, name)
        elif recipe is not None and gemm_bias is None and isinstance(next_op_input_quantizer, Float8Quantizer):
            y = next_op_input_quantizer(y)

        if override == "high_precision":
            x_saved = maybe_dequantize(x, dtype).reshape(-1, self.local_in_features)
            w_saved = maybe_dequantize(weight, dtype)
        else:
            x_saved, w_saved = x_local, w_op
        ctx.save_for_backward(x_saved if weight_requires_grad else None, w_saved if input_requires_grad else None)
        ctx.with_quantized_compute = recipe is not None and override is None
        ctx.backward_override = override
        ctx.input_quantizer = input_quantizer
        ctx.grad_output_quantizer = self.get_quantizer("backward", 0) if recipe is not None else None
        # Column mode reduces dgrad in high precision: TE drops the grad-input quantizer.
        quantized_dgrad = ctx.with_quantized_compute and cfg.mode != "column"
        ctx.grad_input_quantizer = prev_op_grad_output_quantizer if quantized_dgrad else None
        ctx.dtype = dtype
        ctx.input_shape = input_.shape
        ctx.input_requires_grad = input_requires_grad
        ctx.weight_requires_grad = weight_requires_grad
        return y

    def _forward_input(self, x: torch.Tensor, dtype: torch.dtype, quantizer: Any, wgrad_quantized: bool
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x_local, x_op)``: what backward keeps and what the GEMM reads.

        Without column+SP both are this rank's input (quantized under a recipe). With it,
        ``x_op`` is the gathered input and ``x_local`` this rank's shard (quantized when
        its blocks align with dim 0): TE keeps the shard and gathers it again for wgrad.
        """
        if not self._tp.gathers_input:
            if quantizer is None:
                x = _plain_rows(x, dtype, self.local_in_features)
            elif not isinstance(x, QuantizedTensor):
                x = quantizer(to_compute_dtype(x, dtype))
            return x, x
        if quantizer is None:
            x_local = maybe_dequantize(x, dtype)
        else:
            x_local = tp.quantize_shard(to_compute_dtype(x, dtype), quantizer, columnwise=wgrad_quantized)
        return x_local, tp.gather_shard(x_local, self._tp, quantizer, rowwise=True, columnwise=False)

    # --------------------------------------------------------------- backward
    def op_backward(
        self, ctx: OperationContext, grad_output: torch.Tensor
    ) -> tuple[Optional[torch.Tensor], list[Optional[torch.Tensor]]]:
        x, w = ctx.saved_tensors
        cfg, name = self._tp, type(self).__name__
        # A custom fused op may fill the context without the input shape (TE's contract does not ask for it).
        input_shape = getattr(ctx, "input_shape", None) or (*grad_output.shape[:-1], self.local_in_features)
        alpha, out_fp32 = getattr(ctx, "gemm_alpha", 1.0), getattr(ctx, "gemm_out_fp32", False)
        quantized = ctx.with_quantized_compute
        dy = _flatten(grad_output, self.local_out_features)
        if cfg.gathers_grad_output:
            dy_q = ctx.grad_output_quantizer if quantized else None
            if dy_q is None:
                dy = maybe_dequantize(dy, ctx.dtype)
            else:
                dy = tp.quantize_shard(to_compute_dtype(dy, ctx.dtype), dy_q, columnwise=ctx.weight_requires_grad)
            dy = tp.gather_shard(dy, cfg, dy_q, rowwise=ctx.input_requires_grad, columnwise=ctx.weight_requires_grad)
        if x is not None and cfg.gathers_input:
            x_q = ctx.input_quantizer if quantized else None
            x = tp.gather_shard(x, cfg, x_q, rowwise=not quantized, columnwise=quantized)
        if quantized:
            if not isinstance(dy, QuantizedTensor):
                dy = ctx.grad_output_quantizer(to_compute_dtype(dy, ctx.dtype))
        else:
            dy = _plain_rows(dy, ctx.dtype, self.local_out_features)
            x = None if x is None else _plain_rows(x, ctx.dtype, self.local_in_features)
            w = None if w is None else maybe_dequantize(w, ctx.dtype)
        kernels = current_backend()
        dx = None
        if ctx.input_requires_grad:
            dx = kernels.gemm(dy, w, alpha=alpha, out_dtype=torch.float32 if out_fp32 else ctx.dtype)
            if cfg.mode == "column":
                full_shape = tp.gathered_shape(input_shape, cfg.size) if cfg.sequence_parallel else input_shape
                dx = tp.reduce_grad_input(cfg, dx.reshape(full_shape), name)
            if dx.shape != input_shape:
                dx = dx.reshape(input_shape)
            if isinstance(ctx.grad_input_quantizer, Float8Quantizer) and not out_fp32:
                dx = ctx.grad_input_quantizer(dx)
        dw = self._weight_grad(kernels, dy, x, ctx.dtype, alpha) if ctx.weight_requires_grad else None
        return dx, [dw]

    def _weight_grad(
        self, kernels, dy: torch.Tensor, x: torch.Tensor, dtype: torch.dtype, alpha: float = 1.0
    ) -> Optional[torch.Tensor]:
        """``dW = dy^T x``, or its accumulation into ``weight.main_grad``."""
        if not self._accumulate_into_main_grad:
            return kernels.gemm(dy, x, trans_a=True, alpha=alpha, out_dtype=dtype)
        weight = self.weight
        main_grad = getattr(weight, "main_grad", None)
        if main_grad is None:
            raise RuntimeError(
                f"{type(self).__name__} is configured with accumulate_into_main_grad=True, "
                "but weight parameter does not have a valid main_grad attribute"
            )
        overwrite = getattr(weight, "overwrite_main_grad", False)
        kernels.gemm(dy, x, trans_a=True, alpha=alpha, out_dtype=main_grad.dtype, out=main_grad,
                     accumulate=not overwrite)
        if hasattr(weight, "grad_added_to_main_grad"):
            weight.grad_added_to_main_grad = True
            return torch.zeros_like(weight)
        return None
