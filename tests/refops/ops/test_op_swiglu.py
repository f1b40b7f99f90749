"""SwiGLU, SiTUGLU and ClampedSwiGLU (TE's SwiGLU family) against float64 formulas, plain and interleaved."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from refops.ops.basic.scaled_activation import ScaledSiTUGLU
from refops.ops.basic.swiglu import ClampedSwiGLU, SiTUGLU, SwiGLU

from _activation_references import DTYPES, clamped_swiglu_ref, gated, run_and_check, situglu_ref


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleave", (None, 4))
def test_swiglu(dtype, interleave, device):
    op = SwiGLU(glu_interleave_size=interleave)
    run_and_check(op, lambda x: gated(F.silu)(x, interleave), (3, 5, 48), (3, 5, 24), dtype, device)


def test_interleaved_swiglu(device):
    op = SwiGLU(glu_interleave_size=32)
    run_and_check(op, lambda x: gated(F.silu)(x, 32), (32, 384), (32, 192), torch.float32, device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleave", (None, 32))
@pytest.mark.parametrize("betas", ((4.0, 25.0), (0.5, 2.0)))
def test_situglu(dtype, interleave, betas, device):
    beta1, beta2 = betas
    op = SiTUGLU(beta1=beta1, beta2=beta2, glu_interleave_size=interleave)
    reference = lambda x: situglu_ref(x, beta1, beta2, interleave)  # noqa: E731
    run_and_check(op, reference, (16, 128), (16, 64), dtype, device)


@pytest.mark.parametrize("op_class", (SiTUGLU, ScaledSiTUGLU))
@pytest.mark.parametrize(
    "betas, bad", (((0.0, 25.0), "beta1"), ((4.0, math.inf), "beta2"), ((-1.0, 25.0), "beta1"),
                   ((4.0, math.nan), "beta2"))
)
def test_situglu_invalid_beta(op_class, betas, bad):
    with pytest.raises(ValueError, match=bad):
        op_class(beta1=betas[0], beta2=betas[1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("glu_linear_offset", (1.0, 0.0))
def test_clamped_swiglu(dtype, glu_linear_offset, device):
    limit, alpha = 0.75, 1.702
    op = ClampedSwiGLU(limit=limit, alpha=alpha, glu_linear_offset=glu_linear_offset)
    reference = lambda x: clamped_swiglu_ref(x, limit, alpha, glu_linear_offset)  # noqa: E731
    run_and_check(op, reference, (32, 64), (32, 32), dtype, device)


def test_interleaved_clamped_swiglu(device):
    op = ClampedSwiGLU(limit=0.75, glu_interleave_size=32)
    reference = lambda x: clamped_swiglu_ref(x, 0.75, 1.702, 1.0, 32)  # noqa: E731
    run_and_check(op, reference, (32, 384), (32, 192), torch.float32, device)


def test_clamped_swiglu_defaults():
    op = ClampedSwiGLU()
    assert (op.limit, op.alpha, op.glu_linear_offset, op.glu_interleave_size) == (7.0, 1.702, 1.0, None)
    assert (SiTUGLU().beta1, SiTUGLU().beta2) == (4.0, 25.0)


@pytest.mark.parametrize("op_class", (SwiGLU, SiTUGLU, ClampedSwiGLU))
def test_interleave_errors(op_class, device):
    with pytest.raises(ValueError, match=r"divisible by 8"):
        op_class(glu_interleave_size=4)(torch.rand(2, 12, device=device))
    for bad in (0, -2, 2.5, True):
        with pytest.raises(ValueError, match="glu_interleave_size"):
            op_class(glu_interleave_size=bad)
