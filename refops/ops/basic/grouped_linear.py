"""``GroupedLinear``: a separate linear layer for each group of consecutive rows (the MoE expert GEMMs)."""

from __future__ import annotations

import collections
import contextlib
import math
from typing import Any, Callable, Optional

import torch

from ...kernels import current_backend
from .._common import check_tensor, compute_dtype, to_compute_dtype
from ..op import BasicOperation, OperationContext
from ..parameter_lifecycle import canonicalize_device, canonicalize_dtype

__all__ = ["GroupedLinear", "OUTPUT_BUFFER_KEY", "GRAD_INPUT_BUFFER_KEY"]

#: Forward kwarg (``Sequential(op_kwargs={op: {...}})``) naming a tensor the output is written into.
OUTPUT_BUFFER_KEY = "output"
#: Forward kwarg naming a tensor the backward writes the input grad into.
GRAD_INPUT_BUFFER_KEY = "grad_input"


class GroupedLinear(BasicOperation):
    r"""``y_g = x_g W_g^T + b_g`` for ``G`` groups of consecutive input rows.

    The input (any leading shape, last dim ``in_features``) is flattened to rows.
    The extra input ``split_sizes`` (an integer tensor of ``G`` entries, zeros
    allowed, read on the host) splits the rows into ``G`` consecutive chunks
    ``x_g``; each goes through its own weight ``W_g`` of shape
    ``(out_features, in_features)`` and the results are concatenated in order.
    Each GEMM accumulates in fp32; the bias is added in fp32 and the result is
    rounded once to the compute dtype.

    ``scale_bias=True`` (with ``bias``) adds a second extra input, per-row
    ``scales`` of shape ``(total_rows,)``, and the bias term of row ``r`` in group
    ``g`` becomes ``scales[r] * b_g``. Backward, both in fp32:
    ``db_g = sum_r scales[r] dy[r]`` and ``dscales[r] = dy[r] . b_g``.

    Parameters, in ``parameters()`` order (the order of the grads, TE §2.6):

    * default: ``weight0 .. weight{G-1}`` then ``bias0 .. bias{G-1}``;
    * ``single_grouped_weight``: one ``weight`` of shape ``(G, out, in)``;
      ``single_grouped_bias``: one ``bias`` of shape ``(G, out)``;
    * with ``bias=False`` the bias names are registered as ``None``.

    All weights and biases must share dtype, device and ``requires_grad``
    (checked at the first forward; the error names the offending index).

    Weights start as ``kaiming_uniform_(a=sqrt(5))`` applied to each group's
    ``(out, in)`` matrix in group order (so both layouts hold the same values for
    the same seed), biases at zero.

    Differences from TE, all deliberate:

    * single grouped parameters exist *from construction* (also on ``meta``) and
      are plain tensors: materialization never changes the parameter count or
      identity (TE swaps discrete params for a ``GroupedTensor`` then). They need
      no environment variable and work in fp32. So ``weight`` always comes
      before the biases (TE lists discrete biases before a late ``weight``).
    * a caller ``output`` buffer is returned as a view, so autograd never marks the
      buffer itself as requiring grad and it can be reused every iteration.
    * :meth:`backward_dw` computes every queued weight grad and *accumulates*
      into ``.grad`` like autograd does (TE pops one entry and overwrites).

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
        for what, value in (("num_groups", num_groups), ("in_features", in_features), ("out_features", out_features)):
            if value <= 0:
                raise ValueError(f"{name}: {what} must be positive (got {value})")
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
        self._delay_wgrad_compute = delay_wgrad_compute
        self._pending_wgrads: collections.deque = collections.deque()
        self.wgrad_accumulation_and_reduce_hooks: list[Callable[[], None]] = []
        self._register_group_parameters(device, dtype)
        self._initialize_or_defer(device)

    # ------------------------------------------------------------- parameters
    def _register_group_parameters(self, device: torch.device, dtype: torch.dtype) -> None:
        G, out, inp = self.num_groups, self.out_features, self.in_features

        def new(*shape: int) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.empty(*shape, device=device, dtype=dtype))

        if self.single_grouped_weight:
            self.register_parameter("weight", new(G, out, inp))
        else:
            for g in range(G):
                self.register_parameter(f"weight{g}", new(out, inp))
        if self.single_grouped_bias:
            self.register_parameter("bias", new(G, out) if self.use_bias else None)
        else:
            for g in range(G):
                self.register_parameter(f"bias{g}", new(out) if self.use_bias else None)

    def register_parameter(self, name: str, param: Optional[torch.nn.Parameter]) -> None:
        super().register_parameter(name, param)
        # Megatron's DDP must not reduce a weight whose grad arrives later, in backward_dw.
        if param is not None and name.startswith("weight") and getattr(self, "_delay_wgrad_compute", False):
            param.skip_backward_post_hook = True

    def init_parameter(self, name: str, tensor: torch.Tensor) -> None:
        if name.startswith("bias"):
            tensor.zero_()
            return
        matrices = list(tensor) if name == "weight" else [tensor]
        for matrix in matrices:
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
        weights = self._weight_params()
        leader = weights[0]
        for g, weight in enumerate(weights):
            self._check_like_leader("Weight" if self.single_grouped_weight else f"Weight {g}", weight, leader)
        for g, bias in enumerate(self._bias_params()):
            label = "Bias" if self.single_grouped_bias else f"Bias {g}"
            if self.use_bias and bias is None:
                raise RuntimeError(f"{type(self).__name__}: Expected biases, but {label.lower()} is uninitialized")
            if not self.use_bias and bias is not None:
                raise RuntimeError(f"{type(self).__name__}: Expected no biases, but {label.lower()} is initialized")
            if bias is not None:
                self._check_like_leader(label, bias, leader)

    def _check_like_leader(self, label: str, param: torch.Tensor, leader: torch.Tensor) -> None:
        expected = (leader.dtype, leader.device, leader.requires_grad)
        found = (param.dtype, param.device, param.requires_grad)
        for what, want, got in zip(("dtype", "device", "requires_grad"), expected, found):
            if want != got:
                raise RuntimeError(
                    f"{type(self).__name__}: {label} has {what}={got}, but the weights have {what}={want}"
                )

    # ---------------------------------------------------------------- forward
    def op_forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError(f"{type(self).__name__} has extra inputs; the fuser calls fuser_forward")

    def op_backward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{type(self).__name__} has extra inputs; the fuser calls fuser_backward")

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
        x = to_compute_dtype(input_, dtype).reshape(-1, self.in_features)
        split_sizes = self._read_split_sizes(basic_op_extra_inputs[0][0], x.shape[0])
        scales = self._check_scales(basic_op_extra_inputs[0][1], x.shape[0], device) if self._scale_bias else None
        out_shape = (*input_.shape[:-1], self.out_features)
        out_buffer, grad_input_buffer = self._caller_buffers(
            basic_op_kwargs[0], out_shape, tuple(input_.shape), dtype, device
        )

        weights = [to_compute_dtype(self.group_weight(g), dtype) for g in range(self.num_groups)]
        biases = [self.group_bias(g) for g in range(self.num_groups)]
        biases = [None if b is None else to_compute_dtype(b, dtype) for b in biases]
        out = torch.empty(out_shape, dtype=dtype, device=device) if out_buffer is None else out_buffer
        self._grouped_gemm_forward(x, weights, biases, scales, split_sizes, out.view(-1, self.out_features))

        ctx.dtype = dtype
        ctx.input_shape = input_.shape
        ctx.split_sizes = split_sizes
        ctx.grad_input_buffer = grad_input_buffer
        ctx.input_requires_grad = ctx.requires_grad
        ctx.weight_requires_grad = ctx.requires_grad and leader.requires_grad
        ctx.bias_requires_grad = ctx.requires_grad and self.use_bias and self._bias_params()[0].requires_grad
        ctx.scales_requires_grad = ctx.requires_grad and scales is not None and scales.requires_grad
        if ctx.weight_requires_grad and self._accumulate_into_main_grad:
            self._main_grad_targets()  # fail in forward, not halfway through backward
        if ctx.requires_grad:
            needs_scales = ctx.scales_requires_grad or (ctx.bias_requires_grad and self._scale_bias)
            ctx.save_for_backward(
                x if ctx.weight_requires_grad else None,
                scales if needs_scales else None,
                *weights,
                *(biases if ctx.scales_requires_grad else [None] * self.num_groups),
            )
        # A view, so autograd records history on it and never on the caller's buffer.
        return (out if out_buffer is None else out_buffer.view(out_shape)), [()]

    def _grouped_gemm_forward(self, x, weights, biases, scales, split_sizes, out) -> None:
        """Write ``x_g W_g^T (+ b_g or scales_g b_g)`` into ``out``'s rows of each group."""
        kernels = current_backend()
        for g, rows in enumerate(_row_slices(split_sizes)):
            if biases[g] is None:
                kernels.gemm(x[rows], weights[g], trans_b=True, out_dtype=out.dtype, out=out[rows])
                continue
            y = kernels.gemm(x[rows], weights[g], trans_b=True, out_dtype=torch.float32)
            if scales is None:
                y, _ = kernels.bias_activation_forward(y, biases[g], "identity")
            else:  # row-wise bias scaling: a trivial fp32 epilogue
                y = y + scales[rows].float()[:, None] * biases[g].float()[None, :]
            out[rows].copy_(y)  # the one rounding to the compute dtype

    def _read_split_sizes(self, split_sizes: Any, num_rows: int) -> list[int]:
        """``split_sizes`` as host ints: ``G`` non-negative entries that sum to the number of rows."""
        name = type(self).__name__
        if not isinstance(split_sizes, torch.Tensor):
            raise TypeError(f"{name}: split_sizes must be an integer tensor, got {type(split_sizes).__name__}")
        if split_sizes.is_floating_point() or split_sizes.is_complex() or split_sizes.dtype == torch.bool:
            raise TypeError(f"{name}: split_sizes must be an integer tensor, got dtype {split_sizes.dtype}")
        if split_sizes.numel() != self.num_groups:
            raise ValueError(f"{name}: Expected {self.num_groups} splits, but got {split_sizes.numel()}")
        sizes = [int(s) for s in split_sizes.reshape(-1).tolist()]  # the host read (a device sync)
        if any(s < 0 for s in sizes):
            raise ValueError(f"{name}: split sizes must be non-negative, got {sizes}")
        if sum(sizes) != num_rows:
            raise ValueError(f"{name}: split sizes {sizes} sum to {sum(sizes)}, but the input has {num_rows} rows")
        return sizes

    def _check_scales(self, scales: Any, num_rows: int, device: torch.device) -> torch.Tensor:
        name = type(self).__name__
        if not isinstance(scales, torch.Tensor) or not scales.is_floating_point():
            raise TypeError(f"{name}: scales must be a floating-point tensor (scale_bias=True)")
        if scales.numel() != num_rows:
            raise ValueError(
                f"{name}: scales needs one entry per input row ({num_rows}), got shape {tuple(scales.shape)}"
            )
        if scales.device != device:
            raise ValueError(f"{name}: scales is on {scales.device} but the parameters are on {device}")
        return scales.reshape(-1)

    def _caller_buffers(self, kwargs: dict[str, Any], out_shape: tuple, in_shape: tuple, dtype, device) -> tuple:
        """The ``output`` and ``grad_input`` buffers from the forward kwargs (None when absent), checked."""
        kwargs = dict(kwargs)
        buffers = (kwargs.pop(OUTPUT_BUFFER_KEY, None), kwargs.pop(GRAD_INPUT_BUFFER_KEY, None))
        if kwargs:
            raise TypeError(f"{type(self).__name__}: unexpected forward kwargs {sorted(kwargs)}")
        for key, buffer, shape in zip((OUTPUT_BUFFER_KEY, GRAD_INPUT_BUFFER_KEY), buffers, (out_shape, in_shape)):
            if buffer is not None:
                self._check_caller_buffer(key, buffer, shape, dtype, device)
        return buffers

    def _check_caller_buffer(self, key: str, buffer: Any, shape: tuple, dtype: torch.dtype, device) -> None:
        """A caller buffer must be a contiguous, grad-free tensor of exactly the needed shape, dtype and device."""
        name = type(self).__name__
        if not isinstance(buffer, torch.Tensor):
            raise TypeError(f"{name}: the {key!r} buffer must be a torch.Tensor, got {type(buffer).__name__}")
        problems = {
            "shape": (tuple(buffer.shape), tuple(shape)),
            "dtype": (buffer.dtype, dtype),
            "device": (buffer.device, device),
        }
        for what, (got, want) in problems.items():
            if got != want:
                raise ValueError(f"{name}: the {key!r} buffer has {what} {got}, but {want} is needed")
        if not buffer.is_contiguous():
            raise ValueError(f"{name}: the {key!r} buffer must be contiguous")
        if buffer.requires_grad:
            raise ValueError(f"{name}: the {key!r} buffer must not require grad (pass buffer.detach())")

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
        x, scales, *rest = ctx.saved_tensors
        weights, biases = rest[:G], rest[G:]
        dy = grad_output.reshape(-1, self.out_features)
        dy = dy if dy.dtype == ctx.dtype else dy.to(ctx.dtype)
        rows = _row_slices(ctx.split_sizes)
        kernels = current_backend()

        dx = None
        if ctx.input_requires_grad:
            dx = ctx.grad_input_buffer
            if dx is None:
                dx = torch.empty(ctx.input_shape, dtype=ctx.dtype, device=dy.device)
            dx2d = dx.view(-1, self.in_features)
            for g, r in enumerate(rows):
                kernels.gemm(dy[r], weights[g], out_dtype=ctx.dtype, out=dx2d[r])

        grads: dict[str, Optional[torch.Tensor]] = {}
        if ctx.weight_requires_grad:
            if self._delay_wgrad_compute:
                self._pending_wgrads.append((x, dy, ctx.split_sizes))
            else:
                grads.update(self._weight_grads(kernels, x, dy, ctx.split_sizes))
        if ctx.bias_requires_grad:
            grads.update(self._bias_grads(kernels, dy, scales, rows))
        param_grads = [grads.get(n) for n, p in self._parameters.items() if p is not None]
        extra_grads: tuple = (None,)
        if self._scale_bias:
            dscales = self._scales_grad(kernels, dy, biases, rows, scales) if ctx.scales_requires_grad else None
            extra_grads = (None, dscales)
        return dx, [param_grads], [extra_grads]

    def _weight_grads(self, kernels, x, dy, split_sizes) -> dict[str, Optional[torch.Tensor]]:
        """``dW_g = dy_g^T x_g`` per weight parameter name, or accumulation into ``main_grad``."""
        rows = _row_slices(split_sizes)
        names = [n for n in self._parameters if n.startswith("weight")]
        if self._accumulate_into_main_grad:
            for g, (target, accumulate) in enumerate(self._main_grad_targets()):
                kernels.gemm(dy[rows[g]], x[rows[g]], trans_a=True, out_dtype=target.dtype, out=target,
                             accumulate=accumulate)
            return {n: _dummy_wgrad(getattr(self, n)) for n in names}
        shape = (self.out_features, self.in_features)
        dws = [torch.empty(shape, dtype=dy.dtype, device=dy.device) for _ in rows]
        for g, r in enumerate(rows):
            kernels.gemm(dy[r], x[r], trans_a=True, out_dtype=dy.dtype, out=dws[g])
        if self.single_grouped_weight:
            return {"weight": torch.stack(dws)}
        return dict(zip(names, dws))

    def _main_grad_targets(self) -> list[tuple[torch.Tensor, bool]]:
        """Per group: ``(the (out, in) main_grad slice to write, whether to accumulate)``."""
        targets = []
        for param in self._weight_params():
            main_grad = getattr(param, "main_grad", None)
            if main_grad is None:
                raise RuntimeError(
                    f"{type(self).__name__} is configured with accumulate_into_main_grad=True, "
                    "but weight parameter does not have a valid main_grad attribute"
                )
            accumulate = not getattr(param, "overwrite_main_grad", False)
            slices = [main_grad[g] for g in range(self.num_groups)] if self.single_grouped_weight else [main_grad]
            targets.extend((s, accumulate) for s in slices)
        return targets

    def _bias_grads(self, kernels, dy, scales, rows) -> dict[str, torch.Tensor]:
        """``db_g = sum_r dy[r]`` (or ``sum_r scales[r] dy[r]`` with scale_bias), in fp32."""
        dbs = []
        for g, r in enumerate(rows):
            dy_g = dy[r] if scales is None else dy[r].float() * scales[r].float()[:, None]
            dbs.append(kernels.dbias(dy_g).to(dy.dtype))
        if self.single_grouped_bias:
            return {"bias": torch.stack(dbs)}
        return {f"bias{g}": db for g, db in enumerate(dbs)}

    def _scales_grad(self, kernels, dy, biases, rows, scales) -> torch.Tensor:
        """``dscales[r] = dy[r] . b_g`` (a matrix-vector GEMM per group, fp32 output)."""
        dscales = torch.empty(scales.shape[0], dtype=torch.float32, device=dy.device)
        for g, r in enumerate(rows):
            column = biases[g].reshape(self.out_features, 1)
            kernels.gemm(dy[r], column, out_dtype=torch.float32, out=dscales[r].view(-1, 1))
        return dscales.to(scales.dtype)

    # ------------------------------------------------------ delayed weight grads
    def need_backward_dw(self) -> bool:
        """Whether :meth:`backward_dw` must run to finish the weight grads."""
        return self._delay_wgrad_compute

    def register_wgrad_accumulation_and_reduce_hooks(self, hook: Callable[[], None]) -> None:
        """Run ``hook()`` after each :meth:`backward_dw` (where DDP would reduce the grads)."""
        self.wgrad_accumulation_and_reduce_hooks.append(hook)

    def backward_dw(self) -> None:
        """Run every queued weight-grad GEMM, oldest first.

        Each result is accumulated into ``.grad`` of the weight parameters (set if
        it is None), or into ``main_grad`` with ``accumulate_into_main_grad``.
        """
        if not self._pending_wgrads:
            return
        kernels = current_backend()
        with torch.no_grad():  # runs outside autograd's backward, like an optimizer step
            while self._pending_wgrads:
                x, dy, split_sizes = self._pending_wgrads.popleft()
                grads = self._weight_grads(kernels, x, dy, split_sizes)
                if not self._accumulate_into_main_grad:
                    for name, grad in grads.items():
                        _accumulate_grad(getattr(self, name), grad)
        for hook in self.wgrad_accumulation_and_reduce_hooks:
            hook()


def _row_slices(split_sizes: list[int]) -> list[slice]:
    """The consecutive row ranges of the groups."""
    slices, start = [], 0
    for size in split_sizes:
        slices.append(slice(start, start + size))
        start += size
    return slices


def _accumulate_grad(param: torch.nn.Parameter, grad: torch.Tensor) -> None:
    """What autograd's AccumulateGrad does: set ``.grad``, or add to it."""
    grad = grad.to(param.dtype)
    if param.grad is None:
        param.grad = grad
    else:
        param.grad.add_(grad)


def _dummy_wgrad(param: torch.nn.Parameter) -> Optional[torch.Tensor]:
    """Megatron's convention once the grad went to ``main_grad``: zeros if it asks, else None."""
    if hasattr(param, "grad_added_to_main_grad"):
        param.grad_added_to_main_grad = True
        return torch.zeros_like(param)
    return None
