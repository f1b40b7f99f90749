"""``Float8CurrentScalingQuantizer`` keeps the last cast's amax and scale by rebinding ``amax``/``scale`` to the
tensors the cast computed (issue #27: two copy kernels fewer per cast), with the values the copies gave."""

from __future__ import annotations

import pytest
import torch

from refops.kernels import current_backend
from refops.formats import FLT_MAX
from refops.quantization import DType, Float8CurrentScalingQuantizer


@pytest.mark.parametrize("pow2,eps", [(False, 0.0), (True, 0.0), (False, 1e-3)])
@pytest.mark.parametrize("values", ["randn", "zeros", "tiny", "nan"])
def test_amax_and_scale_are_the_casts_values(pow2, eps, values, device):
    x = {"randn": torch.randn(32, 64) * 3, "zeros": torch.zeros(32, 64), "tiny": torch.full((32, 64), 1e-40),
         "nan": torch.randn(32, 64).index_put_((torch.tensor([3]), torch.tensor([5])), torch.tensor(float("nan")))
         }[values].to(torch.bfloat16).to(device)
    q = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, device, force_pow_2_scales=pow2, amax_epsilon=eps)
    old_amax, old_scale = q.amax, q.scale
    qt = q(x)
    kernels = current_backend()
    amax = kernels.amax(x)
    scale = kernels.compute_scale_from_amax(amax, fmax=448.0, force_pow_2_scales=pow2, amax_epsilon=eps,
                                            value_for_inf=FLT_MAX)
    for got, want in ((q.amax, amax), (q.scale, scale)):
        assert got.shape == (1,) and got.dtype == torch.float32
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert torch.equal(qt._scale_inv, (1.0 / scale.double()).float())
    # The tensors held before the cast keep their values (nothing reads them as this cast's).
    assert torch.equal(old_amax.cpu(), torch.zeros(1, device="cpu")) and torch.equal(old_scale.cpu(), torch.ones(1, device="cpu"))
    again = q(x)
    assert torch.equal(again._data, qt._data) and torch.equal(again._transpose, qt._transpose)
