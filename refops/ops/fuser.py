"""``OperationFuser``: runs a list of fusible ops as fused kernels, with a lifecycle that is never stale.

Every forward runs :meth:`OperationFuser.prepare_for_forward`, which is the
parameter lifecycle in order (the order TE PR #3327 established, plus what
refops adds):

1. first forward only: ``reset_recipe_state(recipe)`` on every basic op, so
   quantizers exist before anything needs them;
2. first forward only: ``pre_first_fuser_forward()`` on every *top-level* op
   (basic ops materialize meta parameters; containers then re-sync aliases);
3. every forward: re-sync container aliases and validate the parameter cache by
   identity (and dtype, device, ``requires_grad``); refresh it if anything changed;
4. every forward: choose ``first_op_requiring_backward`` from the *current*
   parameters and the inputs;
5. when anything above changed, or the recipe type / ``backward_override`` /
   amax-history length did: reset recipe state and re-apply the fusion passes.

Then the cached parameters are handed to autograd, so grads land on exactly the
objects ``named_parameters()`` reports.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import torch

from .. import trace
from .dtensor_parameters import check_fuser_parameters_unsharded
from ..quantization.state import (
    backward_update_callback,
    claim_first_module,
    get_autocast_recipe,
    register_delayed_state,
)
from .channels import resolve_channels
from .fuser_autograd import FuserAutogradFunction, PlanStep, plan_steps
from .op import BasicOperation, FusibleOperation, check_not_parametrized
from .torch_compile import run_fuser_eagerly

__all__ = [
    "OperationFuser",
    "register_forward_fusion",
    "register_backward_fusion",
    "register_forward_backward_fusion",
]

FusionFunction = Callable[..., list[FusibleOperation]]


class OperationFuser:
    """Groups ``ops`` (basic or fused) into fused operations and runs them.

    Attributes inspected by tests, with TE's names: ``_basic_ops``,
    ``_forward_ops`` / ``_backward_ops`` (lists of ``(op, [basic op indices])``),
    ``first_op_requiring_backward``, ``num_extra_inputs``,
    ``_basic_op_extra_input_sources``.
    """

    #: Fusion functions ``f(ops, *, recipe) -> ops``, applied in order; shared by all fusers.
    forward_backward_fusion_functions: list[FusionFunction] = []
    forward_fusion_functions: list[FusionFunction] = []
    backward_fusion_functions: list[FusionFunction] = []

    def __init__(self, ops: Iterable[FusibleOperation]) -> None:
        self._ops: list[FusibleOperation] = list(ops)
        basic_ops: list[BasicOperation] = []
        for op in self._ops:
            if not isinstance(op, FusibleOperation):
                raise TypeError(f"OperationFuser accepts fusible operations only, got {type(op).__name__}")
            basic_ops.extend(op.basic_ops if op.is_fused_op else [op])
        self._basic_ops = basic_ops
        self._num_basic_ops = len(basic_ops)
        self._containers = [op for op in self._ops if op.is_fused_op]

        self._routing = resolve_channels(basic_ops)
        self.num_extra_inputs = self._routing.num_extra_inputs
        self._basic_op_extra_input_sources = self._routing.extra_input_sources
        for op in basic_ops:
            op._lock_extra_tensor_channels()

        self.recipe_type: Optional[type] = None  # None means "never prepared"
        self.first_op_requiring_backward = 0
        self.backward_override: Optional[str] = None
        self._last_amax_history_len = 0
        self._fusion_key: Optional[tuple] = None
        self._forward_ops: list[tuple[FusibleOperation, list[int]]] = []
        self._backward_ops: list[tuple[FusibleOperation, list[int]]] = []
        self._forward_steps: list[PlanStep] = []
        self._backward_steps: list[PlanStep] = []

        self._basic_op_params: list[list[torch.nn.Parameter]] = [[] for _ in basic_ops]
        self._basic_op_num_params: list[int] = [0] * len(basic_ops)
        self._flat_basic_op_params: list[torch.nn.Parameter] = []
        self._param_signature: Optional[tuple] = None

    # ------------------------------------------------------------ lifecycle
    @property
    def is_first_forward(self) -> bool:
        return self.recipe_type is None

    def _reset_recipe_state(self, recipe: Any) -> None:
        """Step 1. Invariant: every basic op's quantizers match ``recipe`` (none for None)."""
        for op in self._basic_ops:
            op.reset_recipe_state(recipe=recipe)
            trace.record("recipe_state", type(op).__name__, instance=op, recipe=trace.recipe_name(recipe))

    def _run_first_forward_hooks(self) -> None:
        """Step 2. Invariant: no parameter is on meta and container aliases are in sync.

        Runs on *top-level* ops so that a container (``Linear``) materializes its
        basic ops and then re-syncs its aliases; each basic op is visited once.
        Every op is checked first, so a failure leaves nothing half-materialized.
        """
        for op in self._ops:
            op._check_can_materialize()
        for op in self._ops:
            trace.record("first_forward_hook", type(op).__name__, instance=op)
            op.pre_first_fuser_forward()

    def _sync_container_aliases(self) -> None:
        """Step 3a. Invariant: every container's aliases are its basic ops' current parameters."""
        for op in self._containers:
            op._sync_parameters()

    def _refresh_parameter_cache(self) -> bool:
        """Step 3b. Invariant: the cache holds the current parameter objects. Returns whether it changed.

        The check is by identity, plus dtype, device, type and ``requires_grad``
        (fusion decisions depend on them): cheap, and it catches every
        replacement path, including direct writes to ``module._parameters``.
        """
        check_not_parametrized(self._basic_ops)  # a parametrization keeps the object: check every time
        params = [_own_parameters(op) for op in self._basic_ops]
        signature = tuple(
            (id(p), p.dtype, p.device, type(p), p.requires_grad) for op_params in params for p in op_params
        )
        if signature == self._param_signature:
            return False
        reason = "first forward" if self._param_signature is None else "parameters replaced or changed"
        self._basic_op_params = params
        self._basic_op_num_params = [len(p) for p in params]
        self._flat_basic_op_params = [p for op_params in params for p in op_params]
        self._param_signature = signature
        trace.record("cache_refresh", "OperationFuser", reason=reason, num_params=len(signature))
        return True

    def _select_first_op_requiring_backward(
        self, input_: torch.Tensor, basic_op_extra_inputs: list[list[Optional[torch.Tensor]]]
    ) -> int:
        """Step 4. The first basic op whose backward must run (N when none).

        Grad disabled: N. Input requires grad: 0. Else the first op with a
        parameter or a public extra input that requires grad.
        """
        n = self._num_basic_ops
        if not torch.is_grad_enabled():
            return n
        if input_.requires_grad:
            return 0
        for idx in range(n):
            tensors = list(self._basic_op_params[idx]) + [t for t in basic_op_extra_inputs[idx] if t is not None]
            if any(t.requires_grad for t in tensors):
                return idx
        return n

    def _apply_fusions(self, recipe: Any) -> None:
        """Step 5. Joint fusions, then forward-only and backward-only passes from the joint list."""
        joint = self._apply_fusion_functions(self.forward_backward_fusion_functions, self._basic_ops, recipe)
        forward = self._apply_fusion_functions(self.forward_fusion_functions, joint, recipe)
        backward = self._apply_fusion_functions(self.backward_fusion_functions, joint, recipe)
        self._forward_ops = self._map_to_basic_ops(forward)
        self._backward_ops = self._map_to_basic_ops(backward)
        self._forward_steps = plan_steps(self._forward_ops, self._basic_ops)
        self._backward_steps = plan_steps(self._backward_ops, self._basic_ops)
        trace.record(
            "fusion_plan",
            "OperationFuser",
            forward=[type(op).__name__ for op, _ in self._forward_ops],
            backward=[type(op).__name__ for op, _ in self._backward_ops],
        )

    @staticmethod
    def _apply_fusion_functions(
        functions: list[FusionFunction], ops: list[FusibleOperation], recipe: Any
    ) -> list[FusibleOperation]:
        for func in functions:
            ops = list(func(ops, recipe=recipe))
        return ops

    def _map_to_basic_ops(self, ops: list[FusibleOperation]) -> list[tuple[FusibleOperation, list[int]]]:
        """Annotate each op with the basic-op indices it covers; they must tile the basic ops in order."""
        mapped = []
        flat: list[BasicOperation] = []
        for op in ops:
            covered = list(op.basic_ops) if op.is_fused_op else [op]
            mapped.append((op, list(range(len(flat), len(flat) + len(covered)))))
            flat.extend(covered)
        if len(flat) != len(self._basic_ops) or any(a is not b for a, b in zip(flat, self._basic_ops)):
            raise RuntimeError(
                "Found mismatch after fusing operations "
                f"(basic_ops={[type(op).__name__ for op in self._basic_ops]}, "
                f"fused_ops={[type(op).__name__ for op in ops]})"
            )
        return mapped

    def prepare_for_forward(
        self, recipe: Any, input_: torch.Tensor, basic_op_extra_inputs: list[list[Optional[torch.Tensor]]]
    ) -> None:
        """The lifecycle, steps 1 to 5 (see the module docstring)."""
        check_fuser_parameters_unsharded(self._ops)  # per-op fully_shard: a refops error naming the fix
        first_forward = self.is_first_forward
        if first_forward:
            self._reset_recipe_state(recipe)
            self._run_first_forward_hooks()
        self._sync_container_aliases()
        params_changed = self._refresh_parameter_cache()
        first_op = self._select_first_op_requiring_backward(input_, basic_op_extra_inputs)
        trace.record("backward_selection", "OperationFuser", first_op_requiring_backward=first_op)
        history_len = getattr(recipe, "amax_history_len", 0) if _is_delayed(recipe) else 0
        # Beyond TE: any recipe option counts, not only its type (new options would otherwise be ignored).
        options = recipe._options_key() if recipe is not None else None
        key = (type(recipe), first_op, getattr(recipe, "backward_override", None), history_len, options)
        if not (first_forward or params_changed or key != self._fusion_key):
            return
        if not first_forward:
            self._reset_recipe_state(recipe)
        self.first_op_requiring_backward = first_op
        self.backward_override = key[2]
        self._last_amax_history_len = history_len
        self._apply_fusions(recipe)
        self._fusion_key = key
        self.recipe_type = type(recipe)

    # ---------------------------------------------------------------- running
    def _check_input(self, input_: Any) -> None:
        first = type(self._basic_ops[0]).__name__ if self._basic_ops else "OperationFuser"
        if not isinstance(input_, torch.Tensor):
            raise TypeError(f"{first}: expected the input to be a torch.Tensor, got {type(input_).__name__}")
        if input_.is_meta:
            raise ValueError(
                f"{first}: the input is on the meta device. Meta-built ops materialize their parameters "
                "at the first forward, which needs real data: pass a tensor on a real device"
            )
        if self._ops:
            self._ops[0].check_input(input_)  # before anything is materialized

    def _check_forward_kwargs(self, basic_op_kwargs: list[dict[str, Any]]) -> None:
        """Refuse a kwarg that its op does not accept, naming the op, before anything is materialized or run."""
        for op, kwargs in zip(self._basic_ops, basic_op_kwargs):
            unexpected = sorted(set(kwargs) - op.forward_kwargs)
            if unexpected:
                accepted = sorted(op.forward_kwargs) or "none"
                raise TypeError(f"{type(op).__name__}: unexpected forward kwargs {unexpected} (it accepts {accepted})")

    def __call__(
        self,
        input: torch.Tensor,
        *extra_inputs: torch.Tensor,
        basic_op_kwargs: Optional[list[dict[str, Any]]] = None,
    ) -> Any:
        if torch.compiler.is_compiling():  # Dynamo cannot trace a fuser: docs/te-ops.md#under-torchcompile
            return run_fuser_eagerly(self, input, *extra_inputs, basic_op_kwargs=basic_op_kwargs)
        if len(extra_inputs) != self.num_extra_inputs:
            raise ValueError(f"Expected {self.num_extra_inputs} extra inputs but got {len(extra_inputs)}")
        self._check_input(input)
        if basic_op_kwargs is None:
            basic_op_kwargs = [{} for _ in self._basic_ops]
        if len(basic_op_kwargs) != self._num_basic_ops:
            raise ValueError(f"Expected kwargs for {self._num_basic_ops} basic ops but got {len(basic_op_kwargs)}")
        if any(basic_op_kwargs):
            self._check_forward_kwargs(basic_op_kwargs)

        slots: list[list[Optional[torch.Tensor]]] = [[None] * op.num_extra_inputs for op in self._basic_ops]
        for (i, s), tensor in zip(self._routing.external_extra_input_slots, extra_inputs):
            slots[i][s] = tensor

        is_grad_enabled = torch.is_grad_enabled()
        recipe = get_autocast_recipe()
        self.prepare_for_forward(recipe, input, slots)
        if _is_delayed(recipe):
            self._note_delayed_states_in_use()
        for idx, op in enumerate(self._basic_ops):
            op.pre_fuser_forward(requires_grad=idx >= self.first_op_requiring_backward)

        args = (input, self, basic_op_kwargs, is_grad_enabled, *self._flat_basic_op_params, *extra_inputs)
        if is_grad_enabled:
            return FuserAutogradFunction.apply(*args)
        return FuserAutogradFunction.forward(None, *args)

    def _note_delayed_states_in_use(self) -> None:
        """Invariant: the next delayed-scaling updates reach the ops that run now, and no op that did not run.

        The set of states updated is then the program's, the same on every rank, which amax
        reduction (one collective per state) needs.
        """
        for op in self._basic_ops:
            for state in (op._recipe_states or {}).values():
                if state is not None:
                    register_delayed_state(state, state.mode)

    def _end_of_backward_hook(self) -> Optional[Callable[[], None]]:
        """What must run once this fuser's backward ends.

        The first fuser that runs forward inside an ``autocast`` (and needs
        backward) is the last to run backward: it runs the backward
        delayed-scaling update.
        """
        if self.first_op_requiring_backward < self._num_basic_ops and claim_first_module():
            return backward_update_callback()
        return None


