"""The operation classes: ``OperationContext``, ``FusibleOperation``, ``BasicOperation``, ``FusedOperation``.

A *basic op* owns parameters and quantization state and knows its own forward
and backward. A *fused op* runs several basic ops as one and owns nothing. The
:class:`~refops.ops.fuser.OperationFuser` drives both through the hooks below,
whose names and signatures are TransformerEngine's.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Iterable, NoReturn, Optional

import torch

from .dtensor_parameters import agreed_recipe_state
from .extra_state import extra_state_bytes, load_extra_state
from .parameter_lifecycle import ParameterLifecycle
from .quantized_checkpoint import QuantizedCheckpoint
from .recipe_hooks import QuantizationHooks

__all__ = [
    "OperationContext",
    "FusibleOperation",
    "BasicOperation",
    "FuserOnlyOperation",
    "FusedOperation",
    "check_not_parametrized",
]


@dataclasses.dataclass
class OperationContext:
    """What one basic op keeps from its forward for its backward (one per op, per forward)."""

    saved_tensors: Optional[tuple[Optional[torch.Tensor], ...]] = None
    to_save: Optional[tuple[Optional[torch.Tensor], ...]] = None
    _saved_tensors_range: Optional[tuple[int, int]] = None
    requires_grad: bool = True

    def save_for_backward(self, *tensors: Optional[torch.Tensor]) -> None:
        """Register tensors for backward; the fuser hands them back as ``saved_tensors``."""
        self.to_save = tensors


class FusibleOperation(torch.nn.Module, metaclass=abc.ABCMeta):
    """Anything the fuser can run: a basic op or a fused op."""

    #: The fuser class used when an op is called directly (``op(x)`` builds a fresh
    #: fuser around it). Set by :mod:`refops.ops.fuser`, which depends on this module.
    _standalone_fuser: Any = None

    @property
    @abc.abstractmethod
    def is_fused_op(self) -> bool:
        """Whether this op groups several basic ops."""

    def pre_first_fuser_forward(self) -> None:
        """Called once, on the first forward of a fuser, before parameters are cached."""

    def _check_can_materialize(self) -> None:
        """Raise (before anything is materialized) if this op's parameters could not be materialized."""

    def check_input(self, input_: torch.Tensor) -> None:
        """Raise a clear error if ``input_`` cannot be this op's input (checked before materialization)."""

    def pre_fuser_forward(self, *, requires_grad: bool) -> None:
        """Called on every forward, after fusion, with whether this op needs backward."""

    def get_input_quantizer(self) -> Any:
        """The quantizer a previous op may use to emit its output already quantized."""
        return None

    def get_grad_output_quantizer(self) -> Any:
        """The quantizer a next op may use to emit its grad-input already quantized."""
        return None

    def fuser_forward(
        self,
        basic_op_ctxs: list[OperationContext],
        input_: torch.Tensor,
        *,
        basic_op_extra_inputs: list[tuple[torch.Tensor, ...]],
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
        basic_op_kwargs: list[dict[str, Any]],
    ) -> tuple[torch.Tensor, Iterable[Iterable[torch.Tensor]]]:
        """Forward of the covered basic ops: ``(output, extra outputs per basic op)``."""
        raise NotImplementedError(f"{type(self).__name__} does not implement fuser_forward")

    def fuser_backward(
        self,
        basic_op_ctxs: list[OperationContext],
        grad_output: torch.Tensor,
        *,
        basic_op_grad_extra_outputs: list[tuple[torch.Tensor, ...]],
    ) -> tuple[
        torch.Tensor,
        Iterable[Iterable[Optional[torch.Tensor]]],
        Iterable[Iterable[Optional[torch.Tensor]]],
    ]:
        """Backward: ``(grad_input, param grads per basic op, extra-input grads per basic op)``."""
        raise NotImplementedError(f"{type(self).__name__} does not implement fuser_backward")

    def _sync_parameters(self) -> None:
        """Containers re-point their aliases at their basic ops' parameters (no-op by default)."""


