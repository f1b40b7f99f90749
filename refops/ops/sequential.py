"""``Sequential``: a list of modules where runs of fusible ops become fusers."""

from __future__ import annotations

from typing import Any, Iterator, Optional, Union

import torch

from .fuser import OperationFuser
from .op import BasicOperation, FusibleOperation

__all__ = ["Sequential"]

Group = Union[OperationFuser, torch.nn.Module]


class Sequential(torch.nn.Module):
    """Like ``torch.nn.Sequential``, with consecutive fusible ops run by one fuser each.

    Plain ``torch.nn.Module`` children run between the fusers. Fusers are built on
    the first forward and rebuilt only when membership changes; changes inside the
    ops (materialization, replaced parameters) are the fusers' own business.

    ``forward(input, *extra_inputs, op_kwargs=None)`` hands the extra inputs to the
    fusers in order and returns ``x`` or ``(x, *extra_outputs)``.
    """

    def __init__(self, *args: Any) -> None:
        super().__init__()
        self._module_groups: Optional[list[Group]] = None
        if len(args) == 1 and isinstance(args[0], dict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for module in args:
                self.append(module)

    # ---------------------------------------------------------- list protocol
    def add_module(self, name: str, module: Optional[torch.nn.Module]) -> None:
        self._module_groups = None
        super().add_module(name, module)

    def _next_key(self) -> str:
        ints = [int(k) for k in self._modules if k.isdigit()]
        return str(max(ints) + 1 if ints else 0)

    def _key(self, idx: int) -> str:
        n = len(self)
        if not -n <= idx < n:
            raise IndexError(f"Attempted to access index {idx}, but there are {n} entries")
        return list(self._modules)[idx % n]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[torch.nn.Module]:
        return iter(self._modules.values())

    def __getitem__(self, idx: Union[int, slice]) -> Any:
        if isinstance(idx, slice):
            return Sequential(*list(self._modules.values())[idx])
        return self._modules[self._key(idx)]

    def __setitem__(self, idx: int, module: torch.nn.Module) -> None:
        self.add_module(self._key(idx), module)

    def __delitem__(self, idx: Union[int, slice]) -> None:
        keys = list(self._modules)
        targets = keys[idx] if isinstance(idx, slice) else [self._key(idx)]
        for key in targets:
            del self._modules[key]
        self._module_groups = None

    def append(self, module: torch.nn.Module) -> "Sequential":
        self.add_module(self._next_key(), module)
        return self

    def extend(self, modules: Any) -> "Sequential":
        for module in modules:
            self.append(module)
        return self

    def insert(self, idx: int, module: torch.nn.Module) -> "Sequential":
        modules = list(self._modules.values())
        n = len(modules)
        if not -n <= idx <= n:
            raise IndexError(f"Attempted to insert at index {idx}, but there are {n} entries")
        modules.insert(idx % (n + 1) if idx >= 0 else idx, module)
        self._modules.clear()
        for i, m in enumerate(modules):
            self.add_module(str(i), m)
        return self

    def pop(self, idx: int = -1) -> torch.nn.Module:
        module = self[idx]
        del self[idx]
        return module

    def __add__(self, other: "Sequential") -> "Sequential":
        return Sequential(*self, *other)

    def __iadd__(self, other: "Sequential") -> "Sequential":
        return self.extend(other)

    # ------------------------------------------------------------- lifecycle
    def reset_parameters(self) -> None:
        """Call ``reset_parameters()`` on every child that has it."""
        for module in self:
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()

    def _make_module_groups(self) -> list[Group]:
        """One fuser per maximal run of fusible ops; other modules stand alone."""
        groups: list[Group] = []
        run: list[FusibleOperation] = []
        for module in self:
            if isinstance(module, FusibleOperation):
                run.append(module)
                continue
            if run:
                groups.append(OperationFuser(run))
                run = []
            groups.append(module)
        if run:
            groups.append(OperationFuser(run))
        return groups

    def _route_op_kwargs(self, groups: list[Group], op_kwargs: Optional[dict]) -> dict[int, list[dict[str, Any]]]:
        """Map ``{module or index: kwargs}`` to per-fuser lists of basic-op kwargs."""
        routed: dict[int, list[dict[str, Any]]] = {
            g: [{} for _ in group._basic_ops] for g, group in enumerate(groups) if isinstance(group, OperationFuser)
        }
        if not op_kwargs:
            return routed
        modules = list(self)
        for key, kwargs in op_kwargs.items():
            target = modules[key] if isinstance(key, int) else key
            if not isinstance(target, BasicOperation):
                raise ValueError(
                    "Sequential only allows providing forward kwargs to a BasicOperation "
                    f"(got {type(target).__name__})"
                )
            found = False
            for g, group in enumerate(groups):
                if isinstance(group, OperationFuser):
                    for i, op in enumerate(group._basic_ops):
                        if op is target:
                            routed[g][i] = dict(kwargs)
                            found = True
            if not found:
                raise ValueError("op_kwargs contains keys that are not in this Sequential")
        return routed

    def forward(self, input: torch.Tensor, *extra_inputs: torch.Tensor, op_kwargs: Optional[dict] = None) -> Any:
        if self._module_groups is None:
            self._module_groups = self._make_module_groups()
        groups = self._module_groups
        kwargs = self._route_op_kwargs(groups, op_kwargs)
        x = input
        remaining = list(extra_inputs)
        extra_outputs: list[torch.Tensor] = []
        for g, group in enumerate(groups):
            if not isinstance(group, OperationFuser):
                x = group(x)
                continue
            taken, remaining = remaining[: group.num_extra_inputs], remaining[group.num_extra_inputs :]
            out = group(x, *taken, basic_op_kwargs=kwargs[g])
            if isinstance(out, tuple):
                x, *more = out
                extra_outputs.extend(more)
            else:
                x = out
        if remaining:
            raise ValueError(
                f"Sequential received {len(extra_inputs)} extra inputs but its ops consume "
                f"{len(extra_inputs) - len(remaining)}"
            )
        if extra_outputs:
            return (x, *extra_outputs)
        return x
