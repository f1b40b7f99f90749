"""TransformerEngine module-API lifecycle bugs: a norm that ``reset_parameters()`` leaves on meta, and FP8
state that a checkpoint keeps only when the saving module has run a forward.

Both modules follow TE's conventions (1.x module API), re-created in plain torch: built on ``meta``,
a TE module is materialized by calling its ``reset_parameters()``, without ``to_empty()`` first.
"""

from __future__ import annotations

import io
import math
from typing import Any, Optional

import torch

from refops.testing import check_lifecycle

from .cases import RecallCase

FEATURES_IN, FEATURES_OUT = 16, 8


def _inputs(device: torch.device) -> tuple[torch.Tensor]:
    return (torch.randn(4, FEATURES_IN, device=device),)


def _materialized(param: torch.nn.Parameter) -> torch.nn.Parameter:
    """TE's base ``reset_parameters()``: a meta parameter gets real storage, as a new Parameter."""
    if not param.is_meta:
        return param
    return torch.nn.Parameter(torch.empty_like(param, device=torch.get_default_device()),
                              requires_grad=param.requires_grad)


# ------------------------------------------------------------ TE #619: LayerNorm never leaves meta
class TELayerNorm(torch.nn.Module):
    """TE's standalone ``LayerNorm`` module; ``materializes`` is the fix (before it, ``reset_parameters()``
    ran ``init.constant_`` on the meta tensors, which leaves them on meta)."""

    def __init__(self, device: Any = None, materializes: bool = True) -> None:
        super().__init__()
        self.materializes = materializes
        self.weight = torch.nn.Parameter(torch.empty(FEATURES_IN, device=device))
        self.bias = torch.nn.Parameter(torch.empty(FEATURES_IN, device=device))
        self.reset_parameters(defer_init=torch.device(device or "cpu").type == "meta")

    def reset_parameters(self, defer_init: bool = False) -> None:
        if defer_init:
            return
        if self.materializes:
            self.weight, self.bias = _materialized(self.weight), _materialized(self.bias)
        with torch.no_grad():
            self.weight.fill_(1.0)
            self.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, (FEATURES_IN,), self.weight, self.bias)


class TELinear(torch.nn.Module):
    """TE's ``Linear`` module: ``reset_parameters()`` materializes meta parameters, then initializes them."""

    def __init__(self, device: Any = None) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(FEATURES_OUT, FEATURES_IN, device=device))
        self.bias = torch.nn.Parameter(torch.empty(FEATURES_OUT, device=device))
        self.reset_parameters(defer_init=torch.device(device or "cpu").type == "meta")

    def reset_parameters(self, defer_init: bool = False) -> None:
        if defer_init:
            return
        self.weight, self.bias = _materialized(self.weight), _materialized(self.bias)
        with torch.no_grad():
            torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
            self.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight, self.bias)


class NormThenLinear(torch.nn.Module):
    """A block of TE modules, as NeMo built it on meta and then reset module by module."""

    def __init__(self, device: Any = None, norm_materializes: bool = True) -> None:
        super().__init__()
        self.norm = TELayerNorm(device, norm_materializes)
        self.linear = TELinear(device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm(x))


def _norm_left_on_meta(norm_materializes: bool) -> bool:
    block = NormThenLinear("meta", norm_materializes)
    for module in (block.norm, block.linear):  # what FSDP's param_init_fn / NeMo did
        module.reset_parameters()
    return any(t.is_meta for t in block.parameters())


