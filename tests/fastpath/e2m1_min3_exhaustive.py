"""Exhaustive check of nvfp4.cu's e2m1_rne_min3 formula (CPU, about a minute; not collected by pytest).

For every fp32 bit pattern a in [0, 7): min(RN(M + 2a), RN((M + 2) + a), RN((M + 4) + a/2)) - M, with M = 1.5 * 2^23,
equals the E2M1 RNE magnitude code of refops.formats (its threshold rule). float32 numpy arithmetic rounds each sum
once, as the kernel's FFMA / FADD do (2a and a/2 are exact, or for a/2 of a subnormal a, far below any threshold).

    python tests/fastpath/e2m1_min3_exhaustive.py
"""

from __future__ import annotations

import numpy as np
from test_e2m1_min3 import SEVEN_BITS, min3_codes, threshold_codes


def main() -> int:
    step = 1 << 24
    bad = 0
    for lo in range(0, SEVEN_BITS, step):
        a = np.arange(lo, min(lo + step, SEVEN_BITS), dtype=np.uint32).view(np.float32)
        bad += int((min3_codes(a) != threshold_codes(a)).sum())
    print(f"{SEVEN_BITS} fp32 values in [0, 7) checked, {bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
