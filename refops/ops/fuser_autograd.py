"""The autograd function that runs a fuser's forward ops and, in reverse, its backward ops.

The fuser's cached parameters are passed as autograd inputs: that is how
autograd knows which ``Parameter`` objects receive the grads the ops return.
The fuser guarantees they are the current objects (see ``OperationFuser``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Optional

import torch
from torch.autograd.function import once_differentiable

from .. import trace
from ..kernels import current_backend, use_backend
from ..kernels.gemm_numerics import forward_numerics, numerics_in_force
from .op import OperationContext

if TYPE_CHECKING:
    from .fuser import OperationFuser
    from .op import BasicOperation, FusibleOperation

__all__ = ["FuserAutogradFunction", "PlanStep", "plan_steps"]


class PlanStep(NamedTuple):
    """One op of a fusion plan (forward or backward), with what running it needs that does not change between passes."""

    op: "FusibleOperation"
    basic_op_indices: tuple[int, ...]
    covered: frozenset[int]
    prev_op: Optional["BasicOperation"]  # gives the grad-output quantizer the op's dgrad may emit into
    next_op: Optional["BasicOperation"]  # gives the input quantizer the op's output may be emitted into
    has_extra_tensors: bool  # whether a covered basic op has extra inputs or outputs to route


def plan_steps(
    ops: list[tuple["FusibleOperation", list[int]]], basic_ops: list["BasicOperation"]
) -> list[PlanStep]:
    """A fusion plan's ``(op, basic op indices)`` list as :class:`PlanStep`; rebuilt whenever the plan is."""
    n = len(basic_ops)
    return [
        PlanStep(
            op=op,
            basic_op_indices=tuple(idxs),
            covered=frozenset(idxs),
            prev_op=basic_ops[idxs[0] - 1] if idxs[0] > 0 else None,
            next_op=basic_ops[idxs[-1] + 1] if idxs[-1] + 1 < n else None,
            has_extra_tensors=any(basic_ops[i].num_extra_inputs or basic_ops[i].num_extra_outputs for i in idxs),
        )
        for op, idxs in ops
    ]


