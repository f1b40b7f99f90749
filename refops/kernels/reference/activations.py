"""Activation functions and their derivatives, in fp32, as a table.

Every unary activation is a pair ``(f, f')`` of fp32 functions. A gated
activation splits the last dim into halves ``a`` (first half) and ``b`` (second
half) and computes ``gate(a) * lin(b)``; the gate is applied to the **first**
half (TransformerEngine's convention; ``torch.nn.functional.glu`` gates the
second half).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

__all__ = ["UNARY", "GATED", "is_gated", "unary_forward", "unary_derivative", "gated_forward", "gated_backward"]

Fn = Callable[..., torch.Tensor]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715
_QGELU_ALPHA = 1.702


def _fp32(value: float) -> torch.Tensor:
    """``value`` as a 0-dim fp32 tensor on the CPU, for the formulas' fixed constants.

    An element-wise op rounds a Python-float operand to fp32 before it computes, and treats a
    0-dim CPU tensor the same way (on CUDA too), so the bits do not change. What changes is the
    cost: wrapping a Python number on every call makes an op on a small tensor 2.1 us instead of
    0.9 us, and these formulas are most of an activation's host time.
    """
    return torch.tensor(value, dtype=torch.float32, device="cpu")


_HALF, _ONE, _TWO = _fp32(0.5), _fp32(1.0), _fp32(2.0)
_SQRT_2_OVER_PI_32, _GELU_CUBIC_32, _QGELU_ALPHA_32 = _fp32(_SQRT_2_OVER_PI), _fp32(_GELU_CUBIC), _fp32(_QGELU_ALPHA)
_GELU_CUBIC_SLOPE_32 = _fp32(3.0 * _GELU_CUBIC)  # d/dx of the cubic term, one constant as before


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    return _HALF * x * (_ONE + torch.tanh(_SQRT_2_OVER_PI_32 * (x + _GELU_CUBIC_32 * x * x * x)))


def _gelu_tanh_derivative(x: torch.Tensor) -> torch.Tensor:
    inner = _SQRT_2_OVER_PI_32 * (x + _GELU_CUBIC_32 * x * x * x)
    t = torch.tanh(inner)
    dinner = _SQRT_2_OVER_PI_32 * (_ONE + _GELU_CUBIC_SLOPE_32 * x * x)
    return _HALF * (_ONE + t) + _HALF * x * (_ONE - t * t) * dinner


def _qgelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(_QGELU_ALPHA_32 * x)


def _qgelu_derivative(x: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(_QGELU_ALPHA_32 * x)
    return s + _QGELU_ALPHA_32 * x * s * (_ONE - s)


def _relu(x: torch.Tensor) -> torch.Tensor:
    return torch.clamp_min(x, 0.0)


def _relu_derivative(x: torch.Tensor) -> torch.Tensor:
    return (x > 0).to(x.dtype)


def _srelu(x: torch.Tensor) -> torch.Tensor:
    r = torch.clamp_min(x, 0.0)
    return r * r


def _srelu_derivative(x: torch.Tensor) -> torch.Tensor:
    return _TWO * torch.clamp_min(x, 0.0)


def _silu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def _silu_derivative(x: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(x)
    return s + x * s * (_ONE - s)


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x)


def _sigmoid_derivative(x: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(x)
    return s * (_ONE - s)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _identity_derivative(x: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(x)


#: name -> (f, f') for unary activations, all in fp32.
UNARY: dict[str, tuple[Fn, Fn]] = {
    "identity": (_identity, _identity_derivative),
    "gelu": (_gelu_tanh, _gelu_tanh_derivative),
    "qgelu": (_qgelu, _qgelu_derivative),
    "relu": (_relu, _relu_derivative),
    "srelu": (_srelu, _srelu_derivative),
    "silu": (_silu, _silu_derivative),
    "sigmoid": (_sigmoid, _sigmoid_derivative),
}


@dataclass(frozen=True)
class GatedActivation:
    """``y = gate(a) * lin(b)`` with the derivatives of each factor.

    ``gate``/``gate_derivative`` act on the first half, ``lin``/``lin_derivative`` on
    the second; every function takes the half and the activation's parameters.
    """

    gate: Fn
    gate_derivative: Fn
    lin: Fn
    lin_derivative: Fn


def _plain(x: torch.Tensor, **_: Any) -> torch.Tensor:
    return x


def _ones(x: torch.Tensor, **_: Any) -> torch.Tensor:
    return torch.ones_like(x)


def _from_unary(name: str) -> GatedActivation:
    f, df = UNARY[name]
    return GatedActivation(lambda a, **_: f(a), lambda a, **_: df(a), _plain, _ones)


# ClampedSwiGLU: a' = min(a, limit), b' = clamp(b, -limit, limit),
# y = a' * sigmoid(alpha a') * (b' + glu_linear_offset). Clamps pass the gradient
# where the bound is not active (bounds inclusive, like torch.clamp).
def _clamped_gate(a: torch.Tensor, *, limit: float, alpha: float, **_: Any) -> torch.Tensor:
    ac = torch.clamp_max(a, limit)
    return ac * torch.sigmoid(alpha * ac)


def _clamped_gate_derivative(a: torch.Tensor, *, limit: float, alpha: float, **_: Any) -> torch.Tensor:
    ac = torch.clamp_max(a, limit)
    s = torch.sigmoid(alpha * ac)
    d = s + alpha * ac * s * (1.0 - s)
    return torch.where(a <= limit, d, torch.zeros_like(d))


def _clamped_lin(b: torch.Tensor, *, limit: float, glu_linear_offset: float, **_: Any) -> torch.Tensor:
    return torch.clamp(b, -limit, limit) + glu_linear_offset


def _clamped_lin_derivative(b: torch.Tensor, *, limit: float, **_: Any) -> torch.Tensor:
    inside = (b >= -limit) & (b <= limit)
    return inside.to(b.dtype)


# SiTU-GLU: y = beta1 tanh(a / beta1) sigmoid(a) * beta2 tanh(b / beta2).
def _situ_gate(a: torch.Tensor, *, beta1: float, **_: Any) -> torch.Tensor:
    return beta1 * torch.tanh(a / beta1) * torch.sigmoid(a)


def _situ_gate_derivative(a: torch.Tensor, *, beta1: float, **_: Any) -> torch.Tensor:
    t = torch.tanh(a / beta1)
    s = torch.sigmoid(a)
    return (1.0 - t * t) * s + beta1 * t * s * (1.0 - s)


def _situ_lin(b: torch.Tensor, *, beta2: float, **_: Any) -> torch.Tensor:
    return beta2 * torch.tanh(b / beta2)


def _situ_lin_derivative(b: torch.Tensor, *, beta2: float, **_: Any) -> torch.Tensor:
    t = torch.tanh(b / beta2)
    return 1.0 - t * t


#: name -> gated activation.
GATED: dict[str, GatedActivation] = {
    "glu": _from_unary("sigmoid"),
    "geglu": _from_unary("gelu"),
    "qgeglu": _from_unary("qgelu"),
    "reglu": _from_unary("relu"),
    "sreglu": _from_unary("srelu"),
    "swiglu": _from_unary("silu"),
    "clamped_swiglu": GatedActivation(
        _clamped_gate, _clamped_gate_derivative, _clamped_lin, _clamped_lin_derivative
    ),
    "situglu": GatedActivation(_situ_gate, _situ_gate_derivative, _situ_lin, _situ_lin_derivative),
}


def is_gated(activation: str) -> bool:
    """Whether ``activation`` halves the last dim."""
    if activation in GATED:
        return True
    if activation in UNARY:
        return False
    raise ValueError(f"unknown activation {activation!r}; known: {sorted(UNARY) + sorted(GATED)}")


def unary_forward(x32: torch.Tensor, activation: str) -> torch.Tensor:
    return UNARY[activation][0](x32)


def unary_derivative(x32: torch.Tensor, activation: str) -> torch.Tensor:
    return UNARY[activation][1](x32)


def _halves(x32: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if x32.shape[-1] % 2 != 0:
        raise ValueError(f"a gated activation needs an even last dim, got shape {tuple(x32.shape)}")
    return x32.chunk(2, dim=-1)


def gated_forward(x32: torch.Tensor, activation: str, **params: Any) -> torch.Tensor:
    g = GATED[activation]
    a, b = _halves(x32)
    return g.gate(a, **params) * g.lin(b, **params)


def gated_backward(dy32: torch.Tensor, x32: torch.Tensor, activation: str, **params: Any) -> torch.Tensor:
    g = GATED[activation]
    a, b = _halves(x32)
    da = dy32 * g.gate_derivative(a, **params) * g.lin(b, **params)
    db = dy32 * g.gate(a, **params) * g.lin_derivative(b, **params)
    return torch.cat([da, db], dim=-1)
