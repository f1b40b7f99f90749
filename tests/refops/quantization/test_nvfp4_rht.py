"""NVFP4 random Hadamard transform (refops/kernels/reference/hadamard.py) and its use on the columnwise operand."""

from __future__ import annotations

import pytest
import torch

from refops.kernels.reference.hadamard import RHT_SIGN_VECTOR, hadamard_transform_16, rht_matrix_16
from refops.kernels.reference.quant_nvfp4 import quantize_nvfp4

from _nvfp4_helpers import row_only


def test_rht_matrix_structure(device):
    m = rht_matrix_16(random_sign_mask=True, device=device)
    assert m.dtype == torch.bfloat16 and set(m.float().abs().unique().tolist()) == {0.25}
    # Column 0 of H16 is all ones, so column 0 of diag(s) H16 / 4 is s / 4.
    assert (m[:, 0].float() * 4).tolist() == list(map(float, RHT_SIGN_VECTOR))
    assert RHT_SIGN_VECTOR == (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
    m64 = m.double()
    assert torch.equal(m64 @ m64.t(), torch.eye(16, dtype=torch.float64, device=device))  # orthogonal
    plain = rht_matrix_16(random_sign_mask=False, device=device).double()
    assert torch.equal(plain, plain.t())
    assert torch.equal(plain @ plain, torch.eye(16, dtype=torch.float64, device=device))
    h_row5 = [(-1) ** bin(5 & j).count("1") * 0.25 for j in range(16)]  # Sylvester entry (-1)^popcount(i & j)
    assert plain[5].tolist() == h_row5


def test_rht_bf16_rounding_and_te_formulation(device):
    x = torch.randn(64, 96, device=device).to(torch.bfloat16)
    y = hadamard_transform_16(x, random_sign_mask=True)
    m = rht_matrix_16(random_sign_mask=True, device=device)
    exact = (x.double().view(-1, 16) @ m.double()).view(x.shape)  # fp32 sums of these are exact
    assert y.dtype == torch.bfloat16 and torch.equal(y, exact.to(torch.float32).to(torch.bfloat16))
    assert torch.equal(y, (x.view(-1, 16) @ m).view(x.shape))  # TE's reference: bf16 matmul


def test_rht_applied_twice_returns_input(device):
    x = torch.randn(32, 64, device=device).to(torch.bfloat16)
    norm = x.float().view(-1, 16).norm(dim=1, keepdim=True)
    twice = hadamard_transform_16(hadamard_transform_16(x, random_sign_mask=False), random_sign_mask=False)
    assert ((twice.float() - x.float()).view(-1, 16).abs() <= 2.0**-7 * norm).all()
    once = hadamard_transform_16(x, random_sign_mask=True)
    back = (once.double().view(-1, 16) @ rht_matrix_16(random_sign_mask=True, device=device).double().t()).view(x.shape)
    assert ((back - x.double()).view(-1, 16).abs() <= 2.0**-8 * norm.double()).all()
    assert not torch.equal(once, hadamard_transform_16(x, random_sign_mask=False))


def test_rht_errors(device):
    with pytest.raises(ValueError, match="bfloat16"):
        hadamard_transform_16(torch.randn(2, 16, device=device), random_sign_mask=True)
    with pytest.raises(ValueError, match="multiple of 16"):
        hadamard_transform_16(torch.randn(2, 24, device=device).bfloat16(), random_sign_mask=True)


@pytest.mark.parametrize("random_sign_mask", [True, False])
def test_rht_applies_to_columnwise_only(random_sign_mask, device):
    x = torch.randn(32, 48, device=device).to(torch.bfloat16)
    r = quantize_nvfp4(x, with_rht=True, with_random_sign_mask=random_sign_mask)
    plain = quantize_nvfp4(x)
    assert torch.equal(r.rowwise_data, plain.rowwise_data) and torch.equal(r.rowwise_amax, plain.rowwise_amax)
    transformed = hadamard_transform_16(x.t().contiguous(), random_sign_mask=random_sign_mask)
    ref = row_only(transformed)  # columnwise = quantize(RHT(x^T)) blocked along M
    assert torch.equal(r.columnwise_data, ref.rowwise_data) and torch.equal(r.columnwise_scale, ref.rowwise_scale)
    assert r.columnwise_amax.tolist() == [transformed.float().abs().max().item()]
    assert not torch.equal(r.columnwise_data, plain.columnwise_data)
