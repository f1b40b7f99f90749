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

import functools

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


# --------------------------------------------------------------------------- the folded block multiply
_TIES = np.array([j / 4 for j in range(1, 28) if j % 8], dtype=np.float32)  # fold_exact's tie points h


def _finite_magnitudes(fmt: str) -> np.ndarray:
    """Every finite non-negative value of a 16-bit format, as fp32, and their bits."""
    if fmt == "bf16":
        bits = np.arange(0x7F80, dtype=np.uint32)
        return bits, (bits << 16).view(np.float32)
    bits = np.arange(0x7C00, dtype=np.uint16)
    return bits.astype(np.uint32), bits.view(np.float16).astype(np.float32)


def _bits16_rz(q: np.ndarray, fmt: str) -> np.ndarray:
    """The kernel's bits16_rz: q truncated to the 16-bit format (q >= 0, finite), as bits."""
    if fmt == "bf16":
        return q.view(np.uint32) >> 16
    h = q.astype(np.float16)  # RNE; step back where it rounded up (RZ saturates at the largest finite value)
    bits = h.view(np.uint16).astype(np.int64)
    up = (h.astype(np.float32) > q) | np.isinf(h)
    return np.where(up, bits - 1, bits).astype(np.uint32)


def fold_exact(enc: np.float32, fmt: str) -> bool:
    """nvfp4.cu's fold_exact<T>, op for op."""
    enc = np.float32(enc)
    if not (np.float32(2.0**-125) < enc < np.float32(2.0**127)):
        return False
    inv = np.float32(1.0) / enc
    qb = _bits16_rz(_TIES * inv, fmt).astype(np.int64)
    inf_bits = 0x7F80 if fmt == "bf16" else 0x7C00
    for d in (-1, 0, 1):
        vb = qb + d
        ok = (vb >= 0) & (vb < inf_bits)
        vb, h = vb[ok].astype(np.uint32), _TIES[ok]
        x = (vb << 16).view(np.float32) if fmt == "bf16" else vb.astype(np.uint16).view(np.float16).astype(np.float32)
        hits = (x * enc == h) & (x.astype(np.float64) * np.float64(enc) != h.astype(np.float64))
        if hits.any():
            return False
    return True


def folded_codes(v: np.ndarray, enc: np.float32) -> np.ndarray:
    """e2m1_rne_min3_folded: each FFMA rounds its exact value once (float64 holds |v| * enc exactly, and where
    2 + y or 4 + y/2 does not fit, y is far below a half and the rounding is the constant's)."""
    y = np.abs(v).astype(np.float64) * np.float64(enc)
    return np.minimum(np.minimum(np.rint(2.0 * y), np.rint(2.0 + y)), np.rint(4.0 + y / 2.0)).astype(np.int64)


