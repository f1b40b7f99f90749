"""Fused ops in fp16/bf16 meet TE's per-dtype tolerances against a float64 reference (``docs/te-ops.md#tolerances``).

TE's fused kernels (GEMM epilogues, ``beta = 1`` accumulation, ``rmsnorm_bwd_add``)
keep intermediates in fp32 and round once; so must the reference. Each pipeline
runs fused and unfused; the float64 reference is computed from the same
(low-precision) inputs, parameters and output grads. The unfused composition
rounds where its ops meet, so its reference rounds there too: each basic op is
then held to the same tolerance on its own.
"""

from __future__ import annotations

from typing import Callable

import pytest
import torch

import refops as te
from refops.ops.fuser import OperationFuser
from refops.testing import dtype_tols

ROWS, IN, OUT = 64, 96, 80
SCALE = -0.3  # not a power of two: a scale applied twice would round differently


class _RoundAtBoundary(torch.autograd.Function):
    """Where two unfused ops meet, the value (forward) and its grad (backward) are rounded to ``dtype``."""

    @staticmethod
    def forward(ctx, t, dtype):
        ctx.dtype = dtype
        return t.to(dtype).double()

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.dtype).double(), None


def _boundary(dtype):
    """The rounding between ops: none for a fused op (one rounding at the end), ``dtype`` for the composition."""
    if dtype is None:
        return lambda t: t
    return lambda t: _RoundAtBoundary.apply(t, dtype)


def _rmsnorm64(x, w, eps):
    rstd = torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    return x * rstd * w


# name -> (build(device, dtype), extra input?, reference(x, extra, params, grads, r) -> (outs, dx, dextra, dparams))
def _linear_bias(device, dtype):
    return te.ops.Sequential(te.ops.Linear(IN, OUT, device=device, dtype=dtype))


def _linear_bias_add(device, dtype):
    return te.ops.Sequential(te.ops.Linear(IN, OUT, device=device, dtype=dtype), te.ops.AddExtraInput(in_place=True))


def _linear_scale_add(device, dtype):
    return te.ops.Sequential(te.ops.Linear(IN, OUT, bias=False, device=device, dtype=dtype),
                             te.ops.ConstantScale(SCALE), te.ops.AddExtraInput(in_place=True))


def _linear_add_backward(device, dtype):
    return te.ops.Sequential(te.ops.MakeExtraOutput(in_place=True),
                             te.ops.Linear(IN, OUT, bias=False, device=device, dtype=dtype))


def _linear_scale_backward(device, dtype):
    return te.ops.Sequential(te.ops.Linear(IN, OUT, bias=False, device=device, dtype=dtype),
                             te.ops.ConstantScale(SCALE))


def _add_rmsnorm_backward(device, dtype):
    return te.ops.Sequential(te.ops.MakeExtraOutput(), te.ops.RMSNorm(IN, device=device, dtype=dtype, eps=0.3))


def _ref_linear(x, extra, params, grads, r, *, scale=1.0, add=False):
    """y = scale * x W^T (+ b) (+ e) and its grads, float64 on autograd, rounded by ``r`` between ops."""
    leaves = [t.detach().double().requires_grad_() for t in (x, *extra, *params)]
    x64, rest = leaves[0], leaves[1:]
    e64 = rest[: len(extra)]
    w64, *b64 = rest[len(extra):]
    y = r(x64 @ w64.t())
    if b64:
        y = r(y + b64[0])
    if scale != 1.0:
        y = r(scale * y)
    if add:
        y = y + e64[0]
    y.backward(grads[0].double())
    return [y], x64.grad, [e.grad for e in e64], [p.grad for p in rest[len(extra):]]


