"""Run selected benchmark cases once each (for ncu)."""
import sys, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
import torch, fastpath
from refops.kernels import get_backend, register_backend
from _kernel_cases import kernel_cases
register_backend("fastpath", fastpath.make_backend)
fast = get_backend("fastpath")
x = (torch.randn(16384, 8192, device="cuda") * 3).to(torch.bfloat16)
want = sys.argv[1:]
cases = kernel_cases(fast, x, ("situglu", "gelu"), {"situglu": {"beta1": 4.0, "beta2": 25.0}})
for c in cases:
    if any(w == c.name for w in want):
        getattr(fast, c.method)(*c.args, **c.kwargs)
        torch.cuda.synchronize()
        print("ran", c.name, flush=True)
