"""Cases for the tensor-parallel tests, TE's method: full tensors built once, a float64 reference
computed on them with plain torch, and each rank's expected values sliced out of it.

A case is a plain dict (it travels to forked or spawned ranks). ``run_case`` runs on a rank: it
slices its inputs and parameters from the full tensors, runs the refops model forward and
backward, and returns its outputs; ``expected`` slices the float64 reference the same way, in
the parent process, where the assertions are.
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

import refops
from refops.testing.recipes import make_recipe


def rank_device(rank: int, device_type: str) -> torch.device:
    return torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")


def representable(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator, scale: float = 1.0
                  ) -> torch.Tensor:
    """A float64 tensor of values in ``[0, scale)``, each exactly representable in ``dtype``.

    Uniform and positive as in TE's tests: no cancellation, so low-precision results
    compare with relative tolerances.
    """
    return (scale * torch.rand(shape, generator=generator, dtype=torch.float64)).to(dtype).to(torch.float64)


def shard(t: torch.Tensor, dim: int, rank: int, world: int) -> torch.Tensor:
    return t.chunk(world, dim)[rank]


# ------------------------------------------------------------------ cases
def make_case(kind: str, mode: Optional[str], sp: bool, dtype: torch.dtype, *, world: int, seed: int,
              batch: int = 16, in_features: int = 32, out_features: int = 32, hidden: int = 32,
              bias: bool = True, recipe: Optional[str] = None, steps: int = 1) -> dict[str, Any]:
    """Full tensors and the float64 reference of one case.

    ``kind``: "basic_linear" (no bias), "linear", "ln_linear" (LayerNorm with its initial
    ones/zeros, then a Linear: under a recipe the norm quantizes the linear's input), or
    "mlp" (GELU, column Linear, GELU, row Linear, GELU). Row-mode biases are per rank, shape ``(world, out)``: the effective bias
    is their sum (TE's reference does ``b.sum(0)``).
    """
    g = torch.Generator().manual_seed(seed)
    case: dict[str, Any] = dict(kind=kind, mode=mode, sp=sp, dtype=dtype, recipe=recipe, steps=steps, bias=bias)
    case["x"] = representable((batch, in_features), dtype, g)
    if kind == "mlp":
        case["w1"] = representable((hidden, in_features), dtype, g, in_features ** -0.5)
        case["b1"] = representable((hidden,), dtype, g)
        case["w2"] = representable((out_features, hidden), dtype, g, hidden ** -0.5)
        case["b2"] = representable((world, out_features), dtype, g)
    else:
        case["w"] = representable((out_features, in_features), dtype, g, in_features ** -0.5)
        if kind in ("linear", "ln_linear") and bias:
            case["b"] = representable((world, out_features) if mode == "row" else (out_features,), dtype, g)
    case["dy"] = representable((batch, out_features), dtype, g)
    case["reference"] = _reference(case)
    return case


def _reference(case: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Plain torch in float64 on the full tensors: outputs and gradients."""
    leaves = {k: case[k].clone().requires_grad_() for k in ("x", "w", "b", "w1", "b1", "w2", "b2") if k in case}
    x = leaves["x"]
    if case["kind"] == "mlp":
        h = F.gelu(x, approximate="tanh") @ leaves["w1"].t() + leaves["b1"]
        y = F.gelu(F.gelu(h, approximate="tanh") @ leaves["w2"].t() + leaves["b2"].sum(0), approximate="tanh")
    else:
        if case["kind"] == "ln_linear":
            x = F.layer_norm(x, x.shape[-1:], eps=1e-5)
        y = x @ leaves["w"].t()
        if "b" in leaves:
            y = y + (leaves["b"].sum(0) if leaves["b"].dim() == 2 else leaves["b"])
    y.backward(case["dy"])
    out = {"y": y.detach()}
    out.update({f"d{k}": v.grad for k, v in leaves.items()})
    return out


# ------------------------------------------------------------------ slicing
def _input_dims(case: dict[str, Any]) -> tuple[Optional[int], Optional[int]]:
    """Dims along which this rank's x and y are shards of the full ones (None: replicated)."""
    mode, sp = case["mode"], case["sp"]
    if case["kind"] == "mlp":
        return (0, 0) if sp else (None, None)
    if mode == "column":
        return (0 if sp else None), 1
    return 1, (0 if sp else None)


def _param_dims(case: dict[str, Any]) -> dict[str, Optional[int]]:
    """Dim along which each parameter is sharded; "rank" for per-rank row biases."""
    if case["kind"] == "mlp":
        return {"w1": 0, "b1": 0, "w2": 1, "b2": "rank"}
    dims: dict[str, Any] = {"w": 0 if case["mode"] == "column" else 1}
    if "b" in case:
        dims["b"] = 0 if case["mode"] == "column" else "rank"
    return dims


def _local(t: torch.Tensor, dim: Any, rank: int, world: int) -> torch.Tensor:
    if dim is None:
        return t
    if dim == "rank":
        return t[rank]
    return shard(t, dim, rank, world)


def expected(case: dict[str, Any], rank: int, world: int) -> dict[str, torch.Tensor]:
    """This rank's part of the float64 reference (a per-rank row bias gets the full ``dy.sum(0)``)."""
    ref = case["reference"]
    x_dim, y_dim = _input_dims(case)
    out = {"y": _local(ref["y"], y_dim, rank, world), "dx": _local(ref["dx"], x_dim, rank, world)}
    for name, dim in _param_dims(case).items():
        out[f"d{name}"] = _local(ref[f"d{name}"], dim, rank, world)
    return out


# ------------------------------------------------------------------ the rank side
def build_model(case: dict[str, Any], device: torch.device, group: Any = None) -> torch.nn.Module:
    kind, mode, sp, dtype = case["kind"], case["mode"], case["sp"], case["dtype"]
    tp = dict(tensor_parallel_group=group, sequence_parallel=sp, device=device, dtype=dtype)
    if kind == "basic_linear":
        out_f, in_f = case["w"].shape
        return refops.ops.BasicLinear(in_f, out_f, tensor_parallel_mode=mode, **tp)
    if kind in ("linear", "ln_linear"):
        out_f, in_f = case["w"].shape
        linear = refops.ops.Linear(in_f, out_f, bias=case["bias"], tensor_parallel_mode=mode, **tp)
        if kind == "linear":
            return linear
        return refops.ops.Sequential(refops.ops.LayerNorm(in_f, device=device, dtype=dtype), linear)
    hidden, in_f = case["w1"].shape
    out_f = case["w2"].shape[0]
    return refops.ops.Sequential(
        refops.ops.GELU(),
        refops.ops.Linear(in_f, hidden, tensor_parallel_mode="column", **tp),
        refops.ops.GELU(),
        refops.ops.Linear(hidden, out_f, tensor_parallel_mode="row", **tp),
        refops.ops.GELU(),
    )


def _parameters(case: dict[str, Any], model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    if case["kind"] == "mlp":
        return {"w1": model[1].weight, "b1": model[1].bias, "w2": model[3].weight, "b2": model[3].bias}
    linear = model[1] if case["kind"] == "ln_linear" else model
    params = {"w": linear.weight}
    if "b" in case:
        params["b"] = linear.bias
    return params


def run_case(case: dict[str, Any], rank: int, world: int, device: torch.device, group: Any = None
             ) -> dict[str, torch.Tensor]:
    """Run one case on this rank (``steps`` forward/backward passes); return its last outputs and grads.

    Under a recipe it also returns the input quantizer's amax and scale after the last step
    (keys ``amax`` and ``scale``, where the quantizer has them).
    """
    dtype = case["dtype"]
    model = build_model(case, device, group)
    params = _parameters(case, model)
    with torch.no_grad():
        for name, dim in _param_dims(case).items():
            params[name].copy_(_local(case[name], dim, rank, world).to(device=device, dtype=dtype))
    x_dim, y_dim = _input_dims(case)
    x = _local(case["x"], x_dim, rank, world).to(device=device, dtype=dtype)
    dy = _local(case["dy"], y_dim, rank, world).to(device=device, dtype=dtype)
    recipe = make_recipe(case["recipe"]) if case["recipe"] else None
    for _ in range(case["steps"]):
        for p in params.values():
            p.grad = None
        x_in = x.clone().requires_grad_()
        context = (refops.autocast(recipe=recipe, amax_reduction_group=group or dist.group.WORLD) if recipe
                   else contextlib.nullcontext())
        with context:
            y = model(x_in)
        y.backward(dy)
    out = {"y": y.detach(), "dx": x_in.grad}
    out.update({f"d{name}": p.grad for name, p in params.items()})
    if recipe is not None:
        out.update(_input_quantizer_state(model))
    return {k: v.detach().to("cpu", torch.float64) for k, v in out.items()}


def _input_quantizer_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    linears = [m for m in model.modules() if isinstance(m, refops.ops.BasicLinear)]
    quantizer = linears[0].get_quantizer("forward", 0)
    state = {}
    for name in ("amax", "scale"):
        value = getattr(quantizer, name, None)
        if isinstance(value, torch.Tensor):
            state[name] = value.clone()
    return state
