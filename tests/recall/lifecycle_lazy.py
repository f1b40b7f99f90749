"""TE-style modules that may be built on ``meta`` and materialize themselves (``reset_parameters()``, first
forward), checked as the oracle is pointed at TE's ops: ``check_lifecycle(..., **TE_STYLE)``, holding them to
both claims (materialized by ``reset_parameters()``, and at the first forward).

``LazyLinear.materialize`` is the one seam: the correct twins swap the real payload into the existing
``Parameter`` (``torch.utils.swap_tensors``, refops' way), so every reference to it stays valid.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from refops.testing import check_lifecycle

from .cases import RecallCase

FEATURES_IN, FEATURES_OUT = 16, 8


class LazyLinear(torch.nn.Module):
    """``y = x W^T``; built on meta, it materializes on first use (and through ``reset_parameters()``)."""

    def __init__(self, device: Any = None, *, defect: Optional[str] = None) -> None:
        super().__init__()
        self.defect = defect
        if defect == "meta_device_object_not_recognised":
            self.deferred = device == "meta"  # a torch.device('meta') is not equal to the string (the bug)
        else:
            self.deferred = device is not None and torch.device(device).type == "meta"
        self.weight = torch.nn.Parameter(torch.empty(FEATURES_OUT, FEATURES_IN, device=device))
        self._cached_params = list(self.parameters())  # what a fuser hands autograd
        if not self.deferred:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        device = torch.get_default_device() if self.weight.is_meta else self.weight.device
        weight = torch.empty(self.weight.shape, device=device)
        torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
        self._place("weight", weight)

    def _place(self, name: str, value: torch.Tensor) -> None:
        old = getattr(self, name)
        if self.defect in ("new_parameter_object", "stale_parameter_cache"):
            setattr(self, name, torch.nn.Parameter(value))  # a new object: identity and requires_grad lost
        else:
            torch.utils.swap_tensors(old, torch.nn.Parameter(value, requires_grad=old.requires_grad))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.deferred and self.weight.is_meta:
            self.reset_parameters()
        if self.defect == "stale_parameter_cache":  # TE #3322: autograd receives the construction-time objects
            return _CachedWeightMatmul.apply(x, self, *self._cached_params)
        return x @ self.weight.t()


class ScaledLinear(LazyLinear):
    """A ``LazyLinear`` whose output is scaled by a derived, non-persistent buffer (a RoPE table's kind)."""

    def __init__(self, device: Any = None, *, recompute_on_materialize: bool) -> None:
        self.recompute_on_materialize = recompute_on_materialize
        super().__init__(device)
        self.register_buffer("gain", torch.empty(FEATURES_OUT, device=device), persistent=False)
        if not self.deferred:
            self._init_buffers()
        if recompute_on_materialize:  # load_state_dict(assign=True) brings the parameters, never this buffer
            self.register_load_state_dict_post_hook(lambda module, _keys: module._init_buffers()
                                                    if module.gain.is_meta else None)

    def _init_buffers(self) -> None:
        device = torch.get_default_device() if self.weight.is_meta else self.weight.device
        self.gain = torch.linspace(0.5, 1.5, FEATURES_OUT, device=device)  # not in the checkpoint

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.recompute_on_materialize and hasattr(self, "gain"):
            self._init_buffers()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        if self.recompute_on_materialize and self.gain.is_meta:  # after to_empty or load_state_dict(assign=True)
            self._init_buffers()
        return y * self.gain


class _CachedWeightMatmul(torch.autograd.Function):
    """Computes with the module's current weight and returns the grad for the cached one (TE's fuser pre-#3327)."""

    @staticmethod
    def forward(ctx, x, module, *cached_params):
        ctx.save_for_backward(x)
        ctx.module = module
        return x @ module.weight.t()

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return dy @ ctx.module.weight, None, dy.t() @ x


def _inputs(device: torch.device) -> tuple[torch.Tensor]:
    return (torch.randn(4, FEATURES_IN, device=device),)


class RefusedByOracle:
    """The oracle raised instead of reporting: for a factory that cannot build on meta, that IS its verdict."""

    ok = False

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __str__(self) -> str:
        return f"refused: {type(self.error).__name__}: {self.error}"

#: The claims a TE-style module makes: ``reset_parameters()`` materializes it, and so does its first forward.
TE_STYLE = {"materializes_through_reset_parameters": True, "materializes_at_first_forward": True}


def _check(defect: Optional[str]) -> Any:
    try:
        return check_lifecycle(lambda device: LazyLinear(device, defect=defect), inputs=_inputs, **TE_STYLE)
    except TypeError as error:
        if "cannot be built deferred" not in str(error):
            raise
        return RefusedByOracle(error)


def _check_buffer(recompute_on_materialize: bool) -> Any:
    return check_lifecycle(lambda device: ScaledLinear(device, recompute_on_materialize=recompute_on_materialize),
                           inputs=_inputs, **TE_STYLE)


def _case(name: str, url: str, summary: str, defect: str) -> RecallCase:
    return RecallCase(name, url, "lifecycle", summary, lambda: _check(defect), lambda: _check(None))


CASES = [
    _case("fuser_caches_parameters_before_materialization",
          "https://github.com/NVIDIA/TransformerEngine/issues/3322",
          "the seed bug: the fuser caches list(op.parameters()) at construction, materialization assigns new "
          "Parameters, and backward gets the meta tensors (fix: PR #3327)", "stale_parameter_cache"),
    RecallCase("reset_parameters_leaves_buffer_on_meta", "https://github.com/hiyouga/LlamaFactory/pull/10820",
               "lifecycle", "materializing re-initializes the parameters but not a derived non-persistent "
               "buffer, which stays on meta (garbage after to_empty)",
               lambda: _check_buffer(False), lambda: _check_buffer(True)),
    _case("reset_parameters_assigns_new_parameter", "https://github.com/NVIDIA/Megatron-LM/pull/6799",
          "TE's reset_parameters() assigns a new Parameter: the optimizer's (and FSDP's) object goes stale "
          "and a frozen weight comes back trainable", "new_parameter_object"),
    _case("meta_device_object_not_recognised", "https://github.com/NVIDIA/TransformerEngine/commit/14ddb43035c2bf8398481c197ab9c2f25794f8b4",
          "device=torch.device('meta') is not recognised as meta (only the string is), so the module never "
          "defers and never materializes", "meta_device_object_not_recognised"),
]