# ------------------------------------------------------------ TE #323: FP8 state saved only after a forward
class DelayedScalingTELinear(torch.nn.Linear):
    """A linear whose weight is cast to FP8 with a delayed scale (``amax_history`` of 4, "max"); the FP8
    state travels in the checkpoint as extra state, which is written only when ``fp8_checkpoint`` is set.
    Before the fix the flag meant "the last forward ran FP8", so a module that loaded a checkpoint and had
    not run a forward yet (a resumed job checkpointing at once, a conversion script) saved no FP8 state."""

    def __init__(self, device: Any = None, loading_sets_flag: bool = True) -> None:
        super().__init__(FEATURES_IN, FEATURES_OUT, device=device)
        self.loading_sets_flag = loading_sets_flag
        self.fp8_checkpoint = False
        # TE allocates its FP8 metadata on the GPU even for a meta-built module (a few bytes)
        state_device = torch.get_default_device() if torch.device(device or "cpu").type == "meta" else device
        self.scale = torch.ones(1, device=state_device)
        self.amax_history = torch.zeros(4, device=state_device)

    def _apply(self, fn, recurse=True):
        self.scale, self.amax_history = fn(self.scale), fn(self.amax_history)
        return super()._apply(fn, recurse)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if hasattr(self, "scale"):
            self.scale.fill_(1.0)
            self.amax_history.zero_()

    def get_extra_state(self) -> Optional[dict[str, torch.Tensor]]:
        if not self.fp8_checkpoint:
            return None
        return {"scale": self.scale.clone(), "amax_history": self.amax_history.clone()}

    def set_extra_state(self, state: Optional[dict[str, torch.Tensor]]) -> None:
        if state is None:
            return
        self.scale.copy_(state["scale"])
        self.amax_history.copy_(state["amax_history"])
        if self.loading_sets_flag:  # the fix: the checkpoint's flag comes back with its state
            self.fp8_checkpoint = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fp8_checkpoint = True
        data = (self.weight * self.scale).clamp(-448, 448).to(torch.float8_e4m3fn)
        weight = self.weight + (data.float() / self.scale - self.weight).detach()
        if self.training:
            with torch.no_grad():  # record this step's amax; the next step's scale is from the history
                self.amax_history.copy_(torch.roll(self.amax_history, 1))
                self.amax_history[0] = self.weight.abs().amax()
                self.scale.copy_(448.0 / self.amax_history.amax().clamp(min=1e-12))
        return torch.nn.functional.linear(x, weight, self.bias)


def _resaved_before_forward_differs(loading_sets_flag: bool) -> bool:
    """Train, save, load into a fresh module, save THAT module before any forward, load into a third one:
    the third module's next step must equal the trained source's."""
    torch.manual_seed(0)
    source = DelayedScalingTELinear(loading_sets_flag=loading_sets_flag)
    x = torch.randn(4, FEATURES_IN)
    for step in range(3):
        source((step + 1) * x)
    modules = [source]
    for _ in range(2):
        buffer = io.BytesIO()
        torch.save(modules[-1].state_dict(), buffer)
        target = DelayedScalingTELinear(loading_sets_flag=loading_sets_flag)
        target.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
        modules.append(target)
    return not torch.equal(modules[-1](x), source(x))


def _check(factory, **claims: bool) -> Any:
    return check_lifecycle(factory, inputs=_inputs, **claims)


def _check_te_reset(factory) -> Any:
    """As the oracle holds real TE modules (found by their package) to TE's contract: ``reset_parameters()``
    materializes them. These plain-torch re-creations say so, as a TE-style module of a user's would."""
    return _check(factory, materializes_through_reset_parameters=True)


CASES = [
    RecallCase("norm_reset_parameters_leaves_meta", "https://github.com/NVIDIA/TransformerEngine/pull/619",
               "lifecycle", "TE's LayerNorm/RMSNorm reset_parameters() initializes meta tensors in place (the norms' "
               "half of the fix), so a meta-built model reset module by module (NeMo, FSDP) keeps its norms on meta",
               lambda: _check_te_reset(lambda d: NormThenLinear(d, norm_materializes=False)),
               lambda: _check_te_reset(lambda d: NormThenLinear(d)),
               lambda: _norm_left_on_meta(False) and not _norm_left_on_meta(True)),
    RecallCase("fp8_state_dropped_when_resaved_before_forward",
               "https://github.com/NVIDIA/TransformerEngine/pull/323", "lifecycle",
               "get_extra_state() writes the FP8 scales and amax history only if the last forward ran FP8: a "
               "module that loaded a trained checkpoint and saves again before its first forward drops them",
               lambda: _check(lambda d: DelayedScalingTELinear(d, loading_sets_flag=False)),
               lambda: _check(lambda d: DelayedScalingTELinear(d)),
               lambda: _resaved_before_forward_differs(False) and not _resaved_before_forward_differs(True)),
]
