"""``Linear``: the user-facing container ``BasicLinear`` + ``Bias`` with ``weight`` / ``bias`` aliases."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Optional

import torch

from .. import trace
from .basic.all_reduce import AllReduce
from .basic.basic_linear import BasicLinear
from .basic.basic_linear_tp import canonicalize_tensor_parallelism
from .basic.bias import Bias
from .basic.reduce_scatter import ReduceScatter
from .op import FusedOperation
from .sizes import check_size

__all__ = ["Linear"]

_ALIASES = ("weight", "bias")


class Linear(FusedOperation):
    """``y = x W^T + b`` as a fused op of :class:`BasicLinear` and :class:`Bias`.

    ``linear.weight`` and ``linear.bias`` are the *same objects* as
    ``basic_ops[_linear_idx].weight`` and ``basic_ops[_bias_idx].bias``, always:
    after materialization, ``reset_parameters``, assignment on either side,
    ``load_state_dict`` (``assign=True`` too), ``to_empty``, ``.to()`` and
    ``copy.deepcopy``. ``parameters()`` yields each once; ``state_dict()`` holds
    only the basic ops' entries (TE's layout), and loading also accepts plain
    ``weight``/``bias`` keys.

    Args:
        in_features, out_features: sizes of the last dim of input and output.
        bias: add a learnable bias (zeros at init).
        device: where parameters live; ``"meta"`` defers allocation to the first forward.
        dtype: parameter dtype (fp32, fp16 or bf16; default: torch's default dtype).
        tensor_parallel_mode, tensor_parallel_group, sequence_parallel: tensor
            parallelism, composed as in TE: "column" is ``BasicLinear`` (column TP)
            + ``Bias(out / W)``; "row" is ``BasicLinear(in / W, out)`` + a per-rank
            ``Bias(out)`` added *before* the reduction (the effective bias is the
            sum of the ranks' biases) + ``ReduceScatter`` (sequence parallel) or
            ``AllReduce``. ``weight`` and ``bias`` are this rank's shards.
        rng_state_tracker_function: returns an object whose ``fork()`` context is used
            while drawing the weight's initial values.
        accumulate_into_main_grad: accumulate wgrad into ``weight.main_grad``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool = True,
        device: Optional[torch.device | str] = None,
        dtype: Optional[torch.dtype] = None,
        tensor_parallel_mode: Optional[str] = None,
        tensor_parallel_group: Any = None,
        sequence_parallel: bool = False,
        rng_state_tracker_function: Optional[Callable[[], Any]] = None,
        accumulate_into_main_grad: bool = False,
    ) -> None:
        in_features = check_size("Linear", "in_features", in_features)
        out_features = check_size("Linear", "out_features", out_features)
        tp = canonicalize_tensor_parallelism(
            "Linear", mode=tensor_parallel_mode, group=tensor_parallel_group, sequence_parallel=sequence_parallel,
            in_features=in_features, out_features=out_features,
        )
        linear_tp: dict[str, Any] = dict(
            tensor_parallel_mode=tp.mode, tensor_parallel_group=tp.group, sequence_parallel=tp.sequence_parallel
        )
        bias_size, reduction = out_features, []
        if tp.mode == "row":
            # The linear computes this rank's partial product; the reduction after the bias sums them.
            linear_tp = {}
            bias_size = out_features * tp.size
            reduction = [ReduceScatter(tp.group) if tp.sequence_parallel else AllReduce(tp.group)]
        linear = BasicLinear(
            tp.local_in_features if tp.mode == "row" else in_features,
            out_features,
            device=device,
            dtype=dtype,
            rng_state_tracker_function=rng_state_tracker_function,
            accumulate_into_main_grad=accumulate_into_main_grad,
            **linear_tp,
        )
        ops = [linear]
        if bias:
            ops.append(Bias(bias_size, device=device, dtype=dtype, tensor_parallel=tp.mode is not None,
                            tensor_parallel_group=tp.group))
        super().__init__(ops + reduction)
        self.tensor_parallel_mode = tp.mode
        self.tensor_parallel_group = tp.group
        self.tensor_parallel_size = tp.size
        self.sequence_parallel = tp.sequence_parallel
        self.in_features = in_features
        self.out_features = out_features
        self._linear_idx = 0
        self._bias_idx: Optional[int] = 1 if bias else None
        for op in self.basic_ops:
            op._add_alias_owner(self)
        self._sync_parameters()

    # ----------------------------------------------------------------- aliases
    def _alias_sources(self) -> dict[str, Optional[torch.nn.Parameter]]:
        weight = self.basic_ops[self._linear_idx]._parameters.get("weight")
        bias = None if self._bias_idx is None else self.basic_ops[self._bias_idx]._parameters.get("bias")
        return {"weight": weight, "bias": bias}

    def _sync_parameters(self) -> None:
        """Invariant: ``self.weight is basic_ops[_linear_idx].weight`` (and likewise bias)."""
        for name, source in self._alias_sources().items():
            if name not in self._parameters or self._parameters[name] is not source:
                torch.nn.Module.register_parameter(self, name, source)
                trace.record("alias_sync", f"Linear.{name}", instance=self,
                             target=f"basic_ops.{self._op_index(name)}.{name}")

    def _op_index(self, name: str) -> Optional[int]:
        return self._linear_idx if name == "weight" else self._bias_idx

    def register_parameter(self, name: str, param: Optional[torch.nn.Parameter]) -> None:
        """Assigning ``weight``/``bias`` on the container assigns it on the owning basic op."""
        if name not in _ALIASES:
            super().register_parameter(name, param)
            return
        if name == "bias" and self._bias_idx is None:
            if param is not None:
                raise ValueError("Attempted to set bias parameter in Linear operation that does not have bias enabled")
            torch.nn.Module.register_parameter(self, name, None)
            return
        if param is None:
            raise ValueError(f"Linear: the {name} parameter cannot be removed")
        if "basic_ops" not in self._modules:
            torch.nn.Module.register_parameter(self, name, param)
            return
        # The basic op's register_parameter notifies this container, which re-syncs.
        setattr(self.basic_ops[self._op_index(name)], name, param)

    @contextlib.contextmanager
    def _without_aliases(self) -> Iterator[None]:
        """Hide the aliases so module-wide machinery handles each parameter once, at its owner."""
        saved = {name: self._parameters.pop(name) for name in _ALIASES if name in self._parameters}
        try:
            yield
        finally:
            for name in _ALIASES:
                if name in saved:
                    self._parameters[name] = saved[name]
            self._sync_parameters()

    def _apply(self, fn: Callable, recurse: bool = True) -> "Linear":
        with self._without_aliases():
            return super()._apply(fn, recurse)

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        with self._without_aliases():
            super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        # Accept checkpoints that name the aliases (nn.Linear style) by moving them
        # to the basic ops' keys, unless those are present too.
        for name in _ALIASES:
            key = prefix + name
            if key not in state_dict:
                continue
            value = state_dict.pop(key)
            index = self._op_index(name)
            if index is None:
                unexpected_keys.append(key)
                continue
            state_dict.setdefault(f"{prefix}basic_ops.{index}.{name}", value)
        with self._without_aliases():
            super()._load_from_state_dict(
                state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
            )

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self._bias_idx is not None}"