class BasicOperation(QuantizedCheckpoint, QuantizationHooks, ParameterLifecycle, FusibleOperation):
    """A single operation that owns its parameters and quantization state.

    Subclasses implement :meth:`op_forward` and :meth:`op_backward`, or override
    :meth:`fuser_forward`/:meth:`fuser_backward` when they have extra inputs or
    outputs. Param-owning subclasses also implement ``init_parameter`` and end
    their constructor with ``self._initialize_or_defer(device)``.
    """

    num_extra_inputs: int = 0
    num_extra_outputs: int = 0
    #: The keyword arguments its forward accepts (``op(x, **kwargs)``, the fuser's ``basic_op_kwargs``); the
    #: fuser refuses any other before anything runs, so the ops themselves need not check.
    forward_kwargs: frozenset[str] = frozenset()

    def __init__(self) -> None:
        super().__init__()
        self._extra_input_channels: list[Optional[str]] = [None] * self.num_extra_inputs
        self._extra_output_channels: list[Optional[str]] = [None] * self.num_extra_outputs
        self._extra_output_to_caller: list[bool] = [True] * self.num_extra_outputs
        self._extra_tensor_channels_locked = False
        self._recipe_states = None
        self._quantizers = None

    @property
    def is_fused_op(self) -> bool:
        return False

    # ------------------------------------------------------------- lifecycle
    def pre_first_fuser_forward(self) -> None:
        """Materialize parameters still on meta (see :mod:`refops.ops.parameter_lifecycle`)."""
        self.materialize_meta_parameters()

    # ---------------------------------------------------------------- compute
    @abc.abstractmethod
    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Forward of this op alone."""

    @abc.abstractmethod
    def op_backward(
        self, ctx: OperationContext, grad_output: torch.Tensor
    ) -> tuple[Optional[torch.Tensor], Iterable[Optional[torch.Tensor]]]:
        """Backward: ``(grad_input, grads of self.parameters() in order)``."""

    def fuser_forward(
        self,
        basic_op_ctxs,
        input_,
        *,
        basic_op_extra_inputs,
        prev_op_grad_output_quantizer,
        next_op_input_quantizer,
        basic_op_kwargs,
    ):
        if self.num_extra_inputs > 0 or self.num_extra_outputs > 0:
            raise RuntimeError(
                f"{type(self).__name__} has extra tensor inputs or outputs, "
                "so it should override `fuser_forward` instead of `op_forward`"
            )
        output = self.op_forward(
            basic_op_ctxs[0],
            input_,
            prev_op_grad_output_quantizer=prev_op_grad_output_quantizer,
            next_op_input_quantizer=next_op_input_quantizer,
            **basic_op_kwargs[0],
        )
        return output, [()]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        if self.num_extra_inputs > 0 or self.num_extra_outputs > 0:
            raise RuntimeError(
                f"{type(self).__name__} has extra tensor inputs or outputs, "
                "so it should override `fuser_backward` instead of `op_backward`"
            )
        grad_input, grad_params = self.op_backward(basic_op_ctxs[0], grad_output)
        return grad_input, [grad_params], [()]

    def forward(self, input: torch.Tensor, *extra_inputs: torch.Tensor, **kwargs: Any) -> Any:
        """Run this op alone through a fresh :class:`OperationFuser`."""
        return self._standalone_fuser([self])(input, *extra_inputs, basic_op_kwargs=[kwargs])

    # ------------------------------------------------------- extra channels
    def set_extra_input_channel(self, index: int, channel: Optional[str]) -> None:
        """Bind extra-input slot ``index`` to the output of an earlier op named ``channel``.

        A bound slot is no longer a public argument; ``None`` unbinds it.
        """
        self._check_channel_change(index, self.num_extra_inputs, "input", channel)
        self._extra_input_channels[index] = channel

    def set_extra_output_channel(
        self, index: int, channel: Optional[str], *, output_to_caller: bool = True
    ) -> None:
        """Name extra-output slot ``index`` so later ops can consume it.

        ``output_to_caller=False`` hides it from the caller. Unbinding (``None``)
        makes the output public again.
        """
        self._check_channel_change(index, self.num_extra_outputs, "output", channel)
        if not isinstance(output_to_caller, bool):
            raise TypeError(f"{type(self).__name__}: output_to_caller must be a bool, got {output_to_caller!r}")
        self._extra_output_channels[index] = channel
        self._extra_output_to_caller[index] = True if channel is None else output_to_caller

    def _check_channel_change(self, index: int, count: int, kind: str, channel: Optional[str]) -> None:
        name = type(self).__name__
        if self._extra_tensor_channels_locked:
            raise RuntimeError(
                f"{name} has already captured its channel routing (a fuser was built for it); "
                "set extra tensor channels before the first forward"
            )
        if not 0 <= index < count:
            raise IndexError(f"{name}: extra {kind} index {index} is out of range (the op has {count})")
        if channel is not None and (not isinstance(channel, str) or not channel):
            raise ValueError(f"{name}: an extra {kind} channel name must be a non-empty string, got {channel!r}")

    def _lock_extra_tensor_channels(self) -> None:
        self._extra_tensor_channels_locked = True

    # ------------------------------------------------------------ checkpoints
    def _extra_state_dict(self) -> dict[str, Any]:
        """The op's non-parameter state to checkpoint: its recipe state (delayed scaling only)."""
        return self._recipe_extra_state()

    def _load_extra_state_dict(self, state: dict[str, Any]) -> None:
        self._load_recipe_extra_state(state)

    def get_extra_state(self) -> bytes:
        """Recipe state as bytes, never pickled (see :mod:`refops.ops.extra_state`); the same on every rank for an
        FSDP2-sharded op (:func:`refops.ops.dtensor_parameters.agreed_recipe_state`).

        Bytes, where TE returns a uint8 tensor: a distributed checkpoint loads a tensor in place, so only into an
        op that already holds a state of the saved size, and bytes by replacement, so into a freshly built op too
        (``docs/distributed.md#extra-state-in-distributed-checkpoints``)."""
        return extra_state_bytes(agreed_recipe_state(self, self._extra_state_dict()))

    def set_extra_state(self, state: Any) -> None:
        """Inverse of :meth:`get_extra_state`; idempotent, all or nothing; None (or DCP's placeholder for a
        missing key) means no state, any other non-tensor is a ``TypeError`` naming the op."""
        load_extra_state(self, state)


