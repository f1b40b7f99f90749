"""The arithmetic of nvfp4.cu's E2M1 encodings as minima of roundings, checked on the CPU against refops.formats.

- e2m1_rne_min3 (the RNE code of |v| < 7 as the minimum of three roundings) against the threshold rule: every fp32
  value within 2^16 ulps of each rounding bound and of 0, 2, 4, 6 and 7, and a strided sample of [0, 7).
  ``e2m1_min3_exhaustive.py`` in this directory checks every fp32 value of [0, 7), and the stochastic rounding of
  every fp32 value of [0, 8) with three bytes each (a few minutes).
- e2m1_sr_min3 (stochastic rounding: a floor of the same concave map, capped at 7) against
  e2m1_stochastic_round: every random byte with the values near each grid point and bound, random pairs up to 16,
  and huge values and infinity.

The kernels themselves are compared with the reference on the GPU (test_quantize_nvfp4.py)."""

from __future__ import annotations

import numpy as np
import torch

from refops.formats import e2m1_round_nearest_even, e2m1_stochastic_round

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


def sr_min3_codes(a: np.ndarray, byte: np.ndarray) -> np.ndarray:
    """The kernel's stochastic-rounding formula on non-negative fp32 ``a`` with random bytes ``byte``: t as one
    rounding of byte/512 * 2^clamp(binade, 0, 2) + a, then floors (exact in float64) of the three affine terms."""
    magic = float(MAGIC)
    scale = (np.minimum(np.maximum(a, np.float32(1.0)), np.float32(4.0)).view(np.uint32) & np.uint32(0x7F800000))
    t = (byte.astype(np.float64) / 512.0 * scale.view(np.float32).astype(np.float64) + a.astype(np.float64))
    t = t.astype(np.float32).astype(np.float64)  # u * s is exact and tiny a are far below half an ulp of it
    terms = [np.floor(magic + 2.0 * t), np.floor(magic + 2.0 + t), np.floor(magic + 4.0 + t / 2.0)]
    return (np.minimum(np.minimum(np.minimum(terms[0], terms[1]), terms[2]), magic + 7.0) - magic).astype(np.int64)


def _sr_reference(a: np.ndarray, byte: np.ndarray) -> np.ndarray:
    codes = e2m1_stochastic_round(torch.from_numpy(a.copy()), torch.from_numpy(byte.astype(np.uint8)))
    return codes.numpy().astype(np.int64)


def sr_reference_numpy(a: np.ndarray, byte: np.ndarray) -> np.ndarray:
    """refops.formats.e2m1_stochastic_round on non-negative, non-NaN ``a``, op for op in numpy float32 (faster, for
    the exhaustive script)."""
    def step(v: np.ndarray) -> np.ndarray:
        return np.where(v < 2.0, np.float32(0.5), np.where(v < 4.0, np.float32(1.0), np.float32(2.0)))

    u = byte.astype(np.float32) / np.float32(256.0)
    t = a + u * step(a)
    step_t = step(t)
    q = np.minimum(np.floor(t / step_t) * step_t, np.float32(6.0))
    values = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
    return np.searchsorted(values, q).astype(np.int64)


def test_sr_min3_formula_matches_e2m1_stochastic_round():
    points = np.array([0, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4, 5, 6, 7, 8, 12], dtype=np.float32)
    near = (points.view(np.uint32).astype(np.int64)[:, None] + np.arange(-600, 600)[None, :]).ravel()
    near = near[near >= 0].astype(np.uint32).view(np.float32)
    a = np.tile(near, 256)
    byte = np.repeat(np.arange(256), near.size)
    rng = np.random.default_rng(5)
    sixteen = int(np.array([16.0], dtype=np.float32).view(np.uint32)[0])
    a = np.concatenate([a, rng.integers(0, sixteen, 1 << 20).astype(np.uint32).view(np.float32),
                        np.array([1e30, 3.4e38, np.inf] * 2, dtype=np.float32)])
    byte = np.concatenate([byte, rng.integers(0, 256, 1 << 20), np.array([0, 0, 0, 255, 255, 255])])
    codes, expected = sr_min3_codes(a, byte), _sr_reference(a, byte)
    np.testing.assert_array_equal(sr_reference_numpy(a, byte), expected)  # the exhaustive script's transcription
    wrong = np.flatnonzero(codes != expected)
    assert wrong.size == 0, f"{wrong.size} mismatches, first at (a, byte) = {list(zip(a[wrong[:5]], byte[wrong[:5]]))}"
