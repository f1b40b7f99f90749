"""Normalizations in fp32: LayerNorm, RMSNorm and L2 normalization, forward and backward.

Each function takes the input as ``(rows, inner)`` fp32 and returns fp32; the
backend rounds the results to their dtypes.
"""

from __future__ import annotations

import torch

__all__ = [
    "layer_norm_forward",
    "layer_norm_backward",
    "rms_norm_forward",
    "rms_norm_backward",
    "l2_normalize_forward",
    "l2_normalize_backward",
]


def _gamma(weight32: torch.Tensor, zero_centered_gamma: bool) -> torch.Tensor:
    return weight32 + 1.0 if zero_centered_gamma else weight32


def layer_norm_forward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, zero_centered_gamma: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``y = (x - mean) * rstd * gamma + beta``; biased variance; returns ``(y, mean, rstd)``."""
    mean = x.mean(dim=-1)
    centered = x - mean[:, None]
    var = (centered * centered).mean(dim=-1)
    rstd = torch.rsqrt(var + eps)
    y = centered * rstd[:, None] * _gamma(weight, zero_centered_gamma) + bias
    return y, mean, rstd


def layer_norm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor,
    zero_centered_gamma: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))`` with ``g = dy * gamma``."""
    xhat = (x - mean[:, None]) * rstd[:, None]
    g = dy * _gamma(weight, zero_centered_gamma)
    dx = rstd[:, None] * (g - g.mean(dim=-1, keepdim=True) - xhat * (g * xhat).mean(dim=-1, keepdim=True))
    dweight = (dy * xhat).sum(dim=0)
    dbias = dy.sum(dim=0)
    return dx, dweight, dbias


def rms_norm_forward(
    x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered_gamma: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``y = x * rstd * gamma`` with ``rstd = 1/sqrt(mean(x^2) + eps)``; returns ``(y, rstd)``."""
    rstd = torch.rsqrt((x * x).mean(dim=-1) + eps)
    y = x * rstd[:, None] * _gamma(weight, zero_centered_gamma)
    return y, rstd


def rms_norm_backward(
    dy: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor, zero_centered_gamma: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``dx = rstd * (g - xhat * mean(g * xhat))`` with ``g = dy * gamma``, ``xhat = x * rstd``."""
    xhat = x * rstd[:, None]
    g = dy * _gamma(weight, zero_centered_gamma)
    dx = rstd[:, None] * (g - xhat * (g * xhat).mean(dim=-1, keepdim=True))
    dweight = (dy * xhat).sum(dim=0)
    return dx, dweight


def l2_normalize_forward(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``y = x * rsqrt(sum(x^2) + eps)`` over the last dim; returns ``(y, rsqrt_norm)``."""
    r = torch.rsqrt((x * x).sum(dim=-1) + eps)
    return x * r[:, None], r


def l2_normalize_backward(dy: torch.Tensor, x: torch.Tensor, r: torch.Tensor, eps: float) -> torch.Tensor:
    """``dx = r * (dy - x * sum(x * dy) / (sum(x^2) + eps))``."""
    sum_sq = (x * x).sum(dim=-1, keepdim=True)
    return r[:, None] * (dy - x * (x * dy).sum(dim=-1, keepdim=True) / (sum_sq + eps))
