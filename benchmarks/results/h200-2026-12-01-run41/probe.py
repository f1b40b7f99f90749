"""GPU runs 41 and 43: NVFP4 pass 2 in register tiles (rt_quantize) beside the staged kernels (quantize_tiles).

Times nvfp4_cast for the 1x16 and 16x16 forms on the benchmark's 16384 x 8192 bf16 tensor with
quantize_nvfp4.REGISTER_TILES off and on (alternating, twice each), against a device-to-device copy, and compares
every output byte of the two forms on that tensor and on inputs that take the generic path (NaN, inf, blocks with
subnormal scales), fp16 input, and edge shapes. PROBE_MINB=n compiles rt_quantize for n resident blocks per SM.
"""

from __future__ import annotations

import os
import re
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from fastpath import _cuda  # noqa: E402
import fastpath.quantize_nvfp4 as qn  # noqa: E402
from _timing import median_ms  # noqa: E402

MINB = os.environ.get("PROBE_MINB")
PREFETCH = os.environ.get("PROBE_PREFETCH")
if MINB or PREFETCH:
    _source = _cuda.kernel_source

    def _patched(filename: str) -> str:
        text = _source(filename)
        if filename == "nvfp4.cu" and MINB:
            text = re.sub(r"#define RT_MINB \d+", f"#define RT_MINB {MINB}", text)
        if filename == "nvfp4.cu" and PREFETCH:
            text = text.replace("#define RT_PREFETCH 0", f"#define RT_PREFETCH {PREFETCH}")
        return text

    _cuda.kernel_source = _patched


def cast(x, amaxes, rt: bool, **kw):
    qn.REGISTER_TILES = rt
    opts = dict(rowwise=True, columnwise=True, two_d=False, rht=False, sign_mask=True, random_rowwise=None,
                random_columnwise=None, use_4over6=False, e4m3_max=448.0, mse=False)
    opts.update(kw)
    return qn.nvfp4_cast(x, amaxes, **opts)


def amaxes_of(x, rowwise=True, columnwise=True):
    return qn.nvfp4_global_amaxes(x, rowwise=rowwise, columnwise=columnwise, rht=False, sign_mask=True)


def compare(label, x, **kw):
    rowwise, columnwise = kw.get("rowwise", True), kw.get("columnwise", True)
    am = amaxes_of(x, rowwise, columnwise)
    a, b = cast(x, am, False, **kw), cast(x, am, True, **kw)
    bad = []
    for i, (u, v) in enumerate(zip(a, b)):
        if u is None and v is None:
            continue
        if not torch.equal(u, v):
            diff = (u != v).sum().item()
            bad.append(f"output {i}: {diff} of {u.numel()} differ")
    print(f"{'OK ' if not bad else 'BAD'} {label} {tuple(x.shape)} {x.dtype} {kw}: {'; '.join(bad) or 'bit-identical'}")
    return not bad


def main() -> None:
    torch.manual_seed(0)
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(), "RT_MINB", MINB or "default", "RT_PREFETCH", PREFETCH or 0)
    x = torch.randn(16384, 8192, device=dev, dtype=torch.bfloat16)
    am = amaxes_of(x)
    y = torch.empty_like(x)
    copy_ms, _ = median_ms(lambda: y.copy_(x))
    copy_gbps = 2 * x.numel() * 2 / copy_ms / 1e6
    print(f"copy {copy_ms:.4f} ms {copy_gbps:.0f} GB/s")
    nbytes = x.numel() * 2 + 2 * (x.numel() // 2) + 2 * (x.numel() // 16)
    for two_d in (False, True):
        for rt in (False, True, False, True):
            ms, _ = median_ms(lambda: cast(x, am, rt, two_d=two_d), reps=30)
            gbps = nbytes / ms / 1e6
            print(f"{'16x16' if two_d else '1x16 '} {'rt    ' if rt else 'staged'} {ms:.4f} ms {gbps:.0f} GB/s "
                  f"{100 * gbps / copy_gbps:.1f} % of copy")
    ok = True
    for two_d in (False, True):
        ok &= compare("randn", x, two_d=two_d)
        special = x[:2048, :4096].clone()
        special[5, 7] = float("nan")
        special[300, 1000] = float("inf")
        special[301, 1001] = -float("inf")
        special[1000:1016, 256:512] *= 1e-6  # subnormal / zero scales: the generic path
        special[2000, 3000:3016] = -0.0
        ok &= compare("special", special, two_d=two_d)
        ok &= compare("fp16", (x[:1024, :2048] * 100).to(torch.float16), two_d=two_d)
        for shape in [(16, 16), (48, 272), (64, 4112), (1040, 2064)]:
            ok &= compare("shape", x[: shape[0], : shape[1]].contiguous(), two_d=two_d)
        ok &= compare("cols only", x[:1040, :2064].contiguous(), two_d=two_d, rowwise=False)
        ok &= compare("rows only", x[:1040, :2064].contiguous(), two_d=two_d, columnwise=False)
    ok &= compare("rows only, M % 16 != 0", x[:1001, :2064].contiguous(), columnwise=False)
    ok &= compare("rows only, 3 rows", x[:3, :2064].contiguous(), columnwise=False)
    print("ALL BIT-IDENTICAL" if ok else "MISMATCHES")


if __name__ == "__main__":
    main()