def _own_parameters(op: BasicOperation) -> list[torch.nn.Parameter]:
    """``list(op.parameters())``, read straight from ``op._parameters`` when the op has no child modules.

    Same objects, same order, duplicates dropped, as ``parameters()`` gives; reading
    the dict skips the generator machinery, which dominated the per-forward check.
    """
    if op._modules:
        return list(op.parameters())
    return list(dict.fromkeys(p for p in op._parameters.values() if p is not None))


def _is_delayed(recipe: Any) -> bool:
    return recipe is not None and getattr(recipe, "delayed", lambda: False)()


FusibleOperation._standalone_fuser = OperationFuser


def register_forward_backward_fusion(func: FusionFunction, prepend: bool = False) -> None:
    """Register a joint fusion ``func(ops, *, recipe) -> ops`` (both passes see its result)."""
    _register(OperationFuser.forward_backward_fusion_functions, func, prepend)


def register_forward_fusion(func: FusionFunction, prepend: bool = False) -> None:
    """Register a forward-only fusion function."""
    _register(OperationFuser.forward_fusion_functions, func, prepend)


def register_backward_fusion(func: FusionFunction, prepend: bool = False) -> None:
    """Register a backward-only fusion function (it receives ops in forward order)."""
    _register(OperationFuser.backward_fusion_functions, func, prepend)


def _register(registry: list[FusionFunction], func: FusionFunction, prepend: bool) -> None:
    if prepend:
        registry.insert(0, func)
    else:
        registry.append(func)

