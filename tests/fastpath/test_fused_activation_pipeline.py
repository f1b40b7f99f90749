"""``Linear -> GELU -> Linear`` on the fast path with its fused activation + quantize kernels against the same
model on the fast path with those seam methods replaced by the reference's composition, on the GPU.

The two backends differ only in the six fused methods (``refops.kernels.fused_activation_interface``): every
other kernel (the GEMMs above all, which match the reference only within tolerance) is the same fast-path kernel
on the same inputs, so any difference is the fused kernels'. Under delayed scaling (two steps: the second casts
with the scales the first recorded) and current scaling, bf16/fp16/fp32, with the first Linear's bias (backward
then runs ``BackwardActivationBias``: ``activation_backward_dbias_*``) and without: the output, the input grad,
every weight grad and the second bias's grad must be bit-identical; the first bias's grad is the fused kernel's
column sum, in another order than torch's, and is held to the bound of fp32 summation on the values the kernel
was given (``assert_dbias_within_fp32_summation``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_activation_quantize_differential import assert_dbias_within_fp32_summation, launched_kernels

import refops
import refops as te
from fastpath.backend import FastpathKernels
from refops.kernels import get_backend
from refops.kernels.reference.fused_activation import FusedActivationReference

RECIPES = {"delayed": te.recipe.DelayedScaling, "current": te.recipe.Float8CurrentScaling}
TOKENS, HIDDEN, FFN, OUT = 96, 256, 512, 128
STEPS = 2
DBIAS_METHODS = ("activation_backward_dbias_cast_float8", "activation_backward_dbias_amax")


class ComposedActivations(FastpathKernels):
    """The fast path, but its fused activation + quantize methods are the reference's composition (of fast-path
    activation and cast kernels, themselves bit-identical with the reference's)."""

    name = "fastpath-composed-activations"
    activation_cast_float8 = FusedActivationReference.activation_cast_float8
    activation_amax = FusedActivationReference.activation_amax
    activation_backward_cast_float8 = FusedActivationReference.activation_backward_cast_float8
    activation_backward_amax = FusedActivationReference.activation_backward_amax
    activation_backward_dbias_cast_float8 = FusedActivationReference.activation_backward_dbias_cast_float8
    activation_backward_dbias_amax = FusedActivationReference.activation_backward_dbias_amax


def run(backend: Any, recipe_name: str, dtype: torch.dtype, bias: bool, device: torch.device) -> list[dict]:
    """Per step: the output, the input grad and every parameter grad (grads cleared between steps)."""
    torch.manual_seed(0)
    model = te.ops.Sequential(te.ops.Linear(HIDDEN, FFN, bias=bias, device=device, dtype=dtype), te.ops.GELU(),
                              te.ops.Linear(FFN, OUT, device=device, dtype=dtype))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.uniform_(-0.5, 0.5)  # a bias that moves the GELU's inputs
    x = (torch.randn(TOKENS, HIDDEN) * 2).to(device=device, dtype=dtype)
    dy = torch.randn(TOKENS, OUT).to(device=device, dtype=dtype)
    steps = []
    with refops.use_backend(backend), te.autocast(recipe=RECIPES[recipe_name]()):
        for _ in range(STEPS):
            xs = x.clone().requires_grad_(True)
            y = model(xs)
            y.backward(dy)
            steps.append({"y": y.detach().clone(), "dx": xs.grad.clone(),
                          **{n: p.grad.clone() for n, p in model.named_parameters()}})
            for p in model.parameters():
                p.grad = None
    return steps


def record_dbias_inputs(monkeypatch, backend: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(dy, x)`` of every fused dbias call on ``backend`` from now on (an instance attribute shadows the method)."""
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    for name in DBIAS_METHODS:
        method = getattr(backend, name)

        def record(grad_output, x, *args, _method=method, **kwargs):
            seen.append((grad_output.detach().clone(), x.detach().clone()))
            return _method(grad_output, x, *args, **kwargs)

        monkeypatch.setattr(backend, name, record, raising=False)
    return seen


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_mlp_with_fused_kernels_is_bit_identical(recipe_name, dtype, bias, cuda, fastpath_backend, monkeypatch):
    launched = launched_kernels(monkeypatch)
    dbias_inputs = record_dbias_inputs(monkeypatch, fastpath_backend)
    fused = run(fastpath_backend, recipe_name, dtype, bias, cuda)
    sfx = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]
    kind = "cast_t" if recipe_name == "delayed" else "amax"
    assert f"act_{kind}_fwd_gelu_{sfx}" in launched and f"act_{kind}_bwd_gelu_{sfx}" in launched, launched
    assert len(dbias_inputs) == (STEPS if bias else 0)
    monkeypatch.undo()  # the composed run: no recording, the real kernels
    composed = run(ComposedActivations(), recipe_name, dtype, bias, cuda)
    for step, (a, e) in enumerate(zip(fused, composed)):
        assert a.keys() == e.keys()
        for key in a:
            what = f"{recipe_name} {dtype} step {step}: {key}"
            if key == "0.bias":
                dy, x = dbias_inputs[step]
                v = get_backend("reference").activation_backward(dy.float(), x.float(), "gelu")
                summands = v if recipe_name == "delayed" else v.to(dtype)  # the scheme's rule
                assert_dbias_within_fp32_summation(a[key], e[key], summands, what)
                continue
            assert a[key].dtype == e[key].dtype and a[key].shape == e[key].shape, what
            assert torch.equal(a[key].view(torch.uint8), e[key].view(torch.uint8)), f"{what} differs"
