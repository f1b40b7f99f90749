"""Why gemm_path says dequantize+cublas for some block-scaled GEMMs on this torch: probe every convention and case."""
import torch

from fastpath import gemm_blockwise as gb

import os
dev = torch.device(os.environ.get("DIAG_DEVICE", "cuda:0"))
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu")
print("support:", gb.support(dev) if dev.type == "cuda" else None)
g = torch.Generator(device="cpu").manual_seed(0)
with torch.no_grad():
    for tokens, hidden, ffn in ((256, 384, 384), (256, 512, 512), (256, 1024, 512)):
        x = gb._probe_operand(tokens, hidden, False, g, dev)
        w = gb._probe_operand(ffn, hidden, True, g, dev)
        dy = gb._probe_operand(tokens, ffn, False, g, dev)
        for what, a, b, ta, tb in [("fprop", x, w, False, True), ("dgrad", dy, w, False, False),
                                   ("wgrad", dy, x, True, False)]:
            for conv in gb.TILE_CONVENTIONS:
                ops = gb._build(a, b, ta, tb, conv)
                if ops is None:
                    print(tokens, hidden, ffn, what, conv, "build None")
                    continue
                shapes = [(tuple(t.shape), tuple(t.stride())) for t in ops]
                for d in (torch.float32, torch.bfloat16):
                    try:
                        got = torch.ops.aten._scaled_mm.default(*ops, None, None, d, False)
                    except Exception as e:
                        print(tokens, hidden, ffn, what, conv, d, "RAISES", str(e).splitlines()[0][:200], shapes)
                        continue
                    a64 = a.dequantize(dtype=torch.float32, usage="columnwise" if ta else "rowwise").double()
                    b64 = b.dequantize(dtype=torch.float32, usage="rowwise" if tb else "columnwise").double()
                    a64 = a64.t() if ta else a64
                    b64 = b64.t() if tb else b64
                    ratio = ((got.double() - a64 @ b64).abs() / (a64.abs() @ b64.abs())).max().item()
                    print(tokens, hidden, ffn, what, conv, d, f"max err/bound {ratio:.3g}",
                          "OK" if ratio <= 2 ** -6 else "WRONG", shapes)


# ---- Which memory layout of a 128x128 tile-scale tensor cuBLAS reads, through a view torch's checks accept.
def tile_memory(S, hypothesis):
    rb, cb = S.shape
    r4, c4 = -(-rb // 4) * 4, -(-cb // 4) * 4
    mem = torch.zeros(4 * (r4 + 4) * (c4 + 4), dtype=torch.float32, device=S.device)
    if hypothesis == "row ld=cb":
        mem[: rb * cb].view(rb, cb)[:] = S
    elif hypothesis == "row ld=cb4":
        mem[: rb * c4].view(rb, c4)[:, :cb] = S
    elif hypothesis == "col ld=rb":
        mem[: cb * rb].view(cb, rb)[:] = S.t()
    elif hypothesis == "col ld=rb4":
        mem[: cb * r4].view(cb, r4)[:, :rb] = S.t()
    return mem


print("--- tile-scale memory hypotheses (b operand 128x128, a operand 1x128 as scale_view gives)")
with torch.no_grad():
    for tokens, hidden, ffn in ((256, 384, 384), (256, 384, 640), (256, 640, 384)):
        x = gb._probe_operand(tokens, hidden, False, g, dev)
        w = gb._probe_operand(ffn, hidden, True, g, dev)
        dy = gb._probe_operand(tokens, ffn, False, g, dev)
        for what, a, b, ta, tb in [("fprop", x, w, False, True), ("dgrad", dy, w, False, False)]:
            d_a, s_a = gb._operand(a, columnwise=ta)
            d_b, s_b = gb._operand(b, columnwise=not tb)
            (m, k), (n, _) = d_a.shape, d_b.shape
            scale_a = gb.scale_view(s_a, m, k, tiles=False, convention="compact")
            rb, cb = -(-n // 128), -(-k // 128)
            S = s_b[:rb, :cb].contiguous()
            a64 = a.dequantize(dtype=torch.float32, usage="columnwise" if ta else "rowwise").double()
            b64 = b.dequantize(dtype=torch.float32, usage="rowwise" if tb else "columnwise").double()
            a64 = a64.t() if ta else a64
            b64 = b64.t() if tb else b64
            want, bound = a64 @ b64, a64.abs() @ b64.abs()
            for hyp in ("row ld=cb", "row ld=cb4", "col ld=rb", "col ld=rb4"):
                mem = tile_memory(S, hyp)
                for vname, stride in (("view ld=cb", cb), ("view ld=cb4", -(-cb // 4) * 4)):
                    view = mem.as_strided((rb, cb), (stride, 1))
                    try:
                        got = torch.ops.aten._scaled_mm.default(d_a.view(torch.float8_e4m3fn),
                                                                d_b.view(torch.float8_e4m3fn).t(), scale_a,
                                                                view.t(), None, None, torch.float32, False)
                    except Exception as e:
                        print(tokens, hidden, ffn, what, hyp, vname, "RAISES", str(e).splitlines()[0][:120])
                        continue
                    ratio = ((got.double() - want).abs() / bound).max().item()
                    print(tokens, hidden, ffn, what, f"rb={rb} cb={cb}", hyp, vname, f"{ratio:.3g}",
                          "OK" if ratio <= 2 ** -6 else "WRONG")