def _adversarial_encs(fmt: str, rng: np.random.Generator, n: int) -> list[np.float32]:
    """Multipliers that put some value's product one rounding away from a tie point: fold_exact must refuse them."""
    bits, values = _finite_magnitudes(fmt)
    out = []
    while len(out) < n:
        v = values[rng.integers(values.size // 4, values.size // 2)]  # normal values around 1
        h = _TIES[rng.integers(_TIES.size)]
        enc = np.float32(np.float64(h) / np.float64(v))
        for step in (-1, 1):
            cand = np.nextafter(enc, np.float32(step * np.inf))
            for e in (enc, cand):
                if v * e == h and np.float64(v) * np.float64(e) != np.float64(h):
                    out.append(np.float32(e))
    return out[:n]


def test_fold_exact_guards_the_folded_codes():
    """Wherever fold_exact accepts a multiplier, the folded codes equal e2m1_rne_min3's of RN(v * enc) for every
    16-bit value v whose product stays below 7 (the fast path's guard); multipliers that put a product on a tie
    point by rounding are refused, and some of them would indeed change a code."""
    rng = np.random.default_rng(11)
    for fmt in ("bf16", "fp16"):
        _, values = _finite_magnitudes(fmt)
        random_encs = (rng.integers(0x3A000000, 0x4E000000, 200).astype(np.uint32)).view(np.float32)
        adversarial = _adversarial_encs(fmt, rng, 40)
        accepted = changed = 0
        for enc in list(random_encs) + adversarial:
            with np.errstate(over="ignore"):  # products of huge values overflow: they are above 7 either way
                x = values * enc
            keep = x < np.float32(7.0)
            if fold_exact(enc, fmt):
                accepted += 1
                wrong = np.flatnonzero(folded_codes(values[keep], enc) != min3_codes(x[keep]))
                assert wrong.size == 0, f"{fmt} enc={enc!r}: v = {values[keep][wrong[:4]].tolist()}"
            else:
                changed += int((folded_codes(values[keep], enc) != min3_codes(x[keep])).any())
        assert all(not fold_exact(e, fmt) for e in adversarial)
        assert accepted >= 150, f"{fmt}: only {accepted} of 200 random multipliers fold"
        assert changed > 0, f"{fmt}: no refused multiplier would have changed a code"


def test_fold_exact_range():
    assert not fold_exact(np.float32(2.0**127), "bf16")  # 2enc would overflow
    assert not fold_exact(np.float32(2.0**-126), "bf16")  # enc / 2 subnormal
    assert fold_exact(np.float32(1.0), "bf16") and fold_exact(np.float32(1.0), "fp16")  # products exact


@functools.lru_cache(maxsize=None)
def adversarial_block(fmt: str) -> tuple[float, float, float, int]:
    """A global amax ``A``, a block amax ``b`` and a value ``v`` (all of the 16-bit format) whose block, in a tensor
    of amax ``A``, gets a scale byte ``s`` whose multiplier does not fold: RN(v * enc) lands on a tie point that the
    exact product misses, and the folded code of ``v`` would differ from the reference's. Returns (A, b, v, s)."""
    from refops.kernels.reference.nvfp4_scales import (
        nvfp4_block_encode_multiplier,
        nvfp4_block_scale,
        nvfp4_global_scale,
    )

    bits, values = _finite_magnitudes(fmt)
    amaxes = values[values >= 1.0][:1024]
    scales = torch.arange(1, 127, dtype=torch.uint8).view(torch.float8_e4m3fn)
    _, s_dec = nvfp4_global_scale(torch.from_numpy(amaxes.copy()))
    enc = nvfp4_block_encode_multiplier(scales[None, :], s_dec[:, None]).numpy()  # (amaxes, scales)
    for h in _TIES[::-1]:  # large tie points first: their blocks need little headroom
        qb = _bits16_rz((h / enc).astype(np.float32), fmt).astype(np.int64)
        for d in (0, 1):
            vb = np.minimum(qb + d, bits[-1]).astype(np.uint32)
            v = (vb << 16).view(np.float32) if fmt == "bf16" else vb.astype(np.uint16).view(np.float16).astype(np.float32)
            hit = (v * enc == h) & (v.astype(np.float64) * enc.astype(np.float64) != np.float64(h))
            for i, j in zip(*np.nonzero(hit)):
                a, x = amaxes[i], v[i, j]
                if folded_codes(np.array([x]), enc[i, j])[0] == min3_codes(np.array([h], dtype=np.float32))[0]:
                    continue
                # a block amax b in [x, a] whose scale byte is scales[j] and whose products stay below 7
                with np.errstate(over="ignore"):
                    b = values[(values >= x) & (values <= a) & (values * enc[i, j] < np.float32(7.0))]
                s_b = nvfp4_block_scale(torch.from_numpy(b.copy()), torch.tensor(np.float32(2688.0) / a))
                ok = np.flatnonzero(s_b.view(torch.uint8).numpy() == j + 1)
                if ok.size:
                    return float(a), float(b[ok[0]]), float(x), j + 1
    raise AssertionError(f"no adversarial block found for {fmt}")


def adversarial_tensor(fmt: str) -> tuple[torch.Tensor, int]:
    """A (32, 32) fp32 tensor of ``fmt`` values whose row 17 (columns 16..31) and column 20 (rows 16..31) are each
    an adversarial_block (amax A alone at (0, 0)); returns it and the blocks' scale byte."""
    a, b, v, s = adversarial_block(fmt)
    x = torch.zeros(32, 32)
    x[0, 0] = a
    x[17, 16], x[17, 19] = b, -v  # row-wise block (17, 16..31)
    x[20, 20], x[27, 20] = b, v  # column-wise block (16..31, 20)
    return x, s


def test_adversarial_tensor_premise():
    """The reference gives the adversarial blocks the scale byte the search chose, and codes that the folded form
    would get wrong (so the GPU test in test_quantize_nvfp4.py checks that the kernels refuse to fold there)."""
    from refops.kernels import get_backend

    for fmt, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        x, s = adversarial_tensor(fmt)
        assert torch.equal(x.to(dtype).float(), x)
        rd, rs, _, cd, cs, _ = get_backend("reference").quantize_nvfp4(x.to(dtype), rowwise=True, columnwise=True)
        assert rs.view(torch.uint8)[17, 1] == s and cs.view(torch.uint8)[20, 1] == s
        enc = nvfp4_enc(x.abs().max().item(), s)
        for value, byte in ((-x[17, 19].item(), rd[17, 9].item() >> 4), (x[27, 20].item(), cd[20, 13].item() >> 4)):
            v = np.array([value], dtype=np.float32)
            assert min3_codes(v * enc)[0] == byte & 7, (fmt, value, byte)  # the reference's code
            assert folded_codes(v, enc)[0] != byte & 7, (fmt, value, byte)


def nvfp4_enc(a: float, s: int) -> np.float32:
    from refops.kernels.reference.nvfp4_scales import nvfp4_block_encode_multiplier, nvfp4_global_scale

    _, s_dec = nvfp4_global_scale(torch.tensor([a], dtype=torch.float32))
    return np.float32(nvfp4_block_encode_multiplier(torch.tensor([s], dtype=torch.uint8).view(torch.float8_e4m3fn),
                                                    s_dec).item())