def _ref_make_extra_output(x, extra, params, grads, r, *, body: Callable):
    """(body(x), x) where the extra output x is also returned; dx = body'(dy) + g."""
    x64 = x.detach().double().requires_grad_()
    p64 = [p.detach().double().requires_grad_() for p in params]
    y = body(r(x64), p64)
    torch.autograd.backward([y, x64 * 1.0], [g.double() for g in grads])
    return [y, x.double()], x64.grad, [], [p.grad for p in p64]


PIPELINES = {
    "ForwardLinearBiasActivation": (_linear_bias, False, lambda *a: _ref_linear(*a)),
    "ForwardLinearBiasAdd": (_linear_bias_add, True, lambda *a: _ref_linear(*a, add=True)),
    "ForwardLinearScaleAdd": (_linear_scale_add, True, lambda *a: _ref_linear(*a, scale=SCALE, add=True)),
    "BackwardLinearAdd": (_linear_add_backward, False,
                          lambda *a: _ref_make_extra_output(*a, body=lambda x, p: x @ p[0].t())),
    "BackwardLinearScale": (_linear_scale_backward, False, lambda *a: _ref_linear(*a, scale=SCALE)),
    "BackwardAddRMSNorm": (_add_rmsnorm_backward, False,
                           lambda *a: _ref_make_extra_output(*a, body=lambda x, p: _rmsnorm64(x, p[0], 0.3))),
}


@pytest.fixture(params=["fused", "unfused"])
def fusion(request):
    """Run each pipeline fused, and as its unfused composition of basic ops."""
    if request.param == "fused":
        yield "fused"
        return
    saved = [list(OperationFuser.forward_fusion_functions), list(OperationFuser.backward_fusion_functions)]
    OperationFuser.forward_fusion_functions.clear()
    OperationFuser.backward_fusion_functions.clear()
    yield "unfused"
    OperationFuser.forward_fusion_functions[:] = saved[0]
    OperationFuser.backward_fusion_functions[:] = saved[1]


def _planned_ops(model) -> list[str]:
    fuser = model._module_groups[0]
    return [type(op).__name__ for op, _ in fuser._forward_ops + fuser._backward_ops]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(PIPELINES))
def test_fused_op_meets_dtype_tolerances_against_float64(name, dtype, fusion, device):
    build, has_extra, reference = PIPELINES[name]
    torch.manual_seed(7)
    model = build(device, dtype)
    with torch.no_grad():  # gamma away from 1, so the norm's backward is not trivially exact
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    x = torch.randn(ROWS, IN, device=device, dtype=dtype).requires_grad_()
    extra = (torch.randn(ROWS, OUT, device=device, dtype=dtype),) if has_extra else ()
    extra_in = tuple(e.clone().requires_grad_() for e in extra)
    out = model(x, *extra_in)
    outs = out if isinstance(out, tuple) else (out,)
    grads = [torch.randn(o.shape, device=device, dtype=dtype) for o in outs]
    torch.autograd.backward(outs, [g.clone() for g in grads])  # an in-place extra output accumulates into its grad
    planned = _planned_ops(model)
    assert (name in planned) == (fusion == "fused"), planned

    params = list(model.parameters())
    rounding = _boundary(None if fusion == "fused" else dtype)
    ref_outs, ref_dx, ref_dextra, ref_dparams = reference(x, extra, params, grads, rounding)
    tols = dtype_tols(dtype)
    for i, (got, want) in enumerate(zip(outs, ref_outs)):
        torch.testing.assert_close(got.double(), want, **tols, msg=lambda m: f"{name} output {i}: {m}")
    torch.testing.assert_close(x.grad.double(), ref_dx, **tols, msg=lambda m: f"{name} dx: {m}")
    for got, want in zip(extra_in, ref_dextra):
        torch.testing.assert_close(got.grad.double(), want, **tols, msg=lambda m: f"{name} d(extra): {m}")
    for (pname, p), want in zip(model.named_parameters(), ref_dparams):
        torch.testing.assert_close(p.grad.double(), want, **tols, msg=lambda m: f"{name} d{pname}: {m}")
