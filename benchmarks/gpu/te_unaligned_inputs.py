"""TransformerEngine on inputs whose address is not 16-byte aligned: does it quantize them, raise, or crash?

    python3 benchmarks/gpu/te_unaligned_inputs.py OUTDIR

Each probe runs in its own process (a misaligned vector load is a sticky CUDA error that ends the process's use
of the device): a TE quantizer of each recipe, and a TE ``te.ops.Linear`` forward and backward, given a tensor
sliced 37 elements into its storage (74 bytes in bf16, 148 in fp32) and, as the control, 512 bytes in. The
result of each is compared bit for bit with the same call on a contiguous copy. Writes OUTDIR/te_unaligned.{md,json}.
"""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
import sys
from pathlib import Path

PROBE = r'''
import json, sys, torch
sys.path.insert(0, ".")
from refops.testing.recipes import make_recipe
from refops.testing.transformer_engine.quantizers import te_role_quantizer, quantized_fields
import transformer_engine.pytorch as tep
kind, recipe_name, dtype_name, offset = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
dtype = getattr(torch, dtype_name)
torch.manual_seed(0)
x = torch.randn(256, 256, device="cuda", dtype=dtype)
buf = torch.zeros(offset + x.numel(), device="cuda", dtype=dtype)
buf[offset:] = x.reshape(-1)
sliced = buf[offset:].view(x.shape)
recipe = make_recipe(recipe_name)
if kind == "quantizer":
    def run(t):
        q = te_role_quantizer(recipe, "input", device="cuda")
        q.set_usage(rowwise=True, columnwise=True)
        f = quantized_fields(q(t), "rowwise")
        return [f["data"].view(torch.uint8).reshape(-1), f["scale_inv"].reshape(-1).float()]
else:
    lin = tep.ops.Linear(256, 256, device="cuda", dtype=dtype)
    def run(t):
        t = t.detach().requires_grad_(True)
        with tep.autocast(enabled=True, recipe=__import__("refops.testing.transformer_engine.recipes",
                                                          fromlist=["te_recipe"]).te_recipe(recipe)):
            y = lin(t)
        y.backward(torch.ones_like(y))
        out = [y.detach().reshape(-1), t.grad.reshape(-1)]
        lin.zero_grad(set_to_none=True)
        return out
expected = run(x.clone())
got = run(sliced)
torch.cuda.synchronize()
same = all(torch.equal(a.view(torch.uint8) if a.dtype == torch.uint8 else a, b) for a, b in zip(got, expected))
print(json.dumps({"outcome": "bit-identical" if same else "differs"}))
'''

CASES = [("quantizer", r, d) for r in ("fp8_delayed_scaling", "fp8_current_scaling", "mxfp8", "fp8_block_scaling",
                                       "nvfp4") for d in ("bfloat16", "float32")]
CASES += [("te.ops.Linear", r, "bfloat16") for r in ("fp8_current_scaling", "mxfp8")]


def _probe(kind: str, recipe: str, dtype: str, offset: int) -> dict:
    try:
        done = subprocess.run([sys.executable, "-c", PROBE, kind, recipe, dtype, str(offset)], capture_output=True,
                              text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return {"outcome": "timed out after 120 s"}
    if done.returncode == 0 and done.stdout.strip():
        return json.loads(done.stdout.strip().splitlines()[-1])
    last = [line for line in done.stderr.strip().splitlines() if line.strip()][-1:] or ["(no output)"]
    crashed = "CUDA error" in done.stderr or "cudaError" in done.stderr
    return {"outcome": ("CUDA error: " if crashed else "raised: ") + last[0][:300]}


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    offsets = {"aligned (512 bytes in)": lambda dtype: 512 // (4 if dtype == "float32" else 2),
               "unaligned (37 elements in)": lambda dtype: 37}
    jobs = [(case, label, offset(case[2])) for case in CASES for label, offset in offsets.items()]
    with ThreadPoolExecutor(8) as pool:  # one process per probe; the GPU is shared
        outcomes = list(pool.map(lambda job: _probe(*job[0], job[2])["outcome"], jobs))
    rows = []
    for kind, recipe, dtype in CASES:
        row = {"probe": kind, "recipe": recipe, "dtype": dtype}
        row.update({label: outcome for (case, label, _), outcome in zip(jobs, outcomes)
                    if case == (kind, recipe, dtype)})
        rows.append(row)
        print(json.dumps(row), flush=True)
    (out / "te_unaligned.json").write_text(json.dumps(rows, indent=1))
    lines = ["| probe | recipe | dtype | aligned (512 bytes in) | unaligned (37 elements in) |", "|---|---|---|---|---|"]
    lines += [f"| {r['probe']} | {r['recipe']} | {r['dtype']} | {r['aligned (512 bytes in)']} | "
              f"{r['unaligned (37 elements in)']} |" for r in rows]
    (out / "te_unaligned.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "te_unaligned_out")))
