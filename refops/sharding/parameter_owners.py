"""The FSDP2 route from ``meta``: ``reset_parameters()`` once on every module that owns parameters.

FSDP2's root pre-forward refuses meta parameters before refops' first-forward materialization could run, so
a meta-built, sharded model is materialized with ``model.to_empty(device=...)`` and then this.
"""

from __future__ import annotations

import torch

__all__ = ["reset_parameter_owners"]


def reset_parameter_owners(model: torch.nn.Module) -> list[torch.nn.Module]:
    """``reset_parameters()`` once on every module that owns parameters, in module order; returns them.

    A module counts as an owner when some parameter it registers is not registered by a submodule: a refops
    ``Linear``'s ``weight``/``bias`` are aliases of its basic ops' parameters, so its basic ops are the owners.
    Initializing each parameter exactly once, in construction order, keeps the RNG stream equal to an
    eager build's, so the values equal a single-process eager build under the same seed.
    """
    owners = []
    for module in model.modules():
        own = list(module.parameters(recurse=False))
        below = {id(p) for child in module.children() for p in child.parameters()}
        if own and hasattr(module, "reset_parameters") and not all(id(p) in below for p in own):
            module.reset_parameters()
            owners.append(module)
    return owners
