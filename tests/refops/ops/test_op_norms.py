"""LayerNorm, RMSNorm and L2Normalization against float64 PyTorch (TE's TestBasicOps norm tests)."""

from __future__ import annotations

import math

import pytest
import torch

from refops.ops.basic.l2normalization import L2Normalization
from refops.ops.basic.layer_norm import LayerNorm
from refops.ops.basic.rms_norm import RMSNorm
from refops.ops.sequential import Sequential
from refops.testing import dtype_tols

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def make_pair(shape, dtype, device, *, requires_grad=True, low=0.0, high=1.0):
    """``(ref, test)``: float64 CPU and ``dtype`` on ``device`` holding the same (representable) values."""
    ref = torch.empty(shape, dtype=torch.float64, device="cpu").uniform_(low, high)
    test = ref.to(device=device, dtype=dtype).clone()
    ref.copy_(test.to(device="cpu", dtype=torch.float64))
    return ref.requires_grad_(requires_grad), test.requires_grad_(requires_grad)


def to64(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to(device="cpu", dtype=torch.float64)


def full_shape(in_shape, weight_shape):
    return list(in_shape)[:-1] + list(weight_shape)


def rms_norm_ref(x, w, weight_shape, eps, zero_centered_gamma):
    inner = tuple(range(x.dim() - len(weight_shape), x.dim()))
    mean_sq = x.square().sum(dim=inner, keepdim=True) / math.prod(weight_shape)
    return x / torch.sqrt(mean_sq + eps) * ((1 + w) if zero_centered_gamma else w)


# ---------------------------------------------------------------- LayerNorm
@pytest.mark.parametrize("weight_shape", ((7, 2), (32,)))
@pytest.mark.parametrize("in_shape", ((-1,), (6, 16, -1)))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("zero_centered_gamma", (False, True))
def test_layer_norm(weight_shape, in_shape, dtype, zero_centered_gamma, device, eps=0.3):
    shape = full_shape(in_shape, weight_shape)
    x_ref, x = make_pair(shape, dtype, device)
    w_ref, w = make_pair(weight_shape, dtype, device)
    b_ref, b = make_pair(weight_shape, dtype, device)
    dy_ref, dy = make_pair(shape, dtype, device, requires_grad=False)

    y_ref = torch.nn.functional.layer_norm(
        x_ref, weight_shape, weight=(w_ref + 1 if zero_centered_gamma else w_ref), bias=b_ref, eps=eps
    )
    y_ref.backward(dy_ref)

    op = LayerNorm(weight_shape, eps=eps, device=device, dtype=dtype, zero_centered_gamma=zero_centered_gamma)
    with torch.no_grad():
        op.weight.copy_(w)
        op.bias.copy_(b)
    y = Sequential(op)(x)
    y.backward(dy)

    tols = dtype_tols(dtype)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(to64(y), y_ref, **tols)
    torch.testing.assert_close(to64(x.grad), x_ref.grad, **tols)
    torch.testing.assert_close(to64(op.weight.grad), w_ref.grad, **tols)
    torch.testing.assert_close(to64(op.bias.grad), b_ref.grad, **tols)


@pytest.mark.parametrize("zero_centered_gamma", (False, True))
def test_layer_norm_init_values(zero_centered_gamma, device):
    op = LayerNorm((3, 4), device=device, zero_centered_gamma=zero_centered_gamma)
    assert op.eps == 1e-5 and op.normalized_shape == (3, 4)
    assert [name for name, _ in op.named_parameters()] == ["weight", "bias"]
    expected_weight = 0.0 if zero_centered_gamma else 1.0
    torch.testing.assert_close(op.weight.cpu(), torch.full((3, 4), expected_weight, device="cpu"), rtol=0, atol=0)
    torch.testing.assert_close(op.bias.cpu(), torch.zeros(3, 4, device="cpu"), rtol=0, atol=0)
    # Either way the fresh op is a plain normalization.
    x = torch.randn(5, 3, 4)
    expected = torch.nn.functional.layer_norm(x.double().cpu(), (3, 4), eps=1e-5)
    torch.testing.assert_close(to64(op(x)), expected, **dtype_tols(torch.float32))


def test_layer_norm_rejects_bad_input(device):
    op = LayerNorm((7, 2), device=device)
    with pytest.raises(ValueError, match="does not end with normalized_shape"):
        op(torch.randn(4, 2, 7))
    with pytest.raises(ValueError, match="does not end with normalized_shape"):
        op(torch.randn(2))
    with pytest.raises(TypeError, match="dtype"):
        op(torch.randn(4, 7, 2, dtype=torch.float16))
    with pytest.raises(ValueError, match="normalized_shape"):
        LayerNorm((4, 0))
    with pytest.raises(ValueError, match="sm_margin"):
        LayerNorm(4, sm_margin={"fwd": 2})


def test_layer_norm_sm_margin_is_recorded(device):
    assert LayerNorm(4, sm_margin=3)._sm_margins == {"forward": 3, "backward": 3, "inference": 3}
    assert RMSNorm(4, sm_margin={"backward": 1})._sm_margins == {"forward": 0, "backward": 1, "inference": 0}


# ------------------------------------------------------------------ RMSNorm
@pytest.mark.parametrize("weight_shape", ((19,), (64,), (7, 2)))
@pytest.mark.parametrize("in_shape", ((-1,), (6, 16, -1)))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("zero_centered_gamma", (False, True))
def test_rmsnorm(weight_shape, in_shape, dtype, zero_centered_gamma, device, eps=0.3):
    shape = full_shape(in_shape, weight_shape)
    x_ref, x = make_pair(shape, dtype, device)
    w_ref, w = make_pair(weight_shape, dtype, device)
    dy_ref, dy = make_pair(shape, dtype, device, requires_grad=False)

    y_ref = rms_norm_ref(x_ref, w_ref, weight_shape, eps, zero_centered_gamma)
    y_ref.backward(dy_ref)

    op = RMSNorm(weight_shape, eps=eps, device=device, dtype=dtype, zero_centered_gamma=zero_centered_gamma)
    with torch.no_grad():
        op.weight.copy_(w)
    y = Sequential(op)(x)
    y.backward(dy)

    tols = dtype_tols(dtype)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(to64(y), y_ref, **tols)
    torch.testing.assert_close(to64(x.grad), x_ref.grad, **tols)
    torch.testing.assert_close(to64(op.weight.grad), w_ref.grad, **tols)


@pytest.mark.parametrize("zero_centered_gamma", (False, True))
def test_rmsnorm_init_values(zero_centered_gamma, device):
    op = RMSNorm(8, device=device, zero_centered_gamma=zero_centered_gamma)
    assert op.eps == 1e-5 and op.normalized_shape == (8,)
    assert [name for name, _ in op.named_parameters()] == ["weight"]
    expected_weight = 0.0 if zero_centered_gamma else 1.0
    torch.testing.assert_close(op.weight, torch.full((8,), expected_weight), rtol=0, atol=0)


def test_rmsnorm_rejects_bad_input(device):
    op = RMSNorm(8, device=device)
    with pytest.raises(ValueError, match="does not end with normalized_shape"):
        op(torch.randn(3, 9))
    with pytest.raises(TypeError, match="dtype"):
        op(torch.randn(3, 8, dtype=torch.bfloat16))


# ------------------------------------------------------- meta construction
@pytest.mark.parametrize("make_op", (
    lambda **kw: LayerNorm((6, 8), eps=0.3, **kw),
    lambda **kw: LayerNorm(8, zero_centered_gamma=True, **kw),
    lambda **kw: RMSNorm(8, eps=0.3, **kw),
    lambda **kw: RMSNorm((6, 8), zero_centered_gamma=True, **kw),
), ids=("layer_norm", "layer_norm_zcg", "rmsnorm", "rmsnorm_zcg"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_meta_construction_matches_eager(make_op, dtype, device):
    x = torch.rand(4, 6, 8, device=device, dtype=dtype)
    dy = torch.rand(4, 6, 8, device=device, dtype=dtype)

    torch.manual_seed(7)
    eager = make_op(device=device, dtype=dtype)
    torch.manual_seed(7)
    meta = make_op(device="meta", dtype=dtype)
    assert all(p.is_meta for p in meta.parameters())

    results = []
    for op in (eager, meta):
        x_test = x.clone().requires_grad_()
        y = op(x_test)
        y.backward(dy)
        results.append((y, x_test.grad, [p.grad for p in op.parameters()]))
    assert all(p.device == device and not p.is_meta for p in meta.parameters())
    (y_e, dx_e, dp_e), (y_m, dx_m, dp_m) = results
    torch.testing.assert_close(y_m, y_e, rtol=0, atol=0)
    torch.testing.assert_close(dx_m, dx_e, rtol=0, atol=0)
    for g_m, g_e in zip(dp_m, dp_e):
        torch.testing.assert_close(g_m, g_e, rtol=0, atol=0)


# ---------------------------------------------------------------- autocast
@pytest.mark.parametrize("kind", ("layer_norm", "rmsnorm"))
def test_norm_under_autocast(kind, device, eps=0.3, shape=(4, 16)):
    """fp32 params under bf16 autocast: bf16 output, fp32 grads in the fp32 params and input."""
    x_ref, x = make_pair(shape, torch.bfloat16, device)
    w_ref, w = make_pair(shape[-1:], torch.bfloat16, device)
    b_ref, b = make_pair(shape[-1:], torch.bfloat16, device)
    dy_ref, dy = make_pair(shape, torch.bfloat16, device, requires_grad=False)
    x = x.detach().float().requires_grad_()

    if kind == "layer_norm":
        y_ref = torch.nn.functional.layer_norm(x_ref, shape[-1:], weight=w_ref, bias=b_ref, eps=eps)
        op = LayerNorm(shape[-1], eps=eps, device=device, dtype=torch.float32)
    else:
        y_ref = rms_norm_ref(x_ref, w_ref, shape[-1:], eps, False)
        op = RMSNorm(shape[-1], eps=eps, device=device, dtype=torch.float32)
    y_ref.backward(dy_ref)
    with torch.no_grad():
        op.weight.copy_(w)
        if kind == "layer_norm":
            op.bias.copy_(b)

    with torch.autocast(device.type, dtype=torch.bfloat16):
        y = op(x)
    y.backward(dy)

    assert y.dtype == torch.bfloat16
    assert x.grad.dtype == torch.float32
    assert all(p.grad.dtype == torch.float32 for p in op.parameters())
    tols = dtype_tols(torch.bfloat16)
    torch.testing.assert_close(to64(y), y_ref, **tols)
    torch.testing.assert_close(to64(x.grad), x_ref.grad, **tols)
    torch.testing.assert_close(to64(op.weight.grad), w_ref.grad, **tols)
    if kind == "layer_norm":
        torch.testing.assert_close(to64(op.bias.grad), b_ref.grad, **tols)


def test_norm_inference_matches_training_forward(device):
    op = LayerNorm(16, eps=0.3, device=device)
    with torch.no_grad():
        op.weight.uniform_()
        op.bias.uniform_()
    x = torch.rand(3, 16)
    y_train = op(x.clone().requires_grad_())
    with torch.no_grad():
        y_infer = op(x)
    assert not y_infer.requires_grad
    torch.testing.assert_close(y_infer, y_train.detach(), rtol=0, atol=0)


# --------------------------------------------------------- L2Normalization
@pytest.mark.parametrize("in_shape", ((32,), (6, 16, 64), (32, 64)))
@pytest.mark.parametrize("dtype", DTYPES)
def test_l2normalization(in_shape, dtype, device, eps=1e-6):
    x_ref, x = make_pair(in_shape, dtype, device)
    dy_ref, dy = make_pair(in_shape, dtype, device, requires_grad=False)

    y_ref = x_ref * torch.rsqrt(x_ref.pow(2).sum(dim=-1, keepdim=True) + eps)
    y_ref.backward(dy_ref)

    op = L2Normalization(eps=eps)
    assert list(op.parameters()) == []
    y = op(x)
    y.backward(dy)

    tols = dtype_tols(dtype)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(to64(y), y_ref, **tols)
    torch.testing.assert_close(to64(x.grad), x_ref.grad, **tols)


def test_l2normalization_large_eps_and_options(device, eps=0.3):
    """A large eps shows it is added to the sum of squares (not the norm); JIT options are accepted."""
    x_ref, x = make_pair((5, 8), torch.float32, device, low=-1.0)
    dy_ref, dy = make_pair((5, 8), torch.float32, device, requires_grad=False, low=-1.0)
    y_ref = x_ref / torch.sqrt(x_ref.square().sum(-1, keepdim=True) + eps)
    y_ref.backward(dy_ref)
    op = L2Normalization(eps=eps, seq_length=128, micro_batch_size=2)
    assert L2Normalization().eps == 1e-6
    y = Sequential(op)(x)
    y.backward(dy)
    tols = dtype_tols(torch.float32)
    torch.testing.assert_close(to64(y), y_ref, **tols)
    torch.testing.assert_close(to64(x.grad), x_ref.grad, **tols)


def test_l2normalization_under_autocast(device, eps=1e-6):
    x_ref, x = make_pair((4, 32), torch.bfloat16, device)
    x = x.detach().float().requires_grad_()
    dy_ref, dy = make_pair((4, 32), torch.bfloat16, device, requires_grad=False)
    y_ref = x_ref * torch.rsqrt(x_ref.square().sum(-1, keepdim=True) + eps)
    y_ref.backward(dy_ref)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        y = L2Normalization(eps=eps)(x)
    y.backward(dy)
    assert y.dtype == torch.bfloat16 and x.grad.dtype == torch.float32
    tols = dtype_tols(torch.bfloat16)
    torch.testing.assert_close(to64(y), y_ref, **tols)
    torch.testing.assert_close(to64(x.grad), x_ref.grad, **tols)


def test_l2normalization_rejects_bad_input(device):
    op = L2Normalization()
    with pytest.raises(TypeError, match="unsupported dtype"):
        op(torch.rand(3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="0-d"):
        op(torch.tensor(2.0))
