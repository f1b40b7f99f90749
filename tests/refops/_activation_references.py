"""Helpers shared by test_op_activations.py, test_op_swiglu.py and test_op_scaled_activations.py.

float64 CPU references of the gated halves, SiTUGLU and clamped SwiGLU, the ``(ref, test)`` tensor
pairs they run on, and the forward + backward comparison of an op against such a reference.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from refops.testing.tolerances import dtype_tols

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def make_tensors(shape, dtype, device, *, low=-3.0, high=3.0, requires_grad=True):
    """``(ref, test)``: the same values, float64 on CPU and ``dtype`` on ``device``."""
    ref = torch.empty(shape, dtype=torch.float64, device="cpu").uniform_(low, high)
    test = ref.to(device=device, dtype=dtype)
    ref = test.detach().to(device="cpu", dtype=torch.float64)
    return ref.requires_grad_(requires_grad), test.requires_grad_(requires_grad)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, **tols) -> None:
    torch.testing.assert_close(actual.detach().to(device="cpu", dtype=torch.float64), expected.detach(), **tols)


def halves(x: torch.Tensor, interleave: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Gate half ``a`` and linear half ``b``; with ``interleave = s`` the last dim is ``[a(s), b(s), ...]``."""
    width = x.shape[-1]
    if interleave is None:
        a_index = list(range(width // 2))
        b_index = [i + width // 2 for i in a_index]
    else:
        a_index = [blk + j for blk in range(0, width, 2 * interleave) for j in range(interleave)]
        b_index = [i + interleave for i in a_index]
    return x[..., a_index], x[..., b_index]


def situglu_ref(x, beta1, beta2, interleave=None):
    a, b = halves(x, interleave)
    return beta1 * torch.tanh(a / beta1) * torch.sigmoid(a) * (beta2 * torch.tanh(b / beta2))


def clamped_swiglu_ref(x, limit, alpha, offset, interleave=None):
    a, b = halves(x, interleave)
    a = a.clamp(max=limit)
    b = b.clamp(min=-limit, max=limit)
    return a * torch.sigmoid(alpha * a) * (b + offset)


def gated(gate: Callable) -> Callable:
    def ref(x, interleave=None):
        a, b = halves(x, interleave)
        return gate(a) * b

    return ref


def run_and_check(op, reference, in_shape, out_shape, dtype, device, tols=None):
    """Forward and backward of ``op`` vs ``reference`` (a float64 function of x)."""
    tols = tols or dtype_tols(dtype)
    x_ref, x_test = make_tensors(in_shape, dtype, device)
    dy_ref, dy_test = make_tensors(out_shape, dtype, device, low=-1.0, high=1.0, requires_grad=False)
    y_ref = reference(x_ref)
    y_ref.backward(dy_ref)
    y_test = op(x_test)
    y_test.backward(dy_test)
    assert y_test.dtype == dtype and x_test.grad.dtype == dtype
    assert tuple(y_test.shape) == tuple(out_shape)
    assert_close(y_test, y_ref, **tols)
    assert_close(x_test.grad, x_ref.grad, **tols)
    return y_test, x_test
