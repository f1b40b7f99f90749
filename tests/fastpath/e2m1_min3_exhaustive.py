"""Exhaustive checks of nvfp4.cu's E2M1 encodings as minima of roundings (CPU, a few minutes; not collected by
pytest).

- RNE (e2m1_rne_min3): for every fp32 bit pattern a in [0, 7), min(RN(M + 2a), RN((M + 2) + a), RN((M + 4) + a/2))
  - M, with M = 1.5 * 2^23, equals the E2M1 RNE magnitude code of refops.formats (its threshold rule). float32
  numpy arithmetic rounds each sum once, as the kernel's FFMA / FADD do (2a and a/2 are exact, or for a/2 of a
  subnormal a, far below any threshold).
- Stochastic rounding (e2m1_sr_min3): for every fp32 bit pattern a in [0, 8), with three random bytes per value
  (0, 255, and one that varies with a), the kernel's formula equals refops.formats.e2m1_stochastic_round, written
  here op for op in numpy float32 (test_e2m1_min3.py checks that transcription against refops).

    python tests/fastpath/e2m1_min3_exhaustive.py
"""

from __future__ import annotations

import numpy as np
from test_e2m1_min3 import SEVEN_BITS, min3_codes, sr_min3_codes, sr_reference_numpy, threshold_codes

EIGHT_BITS = int(np.array([8.0], dtype=np.float32).view(np.uint32)[0])
STEP = 1 << 24


def check_rne() -> int:
    bad = 0
    for lo in range(0, SEVEN_BITS, STEP):
        a = np.arange(lo, min(lo + STEP, SEVEN_BITS), dtype=np.uint32).view(np.float32)
        bad += int((min3_codes(a) != threshold_codes(a)).sum())
    print(f"RNE: {SEVEN_BITS} fp32 values in [0, 7) checked, {bad} mismatches")
    return bad


def check_sr() -> int:
    bad = 0
    for lo in range(0, EIGHT_BITS, STEP):
        bits = np.arange(lo, min(lo + STEP, EIGHT_BITS), dtype=np.uint32)
        a = bits.view(np.float32)
        varying = (bits.astype(np.uint64) * 2654435761 >> 24).astype(np.int64) & 0xFF
        for byte in (np.zeros_like(varying), np.full_like(varying, 255), varying):
            bad += int((sr_min3_codes(a, byte) != sr_reference_numpy(a, byte)).sum())
    print(f"SR: {EIGHT_BITS} fp32 values in [0, 8) x 3 bytes each checked, {bad} mismatches")
    return bad


if __name__ == "__main__":
    raise SystemExit(1 if check_rne() + check_sr() else 0)
