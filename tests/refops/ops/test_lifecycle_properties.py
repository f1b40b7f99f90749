"""Property-based: random pipelines, random requires_grad patterns, meta vs eager construction.

For every example the lifecycle invariants hold: a meta-built pipeline equals the
eagerly built one bit for bit (outputs, parameters, grads); materialization keeps
every parameter object; aliases stay identical; grads land exactly on the
parameters that require them and that ``named_parameters()`` reports.
"""

from __future__ import annotations

from typing import Callable

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import refops as te

from _cases import aliases_in_sync

# Each entry: (name, build(device, dtype, in_dim, draw) -> (op, out_dim)).
Builder = Callable[..., tuple[torch.nn.Module, int]]

OP_BUILDERS: dict[str, Builder] = {
    "basic_linear": lambda d, t, n, w: (te.ops.BasicLinear(n, w, device=d, dtype=t), w),
    "linear": lambda d, t, n, w: (te.ops.Linear(n, w, device=d, dtype=t), w),
    "linear_no_bias": lambda d, t, n, w: (te.ops.Linear(n, w, bias=False, device=d, dtype=t), w),
    "bias": lambda d, t, n, w: (te.ops.Bias(n, device=d, dtype=t), n),
    "layer_norm": lambda d, t, n, w: (te.ops.LayerNorm(n, device=d, dtype=t), n),
    "rms_norm": lambda d, t, n, w: (te.ops.RMSNorm(n, device=d, dtype=t, zero_centered_gamma=True), n),
    "gelu": lambda d, t, n, w: (te.ops.GELU(), n),
    "relu": lambda d, t, n, w: (te.ops.ReLU(), n),
    "swiglu": lambda d, t, n, w: (te.ops.SwiGLU(), n // 2),
    "identity": lambda d, t, n, w: (te.ops.Identity(), n),
    "scale": lambda d, t, n, w: (te.ops.ConstantScale(0.5), n),
    "l2norm": lambda d, t, n, w: (te.ops.L2Normalization(), n),
    "plain_torch": lambda d, t, n, w: (torch.nn.Tanh(), n),  # splits the Sequential into two fusers
}

pipelines = st.lists(
    st.tuples(st.sampled_from(sorted(OP_BUILDERS)), st.sampled_from([4, 8, 12]), st.booleans()),
    min_size=1,
    max_size=5,
)


def _build(spec, device, dtype, construct_on):
    ops, dim = [], 8
    for name, width, _ in spec:
        if name == "swiglu" and dim % 2:
            name = "identity"
        op, dim = OP_BUILDERS[name](construct_on, dtype, dim, width)
        ops.append(op)
    return te.ops.Sequential(*ops)


def _freeze(model, spec):
    """Freeze every parameter of the ops whose spec flag is set (on meta, before materialization)."""
    frozen = set()
    for module, (_, _, freeze) in zip(model, spec):
        if freeze:
            for p in module.parameters():
                p.requires_grad_(False)
                frozen.add(id(p))
    return frozen


def _step(model, x, input_requires_grad):
    x = x.clone().requires_grad_(input_requires_grad)
    y = model(x)
    if y.requires_grad:
        y.backward(torch.linspace(-1, 1, y.numel(), device=y.device).reshape(y.shape).to(y.dtype))
    return y.detach(), x.grad


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=pipelines, input_requires_grad=st.booleans(), bf16=st.booleans())
def test_meta_and_eager_pipelines_agree(spec, input_requires_grad, bf16, device):
    dtype = torch.bfloat16 if bf16 else torch.float32
    x = torch.randn(3, 8, device=device, dtype=dtype)

    torch.manual_seed(0)
    eager = _build(spec, device, dtype, device)
    meta = _build(spec, device, dtype, "meta")
    frozen_eager, frozen_meta = _freeze(eager, spec), _freeze(meta, spec)
    ids_before = [id(p) for p in meta.parameters()]
    assert all(p.is_meta for p in meta.parameters())

    torch.manual_seed(0)
    y_meta, dx_meta = _step(meta, x, input_requires_grad)
    y_eager, dx_eager = _step(eager, x, input_requires_grad)

    assert torch.equal(y_meta, y_eager)
    assert [id(p) for p in meta.parameters()] == ids_before, "materialization replaced a parameter"
    assert aliases_in_sync(meta)
    assert len(ids_before) == len(set(ids_before)), "a parameter is listed twice"
    assert (dx_meta is not None) == input_requires_grad
    if input_requires_grad:
        assert torch.equal(dx_meta, dx_eager)
    for (name, p), q in zip(meta.named_parameters(), eager.parameters()):
        assert p.device == device, name
        assert torch.equal(p, q), name
        if id(p) in frozen_meta:
            assert not p.requires_grad and p.grad is None, name
        else:
            assert p.grad is not None and torch.equal(p.grad, q.grad), name
    assert len(frozen_meta) == len(frozen_eager)
