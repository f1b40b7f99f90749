"""One side of a module comparison: a module, the context it runs in, and the steps a training script asks of it.

The candidate, the reference and the reference's twins (:mod:`.twins`) are each a :class:`Side`. A scenario
(:mod:`.scenarios`) drives every side through the same steps, one step at a time on all sides, so that
what one side's step needs from another (the learning rate, computed once from the reference's grads) is
there when it runs.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Optional, Sequence

import torch

from ...quantization.dtensor import is_dtensor
from ...quantization.quantized_tensor import QuantizedTensor
from .distributed_models import assign_full_value, deepcopy_sharing_groups, full_value, reshard_after_no_grad_forward

__all__ = ["Side", "carry_parameter_attributes", "deepcopy_module", "same_layout_copy", "values_of"]


def values_of(t: torch.Tensor) -> torch.Tensor:
    """A tensor's high-precision values: a quantized tensor's dequantized ones (its primary, row-wise copy), a
    DTensor's full value (a collective)."""
    if is_dtensor(t):
        return full_value(t)
    if isinstance(t, QuantizedTensor):
        return t.dequantize()
    if type(t) not in (torch.Tensor, torch.nn.Parameter) and callable(getattr(t, "dequantize", None)):
        return t.dequantize()  # TransformerEngine's quantized tensors
    return t


class Side:
    """A module under test or a twin of the reference, run by a scenario.

    ``context`` builds the context every forward and backward runs in; ``prepare`` casts the
    scenario's inputs and output grads for this side (the float64 twin takes float64 ones).
    """

    def __init__(self, name: str, module: torch.nn.Module, context: Callable[[], ContextManager[Any]],
                 prepare: Callable[[torch.Tensor], torch.Tensor] = lambda t: t, *, optional: bool = False) -> None:
        self.name = name
        #: A twin is optional: when one of its steps raises, the script goes on without it (``failure`` says why).
        self.optional = optional
        self.failure = ""
        self.module = module
        self.context = context
        self.prepare = prepare
        #: Run on the module after each backward: the single-process twins of an FSDP2 reference reduce their
        #: parameter grads there as FSDP2 reduces the reference's (:mod:`.distributed_models`).
        self.after_backward: Optional[Callable[[torch.nn.Module], None]] = None
        self._pending: list[tuple[torch.Tensor, list[torch.Tensor]]] = []

    def clear_grads(self) -> None:
        """Every parameter's ``.grad`` set to None, a ``main_grad`` zeroed (and Megatron's "already added" flag
        lowered), as an optimizer's ``zero_grad`` does: a step starts from no accumulated gradient."""
        for p in self.module.parameters():
            p.grad = None
            if isinstance(getattr(p, "main_grad", None), torch.Tensor):
                p.main_grad.zero_()
            if hasattr(p, "grad_added_to_main_grad"):
                p.grad_added_to_main_grad = False

    def forward(self, inputs: Sequence[torch.Tensor], *, grad: bool = True) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The output of one forward on clones of ``inputs`` (kept for a later :meth:`backward`)."""
        xs = [self._input(x, grad) for x in inputs]
        with contextlib.ExitStack() as stack:
            if not grad:
                stack.enter_context(torch.no_grad())
            stack.enter_context(self.context())
            out = self.module(*xs)
        y = out[0] if isinstance(out, tuple) else out
        if grad:
            self._pending.append((y, xs))
        return y, xs

    def backward(self, dy: torch.Tensor, index: int = 0) -> list[Optional[torch.Tensor]]:
        """Backward of the ``index``-th pending forward with output grad ``dy``; its inputs' grads."""
        y, xs = self._pending[index]
        dy = self.prepare(dy).to(device=y.device, dtype=y.dtype)
        with self.context():
            y.backward(dy)
        if self.after_backward is not None:
            self.after_backward(self.module)
        return [x.grad for x in xs]

    def done(self) -> None:
        """Forget the pending forwards (their graphs were consumed)."""
        self._pending.clear()

    def eval_forward(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        """A forward in eval mode under ``torch.no_grad()``, the module's mode restored after it."""
        modes = [(m, m.training) for m in self.module.modules()]
        self.module.eval()
        try:
            y, _ = self.forward(inputs, grad=False)
            reshard_after_no_grad_forward(self.module)  # FSDP2 would otherwise sum the next grads (see there)
        finally:
            for m, training in modes:
                m.training = training
        return y.detach()

    def parameter_grads(self) -> dict[str, Optional[torch.Tensor]]:
        """``{"<param>": .grad}``, and ``{"<param>.main_grad": ...}`` where a parameter accumulates into one."""
        grads: dict[str, Optional[torch.Tensor]] = {}
        for name, p in self.module.named_parameters():
            grads[name] = full_value(p.grad) if is_dtensor(p.grad) else p.grad  # judged whole on every rank
            if isinstance(getattr(p, "main_grad", None), torch.Tensor):
                grads[f"{name}.main_grad"] = p.main_grad
        return grads

    @torch.no_grad()
    def sgd_step(self, rates: dict[str, float]) -> None:
        """``p <- p - rate * p.grad`` for every parameter with a grad (a quantized one re-quantized by its own
        copy_, as an optimizer's in-place update of a quantized weight is)."""
        for name, p in self.module.named_parameters():
            if p.grad is None or name not in rates:
                continue
            current = values_of(p)
            values = current.to(torch.float64 if p.dtype == torch.float64 else torch.float32)
            updated = (values - rates[name] * values_of(p.grad).to(values.dtype)).to(current.dtype)
            if is_dtensor(p):
                assign_full_value(p, updated, what=f"the SGD step of parameter {name!r}")
            else:
                p.copy_(updated)

    def _input(self, x: torch.Tensor, grad: bool) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            return x
        x = self.prepare(x.detach())
        if not x.is_floating_point():
            return x.clone()
        return same_layout_copy(x).requires_grad_(grad)


def same_layout_copy(x: torch.Tensor) -> torch.Tensor:
    """``x``'s values in fresh memory with ``x``'s strides and storage offset: a layout scenario's view stays the
    view it is (``clone()`` would make it contiguous), and no side can write into another's input."""
    extent = sum((size - 1) * stride for size, stride in zip(x.size(), x.stride()) if size > 0)
    backing = torch.zeros(x.storage_offset() + extent + 1, dtype=x.dtype, device=x.device)
    out = backing.as_strided(x.size(), x.stride(), x.storage_offset())
    out.copy_(x)
    return out


def deepcopy_module(module: torch.nn.Module, *, dtype: Optional[torch.dtype] = None) -> torch.nn.Module:
    """``copy.deepcopy(module)`` with what deepcopy drops from parameters put back: the attributes a user set on
    them (``main_grad``, Megatron's flags), ``main_grad`` as a fresh zero tensor (in ``dtype`` if given)."""
    twin = deepcopy_sharing_groups(module)  # a process group cannot be pickled: the copy shares it
    carry_parameter_attributes(module, twin, dtype=dtype)
    return twin


def carry_parameter_attributes(source: torch.nn.Module, twin: torch.nn.Module, *,
                               dtype: Optional[torch.dtype] = None) -> None:
    """Every attribute set on a parameter of ``source`` set on the twin's parameter of the same name."""
    targets = dict(twin.named_parameters())
    for name, p in source.named_parameters():
        q = targets.get(name)
        if q is None:
            continue
        for key, value in vars(p).items():
            if key.startswith("_") or key in vars(q):
                continue
            if isinstance(value, torch.Tensor):
                value = torch.zeros_like(value, dtype=dtype or value.dtype)
            setattr(q, key, value)