def check_not_parametrized(basic_ops: Iterable[BasicOperation]) -> None:
    """Refuse ``torch.nn.utils.parametrize`` on a basic op's parameters, naming the op and the parameters.

    The fuser hands parameters to autograd itself and the ops read them inside
    one autograd function, so a parametrization's own graph would be bypassed:
    the gradient would never reach the original parameter. Said plainly instead.
    """
    for op in basic_ops:
        # torch.nn.utils.parametrize registers its ModuleDict as the child "parametrizations".
        parametrized = op._modules.get("parametrizations")
        if parametrized:
            raise TypeError(
                f"{type(op).__name__}: torch.nn.utils.parametrize on {sorted(parametrized)} is not supported by "
                "refops ops (gradients would not reach the original parameter). Remove the parametrization "
                "(torch.nn.utils.parametrize.remove_parametrizations) or compute the weight outside the op"
            )


class FuserOnlyOperation(BasicOperation):
    """A basic op with extra tensor inputs or outputs: it runs only through :meth:`fuser_forward` and
    :meth:`fuser_backward`, whose arguments carry the extra tensors; the per-op hooks cannot, so they raise."""

    def op_forward(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._raise_for_op_hook("forward")

    def op_backward(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._raise_for_op_hook("backward")

    def _raise_for_op_hook(self, hook: str) -> NoReturn:
        raise RuntimeError(
            f"{type(self).__name__} has {self.num_extra_inputs} extra tensor inputs and {self.num_extra_outputs} "
            f"extra tensor outputs, so it implements fuser_{hook} instead of op_{hook}"
        )


class FusedOperation(FusibleOperation):
    """Several basic ops run as one. Holds no state: it reads its ``basic_ops``.

    ``Linear`` is the one user-facing container; every other fused op is built by
    a fusion function.
    """

    def __init__(self, basic_ops: Iterable[BasicOperation]) -> None:
        super().__init__()
        basic_ops = list(basic_ops)
        if not basic_ops:
            raise ValueError(f"{type(self).__name__} needs at least one basic operation")
        for op in basic_ops:
            if not isinstance(op, BasicOperation):
                raise TypeError(f"{type(self).__name__}: expected BasicOperation, got {type(op).__name__}")
        self.basic_ops = torch.nn.ModuleList(basic_ops)

    @property
    def is_fused_op(self) -> bool:
        return True

    def get_input_quantizer(self) -> Any:
        return self.basic_ops[0].get_input_quantizer()

    def get_grad_output_quantizer(self) -> Any:
        return self.basic_ops[-1].get_grad_output_quantizer()

    def _check_can_materialize(self) -> None:
        for op in self.basic_ops:
            op._check_can_materialize()

    def check_input(self, input_: torch.Tensor) -> None:
        self.basic_ops[0].check_input(input_)

    def pre_first_fuser_forward(self) -> None:
        """Materialize the basic ops, then re-sync any aliases."""
        for op in self.basic_ops:
            op.pre_first_fuser_forward()
        self._sync_parameters()

    def pre_fuser_forward(self, *, requires_grad: bool) -> None:
        for op in self.basic_ops:
            op.pre_fuser_forward(requires_grad=requires_grad)

    def reset_parameters(self) -> None:
        """Re-initialize every basic op, then re-sync any aliases."""
        for op in self.basic_ops:
            op.reset_parameters()
        self._sync_parameters()

    def forward(
        self,
        input: torch.Tensor,
        *extra_inputs: torch.Tensor,
        basic_op_kwargs: Optional[list[dict[str, Any]]] = None,
    ) -> Any:
        """Run this op alone through a fresh :class:`OperationFuser`."""
        if basic_op_kwargs is None:
            basic_op_kwargs = [{} for _ in self.basic_ops]
        return self._standalone_fuser([self])(input, *extra_inputs, basic_op_kwargs=basic_op_kwargs)
