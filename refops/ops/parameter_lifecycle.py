"""The parameter lifecycle of a basic op: construct, defer, materialize, re-initialize, replace.

This file answers "where are parameters materialized?": in
:meth:`ParameterLifecycle.materialize_meta_parameters`, which the fuser calls (through
``pre_first_fuser_forward``) on the first forward, and which
:meth:`ParameterLifecycle.reset_parameters` shares its one code path with.

The invariants kept here (see ``docs/lifecycle.md``):

1. Construction on ``meta`` allocates nothing; elsewhere parameters are
   initialized at once.
2. Materialization and re-initialization keep every ``Parameter`` *object*
   (``id`` unchanged), its ``requires_grad`` and its Python attributes: the data is
   swapped into the existing object with :func:`torch.utils.swap_tensors`.
3. Whenever a parameter object *is* replaced (``register_parameter``, attribute
   assignment, ``load_state_dict(assign=True)``, ``to_empty``, ``.to()`` on paths
   that create new objects), ``param_version`` increases and the containers that
   alias the parameter re-sync at once.
4. A DTensor parameter (FSDP2, DTensor tensor parallelism) stays the same DTensor
   object: refops draws the *full* value with the construction RNG (parity with a
   single-process build under the same seed), finalizes it, and writes this rank's
   shard into the DTensor's local tensor in place; it never replaces a DTensor by a
   plain tensor (:mod:`refops.ops.dtensor_parameters`).
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

from .. import trace
from ..quantization.dtensor import is_dtensor
from .dtensor_parameters import place_full_value_into_dtensor
from .placement import canonicalize_device, default_parameter_device

__all__ = ["ParameterLifecycle", "canonicalize_device", "canonicalize_dtype", "fill_parameter_in_place"]

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def canonicalize_dtype(dtype: torch.dtype | None, *, op_name: str) -> torch.dtype:
    """``None`` means torch's default dtype; only fp32, fp16 and bf16 are supported."""
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{op_name}: supported dtypes are float32, float16, bfloat16 (got {dtype})")
    return dtype


def fill_parameter_in_place(param: torch.nn.Parameter, value: torch.Tensor) -> bool:
    """Make ``param`` hold ``value``'s data while staying the same Python object.

    Keeps ``requires_grad`` and every attribute set on the object (``main_grad``,
    ``_param_name``...). Returns False when the swap is impossible (for instance a
    weak reference to the parameter exists); the caller then replaces the object.
    """
    replacement = torch.nn.Parameter(value.detach(), requires_grad=param.requires_grad)
    _carry_user_attributes(param, replacement)
    try:
        torch.utils.swap_tensors(param, replacement)
    except RuntimeError:
        return False
    return True


def _carry_user_attributes(old: torch.Tensor, new: torch.Tensor) -> None:
    """Copy the attributes a user set on ``old`` (``main_grad``, tags...) onto ``new``.

    A tensor subclass keeps its own state in ``__dict__`` (a QuantizedTensor's
    data and scales): that state belongs to the value, never carried over.
    """
    internal: set[str] = set()
    if hasattr(old, "__tensor_flatten__"):
        names, context = old.__tensor_flatten__()
        internal = set(names) | set(context)
    for key, value in old.__dict__.items():
        if key not in new.__dict__ and key not in internal:
            new.__dict__[key] = value


def _sharded_init_device(op: torch.nn.Module, name: str, param: torch.Tensor) -> torch.device:
    """Where a DTensor parameter's full value is drawn: its local shard's device, never meta."""
    device = param._local_tensor.device
    if device.type == "meta":
        raise RuntimeError(
            f"{type(op).__name__}.{name}: this parameter is a DTensor whose local shard is on the meta device "
            "(built on meta, then sharded). refops cannot materialize it at the first forward: call "
            "module.to_empty(device=...) and then module.reset_parameters(), which initializes every shard"
        )
    return device


