"""PyTorch-convention modules (materialized with ``to_empty()`` + ``reset_parameters()``) whose deferred
path, checkpoint or conversion disagrees with eager construction."""

from __future__ import annotations

import math
from typing import Any

import torch

from refops.testing import check_lifecycle

from .cases import RecallCase

FEATURES_IN, FEATURES_OUT = 16, 8


def _inputs(device: torch.device) -> tuple[torch.Tensor]:
    return (torch.randn(4, FEATURES_IN, device=device),)


class NormLinear(torch.nn.Module):
    """LayerNorm then Linear. Eager construction initializes every tensor itself (gamma 1, beta and bias 0);
    ``reset_parameters()`` is what the deferred (meta) path calls, and ``defect`` names what it gets wrong."""

    def __init__(self, device: Any = None, defect: str = "") -> None:
        super().__init__()
        self.defect = defect
        self.norm_weight = torch.nn.Parameter(torch.ones(FEATURES_IN, device=device))
        self.norm_bias = torch.nn.Parameter(torch.zeros(FEATURES_IN, device=device))
        self.weight = torch.nn.Parameter(torch.empty(FEATURES_OUT, FEATURES_IN, device=device))
        self.bias = torch.nn.Parameter(torch.zeros(FEATURES_OUT, device=device))
        with torch.no_grad():
            torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        # TE #2528: a LayerNorm weight re-initialized like a Linear weight; TE #2529: a random bias
        if self.defect == "norm_weight_random":
            torch.nn.init.normal_(self.norm_weight, std=0.02)
        else:
            self.norm_weight.fill_(1.0)
        self.norm_bias.zero_()
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.defect == "bias_random":
            bound = 1 / math.sqrt(FEATURES_IN)
            torch.nn.init.uniform_(self.bias, -bound, bound)
        else:
            self.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.nn.functional.layer_norm(x, (FEATURES_IN,), self.norm_weight, self.norm_bias)
        return torch.nn.functional.linear(z, self.weight, self.bias)


class DelayedScalingLinear(torch.nn.Linear):
    """A linear that casts its weight to FP8 with a scale from the previous forward's amax (delayed scaling)
    and decodes with ``scale_inv``; the recipe state travels in the checkpoint as extra state."""

    def __init__(self, device: Any = None, loads_scale_inv: bool = True) -> None:
        super().__init__(FEATURES_IN, FEATURES_OUT, device=device)
        self.loads_scale_inv = loads_scale_inv
        self.scale = torch.ones(1, device=device)
        self.scale_inv = torch.ones(1, device=device)

    def _apply(self, fn, recurse=True):
        self.scale, self.scale_inv = fn(self.scale), fn(self.scale_inv)
        return super()._apply(fn, recurse)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if hasattr(self, "scale"):
            self.scale.fill_(1.0)
            self.scale_inv.fill_(1.0)

    def get_extra_state(self) -> dict[str, torch.Tensor]:
        return {"scale": self.scale.clone(), "scale_inv": self.scale_inv.clone()}

    def set_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        self._restore("scale", state["scale"])
        if self.loads_scale_inv:  # TE #123: the loader restored the scale but left scale_inv at its old value
            self._restore("scale_inv", state["scale_inv"])

    def _restore(self, name: str, value: torch.Tensor) -> None:
        if getattr(self, name).is_meta:  # loading into a meta-built module: take the checkpoint's tensor
            setattr(self, name, value.clone())
        else:
            getattr(self, name).copy_(value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        data = (self.weight * self.scale).clamp(-448, 448).to(torch.float8_e4m3fn)
        weight = self.weight + (data.float() * self.scale_inv - self.weight).detach()
        with torch.no_grad():  # the next step's scale, from this step's amax
            self.scale.copy_(448.0 / self.weight.abs().amax().clamp(min=1e-12))
            self.scale_inv.copy_(torch.reciprocal(self.scale))
        return torch.nn.functional.linear(x, weight, self.bias)


def _trained_round_trip_differs(loads_scale_inv: bool) -> bool:
    """What the bug does after training steps: the loaded module decodes with a stale scale_inv."""
    torch.manual_seed(0)
    source = DelayedScalingLinear(loads_scale_inv=loads_scale_inv)
    x = torch.randn(4, FEATURES_IN)
    source(x)
    target = DelayedScalingLinear(loads_scale_inv=loads_scale_inv)
    target.load_state_dict(source.state_dict())
    return not torch.equal(target(x), source(x))


class ConvertedLinear(torch.nn.Linear):
    """A module-swap conversion (torchao's ``Float8Linear.from_float``) that wraps the original weight."""

    @classmethod
    def from_float(cls, module: torch.nn.Linear, keep_requires_grad: bool) -> "ConvertedLinear":
        with torch.device("meta"):
            new = cls(module.in_features, module.out_features)
        # torchao #1871: nn.Parameter(t) defaults to requires_grad=True, whatever t's flag was
        new.weight = torch.nn.Parameter(module.weight.detach(), requires_grad=module.weight.requires_grad
                                        if keep_requires_grad else True)
        new.bias = module.bias
        return new


def _check_converted(keep_requires_grad: bool) -> Any:
    """The conversion handed to check_lifecycle as the user's module swap (its ``convert=`` step)."""
    return check_lifecycle(lambda d: torch.nn.Linear(FEATURES_IN, FEATURES_OUT, device=d), inputs=_inputs,
                           convert=lambda module: ConvertedLinear.from_float(module, keep_requires_grad))


def _conversion_unfreezes(keep_requires_grad: bool) -> bool:
    frozen = torch.nn.Linear(FEATURES_IN, FEATURES_OUT).requires_grad_(False)
    return ConvertedLinear.from_float(frozen, keep_requires_grad).weight.requires_grad


class TiedLinears(torch.nn.Module):
    """Two layers that share one weight (tied word embeddings); ``to_empty()`` makes one tensor per name, so
    the tie must be restored after every re-placement (accelerate #1204's fix re-ties after loading)."""

    def __init__(self, device: Any = None, reties: bool = True) -> None:
        super().__init__()
        self.reties = reties
        self.first = torch.nn.Linear(FEATURES_IN, FEATURES_IN, bias=False, device=device)
        self.second = torch.nn.Linear(FEATURES_IN, FEATURES_IN, bias=False, device=device)
        self.second.weight = self.first.weight
        if reties:  # load_state_dict(assign=True) gives each name its own object
            self.register_load_state_dict_post_hook(lambda module, _keys: module._retie())

    def _retie(self) -> None:
        self.second.weight = self.first.weight

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        if self.reties:
            self._retie()
        return out

    def reset_parameters(self) -> None:
        self.first.reset_parameters()
        if self.reties:
            self._retie()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.tanh(self.first(x)))


