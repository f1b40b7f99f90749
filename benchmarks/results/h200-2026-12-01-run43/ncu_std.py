"""One 1x16 pass 2 of each form (staged, then register tiles) on the benchmark tensor, for Nsight Compute."""
import torch

import fastpath.quantize_nvfp4 as qn

x = torch.randn(16384, 8192, device="cuda", dtype=torch.bfloat16)
am = qn.nvfp4_global_amaxes(x, rowwise=True, columnwise=True, rht=False, sign_mask=True)
opts = dict(rowwise=True, columnwise=True, two_d=False, rht=False, sign_mask=True, random_rowwise=None,
            random_columnwise=None, use_4over6=False, e4m3_max=448.0, mse=False)
for rt in (False, True):
    qn.REGISTER_TILES = rt
    qn.nvfp4_cast(x, am, **opts)
torch.cuda.synchronize()
