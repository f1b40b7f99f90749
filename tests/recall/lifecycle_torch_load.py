"""``load_state_dict(assign=True)`` that does not keep a parameter's ``requires_grad`` (pytorch/pytorch#121157).

Before the fix, ``Module._load_from_state_dict`` with ``assign=True`` wrapped a plain state-dict tensor
(the default ``keep_vars=False`` state dict holds plain tensors) in ``nn.Parameter(tensor)``, whose
``requires_grad`` defaults to True, and took a Parameter's flag from the checkpoint: a parameter frozen
in the module (built on meta, frozen, then loaded) came back trainable. The fix keeps the module's
flag. Re-created as a linear whose own ``_load_from_state_dict`` does the assignment the old way; the
twin does it the fixed way. Both defer to torch for everything else (a copying load included).
"""

from __future__ import annotations

from typing import Any

import torch

from refops.testing import check_lifecycle

from .cases import RecallCase

FEATURES_IN, FEATURES_OUT = 16, 8


class AssigningLinear(torch.nn.Linear):
    """``torch.nn.Linear`` with an ``assign=True`` path of its own; ``keeps_requires_grad`` is the fix."""

    def __init__(self, device: Any = None, keeps_requires_grad: bool = True) -> None:
        super().__init__(FEATURES_IN, FEATURES_OUT, device=device)
        self.keeps_requires_grad = keeps_requires_grad

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        if not local_metadata.get("assign_to_params_buffers", False):
            return super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                                 unexpected_keys, error_msgs)
        for name, param in list(self._parameters.items()):
            key = prefix + name
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            value = state_dict[key]
            if value.shape != param.shape:
                error_msgs.append(f"size mismatch for {key}: {tuple(value.shape)} vs {tuple(param.shape)}")
                continue
            if self.keeps_requires_grad:  # the fix: the module's flag wins
                new = (value if isinstance(value, torch.nn.Parameter) else torch.nn.Parameter(value))
                new.requires_grad_(param.requires_grad)
            else:  # before: True for a plain tensor, the checkpoint's flag for a Parameter
                new = value if isinstance(value, torch.nn.Parameter) else torch.nn.Parameter(value)
            setattr(self, name, new)


def _inputs(device: torch.device) -> tuple[torch.Tensor]:
    return (torch.randn(4, FEATURES_IN, device=device),)


def _check(keeps_requires_grad: bool) -> Any:
    return check_lifecycle(lambda device: AssigningLinear(device, keeps_requires_grad), inputs=_inputs)


def _unfreezes(keeps_requires_grad: bool) -> bool:
    """The issue's scenario: a meta-built module, its weight frozen, loaded with assign=True."""
    source = AssigningLinear(keeps_requires_grad=keeps_requires_grad)
    target = AssigningLinear("meta", keeps_requires_grad)
    target.weight.requires_grad_(False)
    target.load_state_dict(source.state_dict(), assign=True)
    return target.weight.requires_grad


CASES = [
    RecallCase("load_state_dict_assign_unfreezes_parameter", "https://github.com/pytorch/pytorch/pull/121157",
               "lifecycle", "load_state_dict(assign=True) wraps each plain checkpoint tensor in a new Parameter "
               "(requires_grad=True): a weight frozen in the meta-built module comes back trainable",
               lambda: _check(False), lambda: _check(True),
               lambda: _unfreezes(False) and not _unfreezes(True)),
]