def _check(factory) -> Any:
    return check_lifecycle(factory, inputs=_inputs)


CASES = [
    RecallCase("reset_parameters_norm_weight_random", "https://github.com/NVIDIA/TransformerEngine/issues/2528",
               "lifecycle", "the deferred path's reset_parameters() gives the LayerNorm weight a small random "
               "init instead of 1", lambda: _check(lambda d: NormLinear(d, "norm_weight_random")),
               lambda: _check(lambda d: NormLinear(d))),
    RecallCase("reset_parameters_bias_random", "https://github.com/NVIDIA/TransformerEngine/issues/2529",
               "lifecycle", "the deferred path's reset_parameters() gives the Linear bias a random init "
               "instead of 0", lambda: _check(lambda d: NormLinear(d, "bias_random")),
               lambda: _check(lambda d: NormLinear(d))),
    RecallCase("checkpoint_drops_scale_inv", "https://github.com/NVIDIA/TransformerEngine/pull/123",
               "lifecycle", "loading a checkpoint restores the FP8 scale but not scale_inv, so a trained "
               "module decodes its weight with a stale scale_inv",
               lambda: _check(lambda d: DelayedScalingLinear(d, loads_scale_inv=False)),
               lambda: _check(lambda d: DelayedScalingLinear(d)),
               lambda: _trained_round_trip_differs(False) and not _trained_round_trip_differs(True)),
    RecallCase("conversion_rewraps_frozen_weight_as_trainable", "https://github.com/pytorch/ao/issues/1871",
               "lifecycle", "Float8Linear.from_float() wraps the weight in a new nn.Parameter, whose "
               "requires_grad defaults to True: a frozen weight becomes trainable",
               lambda: _check_converted(False), lambda: _check_converted(True),
               lambda: _conversion_unfreezes(False) and not _conversion_unfreezes(True)),
    RecallCase("tied_weights_split_by_to_empty", "https://github.com/huggingface/accelerate/pull/1204",
               "lifecycle", "re-placing the parameters (to_empty, loading into a meta model) makes one tensor "
               "per name, so tied weights come apart", lambda: _check(lambda d: TiedLinears(d, reties=False)),
               lambda: _check(lambda d: TiedLinears(d))),
]
