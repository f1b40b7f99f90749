"""``GroupedLinear``: a separate linear layer for each group of consecutive rows (the MoE expert GEMMs)."""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Optional

import torch

from ...kernels import current_backend
from ...quantization.quantized_tensor import QuantizedTensor
from ...quantization.quantizer import QuantizerRole
from ...quantization.state import get_autocast_recipe
from .._common import check_tensor, compute_dtype, maybe_dequantize, to_compute_dtype
from ..op import FuserOnlyOperation, OperationContext
from ..parameter_lifecycle import canonicalize_device, canonicalize_dtype
from ..quantized_weights import QuantizedWeights
from ..sizes import check_size
from .grouped_linear_buffers import (
    GRAD_INPUT_BUFFER_KEY,
    OUTPUT_BUFFER_KEY,
    check_group_parameters,
    read_extra_inputs,
    row_slices,
)
from .grouped_linear_wgrad import DelayedWeightGrads, bias_grads, main_grad_targets, scales_grad, weight_grads

__all__ = ["GroupedLinear", "OUTPUT_BUFFER_KEY", "GRAD_INPUT_BUFFER_KEY"]


class GroupedLinear(DelayedWeightGrads, QuantizedWeights, FuserOnlyOperation):
    r"""``y_g = x_g W_g^T + b_g`` for ``G`` groups of consecutive input rows.

    The input (any leading shape, last dim ``in_features``) is flattened to rows.
    The extra input ``split_sizes`` (an integer tensor of ``G`` entries, zeros
    allowed, read on the host) splits the rows into ``G`` consecutive chunks
    ``x_g``; each goes through its own weight ``W_g`` of shape
    ``(out_features, in_features)`` and the results are concatenated in order.
    Each GEMM accumulates in fp32; the bias is added in fp32 and the result is
    rounded once to the compute dtype.

    ``scale_bias=True`` (with ``bias``) adds a second extra input, per-row
    ``scales`` of shape ``(total_rows,)``: the bias term of row ``r`` in group ``g``
    becomes ``scales[r] * b_g`` (grads: :mod:`.grouped_linear_wgrad`).

    Parameters, in ``parameters()`` order (the order of the grads, ``docs/te-ops.md#parameters-and-their-gradients``):

    * default: ``weight0 .. weight{G-1}`` then ``bias0 .. bias{G-1}``;
    * ``single_grouped_weight``: one ``weight`` of shape ``(G, out, in)``;
      ``single_grouped_bias``: one ``bias`` of shape ``(G, out)``;
    * with ``bias=False`` the bias names are registered as ``None``.

    All weights and biases must share dtype, device and ``requires_grad`` (and the
    weights their tensor type): see ``check_group_parameters``. Weights start as
    ``kaiming_uniform_(a=sqrt(5))`` per group in group order, biases at zero.

    Quantization (TE's per-group "legacy" path; roles of module type ``"linear"``):
    forward quantizers ``2G`` (slot ``2g``: input of group ``g``, ``2g+1``: its
    weight), backward ``G`` (slot ``g``: its grad-output). Inside ``autocast`` each
    non-empty ``x_g``, each weight (unless stored quantized) and, in backward, each
    ``dy_g`` is quantized; the GEMMs read the usage blocked along their contracted
    dim, as in ``BasicLinear`` (also for ``backward_override``). A quantized input
    is dequantized before the split; bias terms use the high-precision ``dy``;
    output and grad-input are high precision. Inside ``quantized_model_init`` the
    ``weight{g}`` are stored as ``QuantizedTensor`` parameters (slot ``2g+1``).

    Differences from TE, all deliberate:

    * single grouped parameters exist *from construction* (also on ``meta``) and
      are plain tensors: materialization never changes the parameter count or
      identity. They need no environment variable and work in fp32 and under
      every recipe's quantized compute (each ``weight[g]`` is quantized per
      forward). Stored quantized (``quantized_model_init``) they are not
      implemented: the constructor raises ``NotImplementedError``.
    * caller buffers and ``backward_dw``: see :mod:`.grouped_linear_buffers` and
      :mod:`.grouped_linear_wgrad`.

    Args:
        num_groups, in_features, out_features: ``G`` and the weight sizes.
        bias: learn an additive bias per group.
        device: where parameters live; ``"meta"`` defers allocation to the first forward.
        dtype: fp32, fp16 or bf16 (default: torch's default dtype).
        rng_state_tracker_function: returns an object whose ``fork()`` context wraps
            each group's random initialization.
        accumulate_into_main_grad: accumulate weight grads into ``main_grad``
            (``weight{g}.main_grad``, or ``weight.main_grad`` of shape ``(G, out, in)``).
        single_grouped_weight, single_grouped_bias: one parameter for all groups.
        delay_wgrad_compute: backward queues the weight-grad GEMMs and returns no
            weight grads; :meth:`backward_dw` runs them later.
        scale_bias: scale each row's bias by the ``scales`` extra input.
    """

    num_extra_inputs: int = 1
    forward_kwargs = frozenset({OUTPUT_BUFFER_KEY, GRAD_INPUT_BUFFER_KEY})  # caller-provided buffers

    def __init__(
        self,
        num_groups: int,
        in_features: int,
        out_features: int,
        *,
        bias: bool = True,
        device: Optional[torch.device | str] = None,
        dtype: Optional[torch.dtype] = None,
        rng_state_tracker_function: Optional[Callable[[], Any]] = None,
        accumulate_into_main_grad: bool = False,
        single_grouped_weight: bool = False,
        single_grouped_bias: bool = False,
        delay_wgrad_compute: bool = False,
        scale_bias: bool = False,
    ) -> None:
        # The extra-input count must be known before BasicOperation sizes its channels.
        self._scale_bias = bool(scale_bias and bias)
        if self._scale_bias:
            self.num_extra_inputs = 2
        super().__init__()
        name = type(self).__name__
        num_groups, in_features, out_features = (
            check_size(name, what, value)
            for what, value in (("num_groups", num_groups), ("in_features", in_features), ("out_features", out_features))
        )
        device = canonicalize_device(device)
        dtype = canonicalize_dtype(dtype, op_name=name)
        self.num_groups = num_groups
        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = bias
        self.single_grouped_weight = single_grouped_weight
        self.single_grouped_bias = single_grouped_bias
        self._rng_state_tracker_function = rng_state_tracker_function
        self._accumulate_into_main_grad = accumulate_into_main_grad
        self._init_delayed_wgrads(delay_wgrad_compute)
        self._register_group_parameters(device, dtype)
        self._capture_quantized_model_init()
        if self._with_quantized_weight and single_grouped_weight:
            raise NotImplementedError(f"{name}: single_grouped_weight=True with weights stored quantized "
                                      "(quantized_model_init) is not implemented in refops; use discrete weights")
        self._initialize_or_defer(device)

    # ------------------------------------------------------------- parameters
    def _register_group_parameters(self, device: torch.device, dtype: torch.dtype) -> None:
        G, out, inp = self.num_groups, self.out_features, self.in_features
        single_weight = self.single_grouped_weight
        names = {"weight": (G, out, inp)} if single_weight else {f"weight{g}": (out, inp) for g in range(G)}
        names.update({"bias": (G, out)} if self.single_grouped_bias else {f"bias{g}": (out,) for g in range(G)})
        for name, shape in names.items():
            present = name.startswith("weight") or self.use_bias
            param = torch.nn.Parameter(torch.empty(shape, device=device, dtype=dtype)) if present else None
            self.register_parameter(name, param)

    def init_parameter(self, name: str, tensor: torch.Tensor) -> None:
        if name.startswith("bias"):
            tensor.zero_()
            return
        for matrix in list(tensor) if name == "weight" else [tensor]:
            with self._init_rng_context():
                torch.nn.init.kaiming_uniform_(matrix, a=math.sqrt(5))

    def _init_rng_context(self) -> Any:
        if self._rng_state_tracker_function is None:
            return contextlib.nullcontext()
        return self._rng_state_tracker_function().fork()

    @property
    def has_bias(self) -> bool:
        """Whether an additive bias is applied."""
        return self.use_bias

    def _weight_params(self) -> list[torch.nn.Parameter]:
        """The weight parameter objects: ``[weight]`` or ``[weight0, ..., weight{G-1}]``."""
        if self.single_grouped_weight:
            return [self.weight]
        return [getattr(self, f"weight{g}") for g in range(self.num_groups)]

    def _bias_params(self) -> list[Optional[torch.nn.Parameter]]:
        if self.single_grouped_bias:
            return [getattr(self, "bias", None)]
        return [getattr(self, f"bias{g}") for g in range(self.num_groups)]

    def group_weight(self, g: int) -> torch.Tensor:
        """Group ``g``'s ``(out, in)`` weight (a view of ``weight`` in single mode)."""
        return self.weight[g] if self.single_grouped_weight else getattr(self, f"weight{g}")

    def group_bias(self, g: int) -> Optional[torch.Tensor]:
        """Group ``g``'s ``(out,)`` bias, or None without bias."""
        if not self.use_bias:
            return None
        return self.bias[g] if self.single_grouped_bias else getattr(self, f"bias{g}")

    # -------------------------------------------------------------- lifecycle
    def pre_first_fuser_forward(self) -> None:
        """Materialize meta parameters, then check that all groups agree (errors name the index)."""
        super().pre_first_fuser_forward()
        check_group_parameters(self)

    # ------------------------------------------------------------- quantizers
    def num_quantizers(self, mode: str) -> int:
        return 2 * self.num_groups if mode == "forward" else self.num_groups

    def get_quantizer_roles(self, mode: str) -> list[QuantizerRole]:
        kinds = ("input", "weight") if mode == "forward" else ("grad_output",)
        name = getattr(self, "name", "") or ""
        return [QuantizerRole(module_type="linear", tensor_type=k, name=name) for k in kinds] * self.num_groups

    def _weight_quantizer_slot(self, name: str) -> Optional[int]:
        if name.startswith("weight") and name[len("weight"):].isdigit():
            return 2 * int(name[len("weight"):]) + 1
        return None

    def _group_quantizers(self, g: int) -> tuple[Any, Any, Any]:
        """Group ``g``'s (input, weight, grad-output) quantizers."""
        return self.get_quantizer("forward", 2 * g), self.get_quantizer("forward", 2 * g + 1), \
            self.get_quantizer("backward", g)

    def reset_recipe_state(self, *, recipe: Any) -> None:
        super().reset_recipe_state(recipe=recipe)
        if recipe is None:
            return
        for g in range(self.num_groups):
            input_quantizer, weight_quantizer, grad_output_quantizer = self._group_quantizers(g)
            input_quantizer.internal = grad_output_quantizer.internal = True
            weight = self._parameters.get(f"weight{g}")
            weight_quantizer.internal = not (self._with_quantized_weight or isinstance(weight, QuantizedTensor))
            if isinstance(weight, QuantizedTensor):  # keep the usages the stored weight has
                weight_quantizer.set_usage(rowwise=weight.has_usage("rowwise"),
                                           columnwise=weight.has_usage("columnwise"))

    def _set_quantizer_usages(self, *, input_requires_grad: bool, weight_requires_grad: bool, override: Any) -> None:
        """As ``BasicLinear``, per group: column-wise copies only for the backward GEMMs that read them."""
        quantized_backward = override is None
        for g in range(self.num_groups):
            input_quantizer, weight_quantizer, grad_output_quantizer = self._group_quantizers(g)
            input_quantizer.set_usage(rowwise=True, columnwise=weight_requires_grad and quantized_backward)
            weight_quantizer.set_usage(rowwise=True, columnwise=input_requires_grad and quantized_backward)
            grad_output_quantizer.set_usage(rowwise=input_requires_grad, columnwise=weight_requires_grad)

    def pre_fuser_forward(self, *, requires_grad: bool) -> None:
        """Set quantizer usages before neighbours quantize for this op."""
        recipe = get_autocast_recipe()
        if recipe is None or self._quantizers is None:
            return
        self._set_quantizer_usages(
            input_requires_grad=requires_grad,
            weight_requires_grad=requires_grad and self._weight_params()[0].requires_grad,
            override=recipe.backward_override,
        )

    def _quantize_rows(self, quantizer: Any, rows: torch.Tensor) -> torch.Tensor:
        """A group's rows quantized; an empty group stays a plain (0, K) tensor (nothing to quantize)."""
        return quantizer(rows) if rows.shape[0] > 0 else rows

    # ---------------------------------------------------------------- forward
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
        ctx = basic_op_ctxs[0]
        name = type(self).__name__
        leader = self._weight_params()[0]
        device = leader.device
        dtype = compute_dtype(name, input_, leader.dtype)
        check_tensor(name, "input", input_, dtype=leader.dtype, device=device, last_dim=self.in_features)
        x = maybe_dequantize(input_, dtype).reshape(-1, self.in_features)
        out_shape = (*input_.shape[:-1], self.out_features)
        split_sizes, scales, out_buffer, grad_input_buffer = read_extra_inputs(
            self, basic_op_extra_inputs[0], basic_op_kwargs[0], tuple(input_.shape), out_shape, dtype
        )
        rows = row_slices(split_sizes)
        ctx.input_requires_grad = ctx.requires_grad
        ctx.weight_requires_grad = ctx.requires_grad and leader.requires_grad
        recipe = get_autocast_recipe() if self._quantizers is not None else None
        override = recipe.backward_override if recipe is not None else None
        if recipe is not None:
            self._set_quantizer_usages(input_requires_grad=ctx.input_requires_grad,
                                       weight_requires_grad=ctx.weight_requires_grad, override=override)
        xs, weights = self._gemm_operands(x, rows, dtype, quantized=recipe is not None)
        biases = [self.group_bias(g) for g in range(self.num_groups)]
        biases = [None if b is None else to_compute_dtype(b, dtype) for b in biases]
        out = torch.empty(out_shape, dtype=dtype, device=device) if out_buffer is None else out_buffer
        self._grouped_gemm_forward(xs, weights, biases, scales, rows, out.view(-1, self.out_features))

        ctx.dtype = dtype
        ctx.input_shape = input_.shape
        ctx.split_sizes = split_sizes
        ctx.grad_input_buffer = grad_input_buffer
        ctx.with_quantized_compute = recipe is not None and override is None
        ctx.bias_requires_grad = ctx.requires_grad and self.use_bias and self._bias_params()[0].requires_grad
        ctx.scales_requires_grad = ctx.requires_grad and scales is not None and scales.requires_grad
        if ctx.weight_requires_grad and self._accumulate_into_main_grad:
            main_grad_targets(self)  # fail in forward, not halfway through backward
        if ctx.requires_grad:
            if override == "high_precision":  # the backward runs on the original tensors
                xs = [x[r] for r in rows]
                weights = [maybe_dequantize(self.group_weight(g), dtype) for g in range(self.num_groups)]
            needs_scales = ctx.scales_requires_grad or (ctx.bias_requires_grad and self._scale_bias)
            ctx.save_for_backward(
                scales if needs_scales else None,
                *(xs if ctx.weight_requires_grad else [None] * self.num_groups),
                *(weights if ctx.input_requires_grad else [None] * self.num_groups),
                *(biases if ctx.scales_requires_grad else [None] * self.num_groups),
            )
        # A view, so autograd records history on it and never on the caller's buffer.
        return (out if out_buffer is None else out_buffer.view(out_shape)), [()]

    def _gemm_operands(self, x, rows, dtype, *, quantized: bool) -> tuple[list, list]:
        """Per group: the GEMM input rows and weight, quantized (quantizers ``2g``, ``2g+1``) or plain."""
        G = self.num_groups
        weights = [self.group_weight(g) for g in range(G)]
        if not quantized:
            return [x[r] for r in rows], [maybe_dequantize(w, dtype) for w in weights]
        xs = [self._quantize_rows(self.get_quantizer("forward", 2 * g), x[r]) for g, r in enumerate(rows)]
        weights = [w if isinstance(w, QuantizedTensor) else self.get_quantizer("forward", 2 * g + 1)(
            to_compute_dtype(w, dtype)) for g, w in enumerate(weights)]
        return xs, weights

    def _grouped_gemm_forward(self, xs, weights, biases, scales, rows, out) -> None:
        """Write ``x_g W_g^T (+ b_g or scales_g b_g)`` into ``out``'s rows of each group."""
        kernels = current_backend()
        for g, r in enumerate(rows):
            if biases[g] is None:
                kernels.gemm(xs[g], weights[g], trans_b=True, out_dtype=out.dtype, out=out[r])
                continue
            y = kernels.gemm(xs[g], weights[g], trans_b=True, out_dtype=torch.float32)
            if scales is None:
                y, _ = kernels.bias_activation_forward(y, biases[g], "identity")
            else:  # row-wise bias scaling: a trivial fp32 epilogue
                y = y + scales[r].float()[:, None] * biases[g].float()[None, :]
            out[r].copy_(y)  # the one rounding to the compute dtype

    # --------------------------------------------------------------- backward
    def fuser_backward(
        self,
        basic_op_ctxs: list[OperationContext],
        grad_output: torch.Tensor,
        *,
        basic_op_grad_extra_outputs: list[tuple[torch.Tensor, ...]],
    ) -> tuple[Optional[torch.Tensor], list[list[Optional[torch.Tensor]]], list[tuple]]:
        ctx = basic_op_ctxs[0]
        G = self.num_groups
        scales, *rest = ctx.saved_tensors
        xs, weights, biases = rest[:G], rest[G : 2 * G], rest[2 * G :]
        dy = maybe_dequantize(grad_output, ctx.dtype).reshape(-1, self.out_features)
        rows = row_slices(ctx.split_sizes)
        dys = [dy[r] for r in rows]
        if ctx.with_quantized_compute:
            dys = [self._quantize_rows(self.get_quantizer("backward", g), dys[g]) for g in range(G)]
        else:  # backward_override "dequantized" (or no recipe): plain operands
            xs = [None if t is None else maybe_dequantize(t, ctx.dtype) for t in xs]
            weights = [None if t is None else maybe_dequantize(t, ctx.dtype) for t in weights]
        kernels = current_backend()

        dx = None
        if ctx.input_requires_grad:
            dx = ctx.grad_input_buffer
            if dx is None:
                dx = torch.empty(ctx.input_shape, dtype=ctx.dtype, device=dy.device)
            dx2d = dx.view(-1, self.in_features)
            for g, r in enumerate(rows):
                kernels.gemm(dys[g], weights[g], out_dtype=ctx.dtype, out=dx2d[r])

        grads: dict[str, Optional[torch.Tensor]] = {}
        if ctx.weight_requires_grad:
            if self._delay_wgrad_compute:
                self._wgrad_store.put(xs, dys, ctx.dtype)
            else:
                grads.update(weight_grads(self, kernels, xs, dys, ctx.dtype))
        if ctx.bias_requires_grad:
            grads.update(bias_grads(self, kernels, dy, scales, rows))
        param_grads = [grads.get(n) for n, p in self._parameters.items() if p is not None]
        extra_grads: tuple = (None,)
        if self._scale_bias:
            dscales = scales_grad(self, kernels, dy, biases, rows, scales) if ctx.scales_requires_grad else None
            extra_grads = (None, dscales)
        return dx, [param_grads], [extra_grads]
