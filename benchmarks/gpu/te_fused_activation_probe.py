"""What exactly TransformerEngine's activation kernels compute: formulas, roundings, amaxes (issue #39).

    python3 benchmarks/gpu/te_fused_activation_probe.py OUTDIR

On a CUDA GPU with TE. Calls ``tex.gelu`` / ``tex.dgelu`` / ``tex.dbias_dgelu`` directly, with no quantizer, with a
delayed-scaling quantizer (row-wise only, and row- plus column-wise: two kernel paths on Hopper) and with a
current-scaling quantizer, on fp32 and bf16 inputs. Each result is compared bit for bit with candidate models
written here in torch (so the probe does not depend on refops' own implementation):

* formulas: refops' GELU as it stood (``0.5 x (1 + tanh(k (x + c x^3)))``), TE's ``util/math.h`` spelling
  evaluated op by op, and the same spelling with the multiply-adds that nvcc contracts into FMAs;
* roundings: one rounding from the fp32 activation to FP8, or a rounding to the input dtype first;
* amaxes: of the fp32 activation, or of its value rounded to the input dtype.

Writes OUTDIR/te_fused_activation.{md,json}: per row, the share of bit-identical elements of each candidate.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

F32 = torch.float32


def fma32(a: torch.Tensor, b: torch.Tensor, c) -> torch.Tensor:
    """fp32 fused multiply-add, a*b+c with one rounding (float64: the product is exact; ties are vanishingly rare)."""
    c64 = c.double() if isinstance(c, torch.Tensor) else c
    return (a.double() * b.double() + c64).to(F32)


def c32(v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=F32, device="cuda")


def gelu_refops_old(x):
    k, c = c32(0.7978845608028654), c32(0.044715)
    return c32(0.5) * x * (c32(1.0) + torch.tanh(k * (x + c * x * x * x)))


def gelu_te_plain(x):
    return x * (c32(0.5) + c32(0.5) * torch.tanh(x * (c32(0.79788456) + c32(0.03567741) * x * x)))


def gelu_te_fma(x):
    inner = fma32(c32(0.03567741) * x, x, c32(0.79788456))
    return x * fma32(c32(0.5), torch.tanh(x * inner), c32(0.5))


def dgelu_refops_old(x):
    k, c = c32(0.7978845608028654), c32(0.044715)
    t = torch.tanh(k * (x + c * x * x * x))
    dinner = k * (c32(1.0) + c32(3 * 0.044715) * x * x)
    return c32(0.5) * (c32(1.0) + t) + c32(0.5) * x * (c32(1.0) - t * t) * dinner


def dgelu_te_plain(x):
    t = torch.tanh(c32(0.79788456) * x * (c32(1.0) + c32(0.044715) * x * x))
    return (c32(0.5) * x * ((c32(1.0) - t * t) * (c32(0.79788456) + c32(0.1070322243) * x * x))
            + c32(0.5) * (c32(1.0) + t))


def dgelu_te_fma(x, final_fma=True):
    t = torch.tanh(c32(0.79788456) * x * fma32(c32(0.044715) * x, x, c32(1.0)))
    a = fma32(-t, t, c32(1.0))
    b = fma32(c32(0.1070322243) * x, x, c32(0.79788456))
    q = c32(0.5) * (c32(1.0) + t)
    if final_fma:
        return fma32(c32(0.5) * x, a * b, q)
    return c32(0.5) * x * (a * b) + q


GELU = {"refops_old": gelu_refops_old, "te_plain": gelu_te_plain, "te_fma": gelu_te_fma}
DGELU = {"refops_old": dgelu_refops_old, "te_plain": dgelu_te_plain, "te_fma": dgelu_te_fma,
         "te_fma_no_final": lambda x: dgelu_te_fma(x, final_fma=False)}


def same_share(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.reshape(-1), b.reshape(-1)
    if a.dtype != b.dtype or a.shape != b.shape:
        return float("nan")
    if a.is_floating_point() and a.element_size() >= 2:
        a, b = a.view({2: torch.int16, 4: torch.int32}[a.element_size()]), b.view({2: torch.int16, 4: torch.int32}[b.element_size()])
    return (a == b).double().mean().item()


def fp8_codes(v32: torch.Tensor, scale: torch.Tensor, fp8: torch.dtype) -> torch.Tensor:
    top = torch.finfo(fp8).max
    return (v32 * scale).clamp(-top, top).to(fp8).view(torch.uint8)


def main(out: Path) -> int:
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.float8_tensor import Float8CurrentScalingQuantizer, Float8Quantizer

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    rows: list[dict] = []
    x32 = torch.randn(1024, 4096, device="cuda", dtype=F32) * 3
    x32[0, :64] = torch.linspace(-12, 12, 64, device="cuda")
    g32 = torch.randn(1024, 4096, device="cuda", dtype=F32)
    e4, e5 = tex.DType.kFloat8E4M3, tex.DType.kFloat8E5M2

    def add(name: str, shares: dict) -> None:
        rows.append({"row": name, **{k: round(v, 6) for k, v in shares.items()}})
        print(name, shares, flush=True)

    # 1. formulas, no quantizer
    for dt in (F32, torch.bfloat16):
        x, g = x32.to(dt), g32.to(dt)
        y = tex.gelu(x, None)
        add(f"gelu {dt} none", {k: same_share(y, f(x.float()).to(dt)) for k, f in GELU.items()})
        dx = tex.dgelu(g, x, None)
        add(f"dgelu {dt} none", {k: same_share(dx, (g.float() * f(x.float())).to(dt)) for k, f in DGELU.items()})

    # 2. fused quantize: delayed (two kernel paths) and current scaling
    for dt in (F32, torch.bfloat16):
        x, g = x32.to(dt), g32.to(dt)
        for columnwise in (False, True):
            for role, fn, fp8, tfp8 in (("gelu", None, torch.float8_e4m3fn, e4), ("dgelu", None, torch.float8_e5m2, e5)):
                scale = torch.tensor([8.0], device="cuda")
                amax = torch.zeros(1, device="cuda")
                q = Float8Quantizer(scale, amax, tfp8, rowwise=True, columnwise=columnwise)
                if role == "gelu":
                    t = tex.gelu(x, q)
                    v = {k: f(x.float()) for k, f in GELU.items()}
                else:
                    t = tex.dgelu(g, x, q)
                    v = {k: g.float() * f(x.float()) for k, f in DGELU.items()}
                codes = t._data.view(torch.uint8)
                shares = {}
                for k, vv in v.items():
                    shares[f"{k}:one_rounding"] = same_share(codes, fp8_codes(vv, scale, fp8))
                    shares[f"{k}:via_{dt}"] = same_share(codes, fp8_codes(vv.to(dt).float(), scale, fp8))
                    shares[f"{k}:amax_fp32"] = float(torch.equal(amax, vv.abs().max().reshape(1)))
                    shares[f"{k}:amax_{dt}"] = float(torch.equal(amax, vv.to(dt).float().abs().max().reshape(1)))
                add(f"{role} {dt} delayed columnwise={columnwise}", shares)
        for role, fp8, tfp8 in (("gelu", torch.float8_e4m3fn, e4), ("dgelu", torch.float8_e5m2, e5)):
            q = Float8CurrentScalingQuantizer(tfp8, torch.device("cuda"), rowwise=True, columnwise=True)
            if role == "gelu":
                t = tex.gelu(x, q)
                v = {k: f(x.float()) for k, f in GELU.items()}
            else:
                t = tex.dgelu(g, x, q)
                v = {k: g.float() * f(x.float()) for k, f in DGELU.items()}
            codes, scale_inv = t._data.view(torch.uint8), t._scale_inv.reshape(1)
            shares = {}
            for k, vv in v.items():
                for amax_from in ("fp32", str(dt)):
                    a = (vv if amax_from == "fp32" else vv.to(dt).float()).abs().max()
                    scale = (torch.finfo(fp8).max / a).to(F32)
                    shares[f"{k}:amax_{amax_from}:scale_inv"] = float(torch.equal(scale_inv, scale.reciprocal().reshape(1)))
                    for data_from in ("fp32", str(dt)):
                        d = vv if data_from == "fp32" else vv.to(dt).float()
                        shares[f"{k}:amax_{amax_from}:data_{data_from}"] = same_share(codes, fp8_codes(d, scale, fp8))
            add(f"{role} {dt} current", shares)

    # 3. dbias + dgelu (BackwardActivationBias)
    for dt in (F32, torch.bfloat16):
        x, g = x32.to(dt), g32.to(dt)
        for kind in ("delayed", "current"):
            if kind == "delayed":
                q = Float8Quantizer(torch.tensor([8.0], device="cuda"), torch.zeros(1, device="cuda"), e5)
            else:
                q = Float8CurrentScalingQuantizer(e5, torch.device("cuda"))
            db, _ = tex.dbias_dgelu(g, x, q)
            v = g.float() * dgelu_te_fma(x.float())
            cands = {"sum_fp32_then_round": v.sum(0).to(dt), "sum_of_rounded": v.to(dt).sum(0),
                     "sum_of_rounded_fp32acc": v.to(dt).float().sum(0).to(dt)}
            shares = {k: same_share(db, c) for k, c in cands.items()}
            shares["max_abs_diff_vs_fp64_sum"] = (db.double() - v.double().sum(0)).abs().max().item()
            add(f"dbias_dgelu {dt} {kind}", shares)

    (out / "te_fused_activation.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["# TE 2.20.2 activation kernels against candidate models (share of bit-identical elements)", ""]
    for r in rows:
        lines.append(f"## {r['row']}")
        lines += [f"- {k}: {v}" for k, v in r.items() if k != "row"]
        lines.append("")
    (out / "te_fused_activation.md").write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "out")))
