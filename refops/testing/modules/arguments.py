"""``compare_modules``' arguments, checked before anything runs: misuse is one clear error."""

from __future__ import annotations

from typing import Sequence

import torch

from .scenarios import SCENARIOS

__all__ = ["TIERS", "validate_arguments"]

#: The criteria ``compare_modules`` judges outputs and grads by (``tier=``).
TIERS = ("numerics", "tolerance", "sqnr", "exact")


def validate_arguments(candidate, reference, inputs, tier, grad_output, scenarios=("one step",),
                       metamorphic=True) -> None:
    """Misuse is an error naming compare_modules, the argument and what was expected, before anything runs."""
    for arg, module in (("candidate", candidate), ("reference", reference)):
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"compare_modules: `{arg}` must be a torch.nn.Module, got {type(module).__name__}")
    if isinstance(inputs, torch.Tensor) or not isinstance(inputs, Sequence):
        shape = f" of shape {tuple(inputs.shape)}" if isinstance(inputs, torch.Tensor) else ""
        raise TypeError(
            f"compare_modules: `inputs` must be a sequence of the forward's arguments, e.g. (x,); got a "
            f"{type(inputs).__name__}{shape}"
        )
    if tier not in TIERS:
        raise ValueError(f"compare_modules: unknown `tier` {tier!r}; the tiers are {', '.join(map(repr, TIERS))}")
    if isinstance(scenarios, str) or not isinstance(scenarios, Sequence) or not scenarios:
        raise TypeError(f"compare_modules: `scenarios` must be a non-empty sequence of scenario names from "
                        f"{', '.join(map(repr, SCENARIOS))}; got {scenarios!r}")
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        raise ValueError(f"compare_modules: unknown scenario(s) {unknown}; the scenarios are "
                         f"{', '.join(map(repr, SCENARIOS))}")
    if not isinstance(metamorphic, bool):
        raise TypeError(f"compare_modules: `metamorphic` must be True or False, got {metamorphic!r}")
    if grad_output is not None and not isinstance(grad_output, torch.Tensor):
        raise TypeError(f"compare_modules: `grad_output` must be a tensor or None, got {type(grad_output).__name__}")
    params_c, params_r = dict(candidate.named_parameters()), dict(reference.named_parameters())
    only_c, only_r = sorted(set(params_c) - set(params_r)), sorted(set(params_r) - set(params_c))
    if only_c or only_r:
        raise ValueError(
            "compare_modules: the candidate's and the reference's parameter names must match (they are mapped by "
            f"name); only the candidate has {only_c}, only the reference has {only_r}"
        )
    for name, p in params_c.items():
        q = params_r[name]
        if tuple(p.shape) != tuple(q.shape):
            raise ValueError(
                f"compare_modules: parameter {name!r} has shape {tuple(p.shape)} in the candidate and "
                f"{tuple(q.shape)} in the reference; the two modules must have the same parameter shapes"
            )