class ParameterLifecycle(torch.nn.Module):
    """Mixin for ops that own parameters. Subclasses implement :meth:`init_parameter`.

    A subclass registers its parameters (on the construction device, ``meta``
    allowed) and then calls :meth:`_initialize_or_defer`.
    """

    _param_version: int = 0

    # ------------------------------------------------------------ construction
    def _remember_materialization_device(self, device: torch.device) -> None:
        """Record where meta parameters will go: the construction device, or the default placement.

        For ``device="meta"`` the target is :func:`~refops.ops.placement.default_parameter_device`
        *at construction* (a default set with ``torch.set_default_device`` or ``with
        torch.device(...)``, else the current CUDA device when there is one, else the CPU),
        unless that is meta too, in which case it is decided at materialization time.
        """
        if device.type != "meta":
            self._materialization_device: torch.device | None = device
        else:
            default = default_parameter_device()
            self._materialization_device = None if default.type == "meta" else default

    def _initialize_or_defer(self, device: torch.device) -> None:
        """Construction's last step. Invariant: on meta nothing is allocated, elsewhere values are set."""
        self._remember_materialization_device(device)
        deferred = device.type == "meta"
        trace.record(
            "construct",
            type(self).__name__,
            instance=self,
            device=str(device),
            dtype=str(self._construction_dtype()),
            deferred=deferred,
        )
        if not deferred:
            self.reset_parameters()

    def _construction_dtype(self) -> torch.dtype | None:
        for p in self._parameters.values():
            if p is not None:
                return p.dtype
        return None

    def _check_can_materialize(self) -> None:
        """Raise before anything is materialized if a parameter could not be (quantized weights)."""

    def init_parameter(self, name: str, tensor: torch.Tensor) -> None:
        """Write the initial values of parameter ``name`` into ``tensor`` (in place)."""
        raise NotImplementedError(f"{type(self).__name__} owns parameters but does not define init_parameter")

    # --------------------------------------------------------- materialization
    def materialization_device(self) -> torch.device:
        """Where this op's meta parameters will be allocated."""
        target = self._materialization_device
        if target is None:
            target = default_parameter_device()
        if target.type == "meta":
            raise RuntimeError(
                f"{type(self).__name__}: cannot materialize meta parameters because torch's default "
                "device is meta; call torch.set_default_device(...) or "
                "module.to_empty(device=...) followed by module.reset_parameters()"
            )
        return canonicalize_device(target)

    def parameter_device(self) -> torch.device:
        """Where the parameters are, or will be once materialized."""
        for p in self._parameters.values():
            if p is not None:
                return self.materialization_device() if p.is_meta else p.device
        return default_parameter_device()

    def has_meta_parameters(self) -> bool:
        return any(p is not None and p.is_meta for p in self._parameters.values())

    def materialize_meta_parameters(self) -> None:
        """Allocate and initialize every parameter still on ``meta``. Others are untouched.

        Invariant: afterwards no parameter is on meta, and each keeps its object
        identity, ``requires_grad`` and attributes. Values equal those of eager
        construction on the same device under the same RNG state.
        """
        names = [n for n, p in self._parameters.items() if p is not None and p.is_meta]
        if names:
            self._initialize_parameters(names, self.materialization_device())

    def reset_parameters(self) -> None:
        """(Re)initialize every parameter this op owns (its own only: the FSDP contract).

        Meta parameters go to :meth:`materialization_device`; others are
        re-initialized where they are. Parameter objects are kept.
        """
        names = [n for n, p in self._parameters.items() if p is not None]
        on_meta = [n for n in names if self._parameters[n].is_meta]
        device = self.materialization_device() if on_meta else None
        self._initialize_parameters(names, device)

    def _initialize_parameters(self, names: Iterable[str], meta_target: torch.device | None) -> None:
        """The single code path that gives parameters values (materialization and reset)."""
        self._check_can_materialize()
        inference = torch.is_inference_mode_enabled()
        for name in names:
            param = self._parameters[name]
            sharded = is_dtensor(param)
            device = _sharded_init_device(self, name, param) if sharded else (
                meta_target if param.is_meta else param.device
            )
            # Parameters are ordinary tensors whatever the caller's grad mode: a
            # first forward under inference_mode must not create inference tensors.
            with torch.inference_mode(False), torch.no_grad():
                # A DTensor's shape is the global one: the full value is drawn, for
                # bit-parity with a single-process build (see refops.ops.dtensor_parameters).
                value = torch.empty(param.shape, dtype=param.dtype, device=device)
                self.init_parameter(name, value)
                value = self._finalize_parameter_value(name, value, inference=inference)
                if sharded:
                    place_full_value_into_dtensor(param, value, what=f"{type(self).__name__}.{name}")
                else:
                    self._place_parameter_value(name, value)
            trace.record(
                "materialize",
                f"{type(self).__name__}.{name}",
                instance=self,
                device=str(value.device),
                dtype=str(value.dtype),
                kept_identity=self._parameters[name] is param,
                **({"local_shape": list(param._local_tensor.shape)} if sharded else {}),
            )

    def _finalize_parameter_value(self, name: str, value: torch.Tensor, *, inference: bool) -> torch.Tensor:
        """Hook between initialization and placement (weights built under quantized_model_init are
        quantized here; ``inference`` tells whether the caller is in inference mode)."""
        return value

    def _place_parameter_value(self, name: str, value: torch.Tensor) -> None:
        """Put ``value`` into parameter ``name``: in place when possible, else by replacement."""
        param = self._parameters[name]
        if is_dtensor(param):
            place_full_value_into_dtensor(param, value, what=f"{type(self).__name__}.{name}")
            return
        if fill_parameter_in_place(param, value):
            return
        replacement = torch.nn.Parameter(value, requires_grad=param.requires_grad)
        _carry_user_attributes(param, replacement)
        self.register_parameter(name, replacement)

    # ------------------------------------------------------------- replacement
    @property
    def param_version(self) -> int:
        """Increases whenever a parameter object of this op is replaced."""
        return self._param_version

    def register_parameter(self, name: str, param: torch.nn.Parameter | None) -> None:
        super().register_parameter(name, param)
        self._on_parameters_replaced()

    def _apply(self, fn: Callable, recurse: bool = True) -> "ParameterLifecycle":
        before = dict(self._parameters)
        result = super()._apply(fn, recurse)
        if any(self._parameters.get(k) is not v for k, v in before.items()):
            self._on_parameters_replaced()
        return result

    def _on_parameters_replaced(self) -> None:
        """Invariant: every dependent learns of a replacement before it can use the old object."""
        self._param_version = self._param_version + 1
        for owner in self.__dict__.get("_alias_owners", ()):
            owner._sync_parameters()

    def _add_alias_owner(self, owner: torch.nn.Module) -> None:
        """``owner`` holds aliases of this op's parameters and must re-sync on replacement."""
        owners = self.__dict__.setdefault("_alias_owners", [])
        if not any(o is owner for o in owners):
            owners.append(owner)
