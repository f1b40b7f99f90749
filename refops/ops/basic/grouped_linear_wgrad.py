"""``GroupedLinear``'s grads besides dgrad: weights (now or later), biases and bias scales.

Weight grads ``dW_g = dy_g^T x_g`` (``delay_wgrad_compute`` queues them).

The operands of one group are plain tensors or quantized ones (quantized
compute), exactly as the backward hands them over; the GEMM reads the usages it
needs. A group with no rows gets a zero grad. Three destinations:

* returned grads (one per weight parameter name; single grouped mode stacks
  them into ``(G, out, in)``);
* ``main_grad`` with ``accumulate_into_main_grad``: accumulated in place (or
  overwritten when the parameter has ``overwrite_main_grad``), and dummy grads
  are returned (Megatron's convention);
* the :class:`WgradStore` with ``delay_wgrad_compute``: the operands are queued
  and ``backward_dw()`` (:class:`DelayedWeightGrads`) computes *every* queued
  entry later, accumulating into ``.grad`` like autograd would (TE pops one
  entry and overwrites). Each entry keeps the GEMM numerics mode its backward ran under (its forward's),
  so a queued wgrad is computed as it would have been in that backward, wherever ``backward_dw()`` runs.

Bias grads ``db_g = sum_r dy[r]`` (``sum_r scales[r] dy[r]`` with ``scale_bias``)
and ``dscales[r] = dy[r] . b_g`` use the high-precision ``dy`` and fp32 sums.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Optional, Sequence

import torch

from ...kernels import current_backend
from ...kernels.gemm_numerics import GemmNumericsSetting, forward_numerics, numerics_in_force

__all__ = [
    "WgradStore",
    "DelayedWeightGrads",
    "weight_grads",
    "main_grad_targets",
    "run_delayed_wgrads",
    "bias_grads",
    "scales_grad",
]


class WgradStore:
    """Queued weight-grad operands ``(xs, dys, dtype, numerics)`` of backward passes, oldest first
    (``numerics``: the GEMM numerics mode in force where the entry was queued)."""

    def __init__(self) -> None:
        self._queue: collections.deque = collections.deque()

    def put(self, xs: Sequence[torch.Tensor], dys: Sequence[torch.Tensor], dtype: torch.dtype) -> None:
        self._queue.append((list(xs), list(dys), dtype, numerics_in_force()))

    def pop(self) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.dtype, GemmNumericsSetting]:
        return self._queue.popleft()

    def __len__(self) -> int:
        return len(self._queue)


class DelayedWeightGrads(torch.nn.Module):
    """Mixin for ``GroupedLinear``: ``delay_wgrad_compute`` and its public API (TE's names)."""

    _delay_wgrad_compute: bool = False

    def _init_delayed_wgrads(self, delay_wgrad_compute: bool) -> None:
        self._delay_wgrad_compute = delay_wgrad_compute
        self._wgrad_store = WgradStore()
        self.wgrad_accumulation_and_reduce_hooks: list[Callable[[], None]] = []

    def register_parameter(self, name: str, param: Optional[torch.nn.Parameter]) -> None:
        super().register_parameter(name, param)
        # Megatron's DDP must not reduce a weight whose grad arrives later, in backward_dw.
        if param is not None and name.startswith("weight") and self._delay_wgrad_compute:
            param.skip_backward_post_hook = True

    def need_backward_dw(self) -> bool:
        """Whether :meth:`backward_dw` must run to finish the weight grads."""
        return self._delay_wgrad_compute

    def register_wgrad_accumulation_and_reduce_hooks(self, hook: Callable[[], None]) -> None:
        """Run ``hook()`` after each :meth:`backward_dw` (where DDP would reduce the grads)."""
        self.wgrad_accumulation_and_reduce_hooks.append(hook)

    def backward_dw(self) -> None:
        """Run every queued weight-grad GEMM, oldest first (see :func:`run_delayed_wgrads`)."""
        if not len(self._wgrad_store):
            return
        run_delayed_wgrads(self, self._wgrad_store, current_backend())
        for hook in self.wgrad_accumulation_and_reduce_hooks:
            hook()


def weight_grads(
    op: Any, kernels: Any, xs: Sequence[torch.Tensor], dys: Sequence[torch.Tensor], dtype: torch.dtype
) -> dict[str, Optional[torch.Tensor]]:
    """``dW_g = dy_g^T x_g`` per weight parameter name of ``op``, or its accumulation into ``main_grad``."""
    names = [n for n in op._parameters if n.startswith("weight")]
    if op._accumulate_into_main_grad:
        for g, (target, accumulate) in enumerate(main_grad_targets(op)):
            kernels.gemm(dys[g], xs[g], trans_a=True, out_dtype=target.dtype, out=target, accumulate=accumulate)
        return {n: _dummy_wgrad(getattr(op, n)) for n in names}
    dws = [kernels.gemm(dy, x, trans_a=True, out_dtype=dtype) for x, dy in zip(xs, dys)]
    if op.single_grouped_weight:
        return {"weight": torch.stack(dws)}
    return dict(zip(names, dws))


def main_grad_targets(op: Any) -> list[tuple[torch.Tensor, bool]]:
    """Per group: ``(the (out, in) main_grad slice to write, whether to accumulate)``."""
    targets = []
    for param in op._weight_params():
        main_grad = getattr(param, "main_grad", None)
        if main_grad is None:
            raise RuntimeError(
                f"{type(op).__name__} is configured with accumulate_into_main_grad=True, "
                "but weight parameter does not have a valid main_grad attribute"
            )
        accumulate = not getattr(param, "overwrite_main_grad", False)
        slices = [main_grad[g] for g in range(op.num_groups)] if op.single_grouped_weight else [main_grad]
        targets.extend((s, accumulate) for s in slices)
    return targets


def run_delayed_wgrads(op: Any, store: WgradStore, kernels: Any) -> None:
    """Compute every queued weight grad of ``op``, oldest first, outside autograd.

    Each result is accumulated into ``.grad`` of the weight parameters (set if it
    is None), or into ``main_grad`` with ``accumulate_into_main_grad``.
    """
    with torch.no_grad():  # runs outside autograd's backward, like an optimizer step
        while len(store):
            xs, dys, dtype, numerics = store.pop()
            with forward_numerics(numerics):
                grads = weight_grads(op, kernels, xs, dys, dtype)
            if not op._accumulate_into_main_grad:
                for name, grad in grads.items():
                    _accumulate_grad(getattr(op, name), grad)


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


def bias_grads(op: Any, kernels: Any, dy: torch.Tensor, scales: Optional[torch.Tensor],
               rows: Sequence[slice]) -> dict[str, torch.Tensor]:
    """``db_g = sum_r dy[r]`` (or ``sum_r scales[r] dy[r]`` with scale_bias), in fp32, per bias name."""
    dbs = []
    for r in rows:
        dy_g = dy[r] if scales is None else dy[r].float() * scales[r].float()[:, None]
        dbs.append(kernels.dbias(dy_g).to(dy.dtype))
    if op.single_grouped_bias:
        return {"bias": torch.stack(dbs)}
    return {f"bias{g}": db for g, db in enumerate(dbs)}


def scales_grad(op: Any, kernels: Any, dy: torch.Tensor, biases: Sequence[torch.Tensor], rows: Sequence[slice],
                scales: torch.Tensor) -> torch.Tensor:
    """``dscales[r] = dy[r] . b_g`` (a matrix-vector GEMM per group, fp32 output, cast to the scales' dtype)."""
    dscales = torch.empty(scales.shape[0], dtype=torch.float32, device=dy.device)
    for g, r in enumerate(rows):
        column = biases[g].reshape(op.out_features, 1)
        kernels.gemm(dy[r], column, out_dtype=torch.float32, out=dscales[r].view(-1, 1))
    return dscales.to(scales.dtype)
