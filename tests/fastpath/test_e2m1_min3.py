"""The arithmetic of nvfp4.cu's e2m1_rne_min3 (the E2M1 RNE code of |v| < 7 as the minimum of three roundings),
checked on the CPU against refops.formats' threshold rule: every fp32 value within 2^16 ulps of each rounding bound
and of 0, 2, 4, 6 and 7, and a strided sample of [0, 7). ``e2m1_min3_exhaustive.py`` in this directory checks every
fp32 value of [0, 7) (about a minute). The kernels themselves are compared with the reference on the GPU
(test_quantize_nvfp4.py)."""

from __future__ import annotations

import numpy as np
import torch

from refops.formats import e2m1_round_nearest_even

MAGIC = np.float32(12582912.0)  # E2M1_ACC_MAGIC, 1.5 * 2^23: ulp 1
SEVEN_BITS = int(np.array([7.0], dtype=np.float32).view(np.uint32)[0])
_BOUNDS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=np.float32)
_TIE_CODES = np.array([0, 2, 2, 4, 4, 6, 6])


def min3_codes(a: np.ndarray) -> np.ndarray:
    """The kernel's formula on non-negative fp32 ``a``, as integer codes."""
    p1 = (MAGIC + np.float32(2.0) * a).view(np.uint32)
    p2 = ((MAGIC + np.float32(2.0)) + a).view(np.uint32)
    p3 = ((MAGIC + np.float32(4.0)) + a * np.float32(0.5)).view(np.uint32)
    return np.minimum(np.minimum(p1, p2), p3).astype(np.int64) - int(MAGIC.view(np.uint32))


def threshold_codes(a: np.ndarray) -> np.ndarray:
    """refops.formats' threshold rule (a value above a bound takes the next code, a value on it the even one)."""
    code = np.zeros(a.shape, dtype=np.int64)
    for i, bound in enumerate(_BOUNDS):
        code = np.where(a > bound, i + 1, code)
        code = np.where(a == bound, _TIE_CODES[i], code)
    return code


def _sample() -> np.ndarray:
    window = np.arange(-(1 << 16), 1 << 16, dtype=np.int64)
    centres = np.concatenate([_BOUNDS, np.array([0.0, 2.0, 4.0, 6.0, 7.0], dtype=np.float32)]).view(np.uint32)
    near = (centres.astype(np.int64)[:, None] + window[None, :]).ravel()
    strided = np.arange(0, SEVEN_BITS, 9973, dtype=np.int64)
    bits = np.concatenate([near, strided])
    bits = bits[(bits >= 0) & (bits < SEVEN_BITS)]
    return bits.astype(np.uint32).view(np.float32)


def test_threshold_rule_is_refops_rule():
    a = _sample()[::97]
    expected = e2m1_round_nearest_even(torch.from_numpy(a.copy())).numpy().astype(np.int64)
    np.testing.assert_array_equal(threshold_codes(a), expected)


def test_min3_formula_matches_e2m1_rne_below_7():
    a = _sample()
    codes, expected = min3_codes(a), threshold_codes(a)
    wrong = np.flatnonzero(codes != expected)
    assert wrong.size == 0, f"{wrong.size} mismatches, first at a = {a[wrong[:5]].tolist()}"


def test_min3_formula_needs_the_below_7_guard():
    """At 7 the formula's third term is a tie that rounds up to 8: the kernels send such blocks to the generic path."""
    assert min3_codes(np.array([7.0], dtype=np.float32))[0] == 8
