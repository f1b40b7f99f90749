"""A QAT module swap that builds fresh layers instead of taking the originals' weights (pytorch/ao#211).

torchao's 8da4w QAT quantizer replaced every ``nn.Linear`` by an ``Int8DynActInt4WeightQATLinear``
constructed from the sizes alone: on the default device (not the original's, so not ``meta`` under
FSDP's deferred init) and with its own random weights, so fine-tuning started from noise even after a
checkpoint had been loaded. The fix builds it on the original's device and assigns the original weight.
Re-created as a swap to a plain-torch fake-quantized linear (int8 per-token activations, int4 per-group
weights, straight-through grads), handed to ``check_lifecycle`` as the user's ``convert=``.
"""

from __future__ import annotations

from typing import Any

import torch

from refops.testing import check_lifecycle

from .cases import RecallCase

FEATURES_IN, HIDDEN, FEATURES_OUT, GROUP = 16, 32, 8, 8


def _fake_quantize(t: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """Symmetric fake quantization over groups of ``group`` along the last dim; grads pass straight through."""
    qmax = 2 ** (bits - 1) - 1
    groups = t.reshape(-1, group)
    scale = groups.detach().abs().amax(-1, keepdim=True).clamp(min=torch.finfo(t.dtype).eps) / qmax
    q = torch.clamp(torch.round(groups / scale), -qmax - 1, qmax) * scale
    return t + (q.reshape(t.shape) - t).detach()


class QATLinear(torch.nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _fake_quantize(x, 8, x.shape[-1])  # per token
        return torch.nn.functional.linear(x, _fake_quantize(self.weight, 4, GROUP), self.bias)


def swap_to_qat(module: torch.nn.Module, copy_weights: bool) -> torch.nn.Module:
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            device = child.weight.device if copy_weights else None  # the bug: the default device
            new = QATLinear(child.in_features, child.out_features, bias=False, device=device)
            if copy_weights:  # the fix
                new.weight = child.weight
            setattr(module, name, new)
        else:
            swap_to_qat(child, copy_weights)
    return module


def _mlp(device: torch.device) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(FEATURES_IN, HIDDEN, bias=False, device=device), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, FEATURES_OUT, bias=False, device=device))


def _inputs(device: torch.device) -> tuple[torch.Tensor]:
    return (torch.randn(4, FEATURES_IN, device=device),)


def _check(copy_weights: bool) -> Any:
    return check_lifecycle(_mlp, inputs=_inputs, convert=lambda module: swap_to_qat(module, copy_weights))


def _weights_survive(copy_weights: bool) -> bool:
    module = _mlp(torch.device("cpu"))
    before = module[0].weight.detach().clone()
    return torch.equal(swap_to_qat(module, copy_weights)[0].weight, before)


CASES = [
    RecallCase("qat_swap_reinitializes_weights", "https://github.com/pytorch/ao/pull/211", "lifecycle",
               "the QAT module swap builds each new linear from its sizes alone, on the default device and "
               "with random weights, instead of taking the original's weight (loaded or frozen)",
               lambda: _check(False), lambda: _check(True),
               lambda: not _weights_survive(False) and _weights_survive(True)),
]