def _run_forward_ops(
    fuser: "OperationFuser",
    ctxs: list[OperationContext],
    input_: torch.Tensor,
    extra_inputs: tuple[torch.Tensor, ...],
    basic_op_kwargs: list[dict[str, Any]],
    mark_outputs_differentiable: bool,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Run every forward op in order; returns the output and the public extra outputs."""
    basic_ops = fuser._basic_ops
    routing = fuser._routing
    first = fuser.first_op_requiring_backward
    extra_in: list[list[Optional[torch.Tensor]]] = [[None] * op.num_extra_inputs for op in basic_ops]
    for (i, s), tensor in zip(routing.external_extra_input_slots, extra_inputs):
        extra_in[i][s] = tensor
    extra_out: list[list[Optional[torch.Tensor]]] = [[None] * op.num_extra_outputs for op in basic_ops]

    x = input_
    for step in fuser._forward_steps:
        op, idxs, covered = step.op, step.basic_op_indices, step.covered
        op_ctxs = [ctxs[i] for i in idxs]
        for i, op_ctx in zip(idxs, op_ctxs):
            op_ctx.requires_grad = i >= first
        if step.has_extra_tensors:
            for i in idxs:
                for s, source in enumerate(routing.extra_input_sources[i]):
                    if source is not None and source[0] not in covered:
                        extra_in[i][s] = extra_out[source[0]][source[1]]
        # The grad-input goes to the previous op only if that op runs backward: one that needs neither
        # dgrad nor wgrad (frozen, its input without grad) gets no quantizer, so nothing is quantized for it.
        prev_runs_backward = step.prev_op is not None and idxs[0] - 1 >= first
        prev_q = step.prev_op.get_grad_output_quantizer() if prev_runs_backward else None
        next_q = step.next_op.get_input_quantizer() if step.next_op is not None else None
        x, outputs = op.fuser_forward(
            op_ctxs,
            x,
            basic_op_extra_inputs=[tuple(extra_in[i]) for i in idxs],
            prev_op_grad_output_quantizer=prev_q,
            next_op_input_quantizer=next_q,
            basic_op_kwargs=[basic_op_kwargs[i] for i in idxs],
        )
        if trace.is_tracing():
            trace.record("forward_op", type(op).__name__, instance=op, basic_ops=list(idxs))
        outputs = [tuple(o) for o in outputs]
        if len(outputs) != len(idxs):
            raise RuntimeError(
                f"{type(op).__name__} returned extra outputs for {len(outputs)} basic ops, expected {len(idxs)}"
            )
        for i, produced in zip(idxs, outputs):
            if not produced and not basic_ops[i].num_extra_outputs:
                continue  # no extra outputs declared or produced: nothing to check or store
            _store_extra_outputs(fuser, op, i, covered, produced, extra_out)
            if mark_outputs_differentiable and i >= first:
                for t in produced:
                    # A fresh channel tensor must look differentiable to its consumer.
                    if t is not None and t.is_floating_point() and t.is_leaf and not t.requires_grad:
                        t.requires_grad_(True)
    public = [extra_out[i][s] for i, s in routing.public_extra_output_slots]
    return x, public


def _store_extra_outputs(fuser, op, i, covered, produced, extra_out) -> None:
    basic_op = fuser._basic_ops[i]
    if len(produced) != basic_op.num_extra_outputs:
        raise RuntimeError(
            f"{type(op).__name__} returned {len(produced)} extra outputs for basic op {i} "
            f"({type(basic_op).__name__}), which declares {basic_op.num_extra_outputs}"
        )
    for s, tensor in enumerate(produced):
        if tensor is None:
            if basic_op._extra_output_to_caller[s]:
                raise RuntimeError(
                    f"extra output {s} of basic op {i} ({type(basic_op).__name__}) is public, "
                    f"but {type(op).__name__} returned None"
                )
            outside = [c for c in fuser._routing.extra_output_consumers[i][s] if c[0] not in covered]
            if outside:
                raise RuntimeError(
                    f"extra output {s} of basic op {i} ({type(basic_op).__name__}) is required by an "
                    f"operation outside its forward fusion ({type(op).__name__}), which returned None"
                )
        extra_out[i][s] = tensor


class FuserAutogradFunction(torch.autograd.Function):
    """``apply(input, fuser, basic_op_kwargs, is_grad_enabled, *params, *extra_inputs)``."""

    @staticmethod
    def forward(ctx, input_, fuser, basic_op_kwargs, is_grad_enabled, *params_and_extra_inputs):
        num_params = len(fuser._flat_basic_op_params)
        extra_inputs = params_and_extra_inputs[num_params:]
        ctxs = [OperationContext() for _ in fuser._basic_ops]
        y, public_extra = _run_forward_ops(
            fuser, ctxs, input_, extra_inputs, basic_op_kwargs, mark_outputs_differentiable=ctx is not None
        )
        if ctx is not None:
            to_save: list[Optional[torch.Tensor]] = []
            for op_ctx in ctxs:
                start = len(to_save)
                to_save.extend(op_ctx.to_save or ())
                op_ctx._saved_tensors_range = (start, len(to_save))
                op_ctx.to_save = None
            ctx.save_for_backward(*to_save)
            ctx.fuser = fuser
            ctx.basic_op_ctxs = ctxs
            ctx.backward_steps = fuser._backward_steps
            ctx.basic_op_num_params = list(fuser._basic_op_num_params)
            ctx.kernel_backend = current_backend()
            # The backward's GEMMs (dgrad, wgrad) belong to the forward: they run under its GEMM numerics, as
            # under its backend and recipe, wherever backward() is called
            # (docs/tensor-cores.md#the-mode-is-captured-with-the-forward).
            ctx.gemm_numerics = numerics_in_force()
            ctx.backward_hook = fuser._end_of_backward_hook()
        if public_extra:
            return (y, *public_extra)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output, *grad_extra_outputs):
        with use_backend(ctx.kernel_backend), forward_numerics(ctx.gemm_numerics):
            return _run_backward_ops(ctx, grad_output, grad_extra_outputs)


def _run_backward_ops(ctx, grad_output, grad_extra_outputs):
    fuser: "OperationFuser" = ctx.fuser
    routing = fuser._routing
    basic_ops = fuser._basic_ops
    ctxs: list[OperationContext] = ctx.basic_op_ctxs
    saved = ctx.saved_tensors
    for op_ctx in ctxs:
        start, stop = op_ctx._saved_tensors_range
        op_ctx.saved_tensors = saved[start:stop]

    if len(grad_extra_outputs) != len(routing.public_extra_output_slots):
        raise ValueError(
            f"expected grads for {len(routing.public_extra_output_slots)} extra outputs, got {len(grad_extra_outputs)}"
        )
    grad_extra_out: list[list[Optional[torch.Tensor]]] = [[None] * op.num_extra_outputs for op in basic_ops]
    for (i, s), g in zip(routing.public_extra_output_slots, grad_extra_outputs):
        grad_extra_out[i][s] = g

    n = len(basic_ops)
    grad_params: list[Any] = [None] * n
    grad_extra_in: list[Any] = [None] * n
    channel_grads: dict[tuple[int, int], torch.Tensor] = {}
    dx = grad_output
    for step in reversed(ctx.backward_steps):
        op, idxs, covered = step.op, step.basic_op_indices, step.covered
        op_ctxs = [ctxs[i] for i in idxs]
        if not any(op_ctx.requires_grad for op_ctx in op_ctxs):
            dx = None
            break
        if step.has_extra_tensors:
            for i in idxs:
                for s in range(basic_ops[i].num_extra_outputs):
                    internal = channel_grads.pop((i, s), None)
                    if internal is not None:
                        given = grad_extra_out[i][s]
                        grad_extra_out[i][s] = internal if given is None else given + internal
        dx, op_grad_params, op_grad_extra = op.fuser_backward(
            op_ctxs,
            dx,
            basic_op_grad_extra_outputs=[tuple(grad_extra_out[i]) for i in idxs],
        )
        if trace.is_tracing():
            trace.record("backward_op", type(op).__name__, instance=op, basic_ops=list(idxs))
        for i, grads in zip(idxs, op_grad_params):
            grad_params[i] = grads
        for i, grads in zip(idxs, op_grad_extra):
            grads = tuple(grads)
            grad_extra_in[i] = grads
            if not step.has_extra_tensors:
                continue
            for s, source in enumerate(routing.extra_input_sources[i]):
                if source is None or source[0] in covered or not grads or grads[s] is None:
                    continue
                previous = channel_grads.get(source)
                # The producer may accumulate into its channel grad in place (MakeExtraOutput
                # in_place), and ops may return one tensor as several grads: it gets its own copy.
                channel_grads[source] = grads[s].clone() if previous is None else previous + grads[s]
        for op_ctx in op_ctxs:
            op_ctx.saved_tensors = None

    flat_grad_params: list[Optional[torch.Tensor]] = []
    for i, count in enumerate(ctx.basic_op_num_params):
        grads = grad_params[i]
        if grads is None:
            flat_grad_params.extend([None] * count)
            continue
        grads = list(grads)
        if len(grads) != count:
            raise RuntimeError(f"Expected op {i} to generate {count} param grads, but got {len(grads)}")
        flat_grad_params.extend(grads)

    flat_grad_extra: list[Optional[torch.Tensor]] = []
    for i, s in routing.external_extra_input_slots:
        grads = grad_extra_in[i]
        if grads is None or len(grads) == 0:
            flat_grad_extra.append(None)
            continue
        if len(grads) != basic_ops[i].num_extra_inputs:
            raise RuntimeError(
                f"Expected op {i} to generate {basic_ops[i].num_extra_inputs} extra-input grads, got {len(grads)}"
            )
        flat_grad_extra.append(grads[s])

    if ctx.backward_hook is not None:
        ctx.backward_hook()
    return (dx, None, None, None, *flat_grad_params, *flat_grad_extra)
