"""The row-major layout of quantized tensors and the dim-0 cuts FSDP2 shards with (no process group needed).

For every scheme: the layout round-trips bit for bit (padding included), the row-major arrays of two
halves concatenate to the whole tensor's, a half holds exactly the whole tensor's bytes for its rows
(and, for the block-local schemes, the bytes of quantizing those rows alone), and ``torch.chunk``,
``narrow``, ``new_zeros`` and the identity ``as_strided`` keep the scheme. Cuts that would split a
scaling block are an error for ``split``/``chunk`` and a dequantized read for an ordinary slice.
"""

from __future__ import annotations

import pytest
import torch

from refops.quantization.float8 import Float8CurrentScalingQuantizer
from refops.quantization.float8_block import Float8BlockQuantizer
from refops.quantization.mxfp8 import MXFP8Quantizer
from refops.quantization.nvfp4 import NVFP4Quantizer
from refops.quantization.quantized_tensor import QuantizedTensor
from refops.quantization.quantizer import DType
from refops.sharding.row_major import from_row_major, rows, to_row_major, zeros_like_rows

E4M3 = DType.kFloat8E4M3
#: name -> (quantizer factory, input dtype, whether a shard quantized alone equals the cut of the whole)
SCHEMES = {
    "fp8_current": (lambda: Float8CurrentScalingQuantizer(E4M3), torch.float32, False),
    "mxfp8": (lambda: MXFP8Quantizer(E4M3), torch.float32, True),
    "mxfp8_2d": (lambda: MXFP8Quantizer(E4M3, with_2d_quantization=True), torch.float32, True),
    "fp8_block_2d": (lambda: Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True, block_scaling_dim=2),
                     torch.float32, True),
    "fp8_block_1d": (lambda: Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True, block_scaling_dim=1),
                     torch.float32, True),
    "nvfp4": (lambda: NVFP4Quantizer(), torch.float32, False),
    "nvfp4_2d": (lambda: NVFP4Quantizer(with_2d_quantization=True), torch.float32, False),
    "nvfp4_rht": (lambda: NVFP4Quantizer(with_rht=True), torch.bfloat16, False),
}


def _arrays(t: QuantizedTensor) -> dict[str, torch.Tensor]:
    return {kw: getattr(t, attr) for kw, attr in t._CTOR_TENSORS.items() if getattr(t, attr) is not None}


def _assert_same_bytes(a: QuantizedTensor, b: QuantizedTensor) -> None:
    x, y = _arrays(a), _arrays(b)
    assert x.keys() == y.keys() and type(a) is type(b) and a.shape == b.shape
    for kw in x:
        assert x[kw].shape == y[kw].shape, kw
        assert torch.equal(x[kw].contiguous().view(torch.uint8), y[kw].contiguous().view(torch.uint8)), kw


@pytest.fixture(params=list(SCHEMES))
def case(request):
    make, dtype, local = SCHEMES[request.param]
    x = torch.randn(256, 128, generator=torch.Generator().manual_seed(0)).to(dtype)
    return make, x, make()(x), local


def test_the_layout_round_trips_bit_for_bit(case):
    _, _, whole, _ = case
    _assert_same_bytes(from_row_major(whole, to_row_major(whole), whole.shape), whole)


def test_halves_concatenate_to_the_whole_and_hold_its_bytes(case):
    make, x, whole, local = case
    top, bottom = rows(whole, 0, 128), rows(whole, 128, 256)
    parts = [to_row_major(top), to_row_major(bottom)]
    full = to_row_major(whole)
    for kw in full:
        assert torch.equal(torch.cat([parts[0][kw], parts[1][kw]]), full[kw]), kw
    assert torch.equal(top.dequantize(), whole.dequantize()[:128])
    if local:  # no whole-tensor scale: the cut is what quantizing the rows alone gives
        _assert_same_bytes(top, make()(x[:128]))


def test_the_cuts_fsdp2_makes_keep_the_scheme(case):
    _, _, whole, _ = case
    pieces = torch.chunk(whole, 2)
    assert [type(p) for p in pieces] == [type(whole)] * 2
    _assert_same_bytes(pieces[1], rows(whole, 128, 256))
    alias = whole.narrow(0, 0, 256)  # the whole: an alias sharing the arrays
    assert all(a is b for a, b in zip(_arrays(alias).values(), _arrays(whole).values()))
    zeros = whole.new_zeros((128, 128))
    assert type(zeros) is type(whole) and all(not a.any() for a in _arrays(zeros).values())
    assert zeros.shape == (128, 128) and [a.shape for a in _arrays(zeros).values()] == [
        a.shape for a in _arrays(zeros_like_rows(whole, torch.Size((128, 128)))).values()]
    same = torch.as_strided(whole, whole.shape, whole.stride(), 0)
    assert type(same) is type(whole) and torch.equal(same.dequantize(), whole.dequantize())


def test_a_cut_across_scaling_blocks_reads_exact_values_and_fsdp2_padding_for_it_is_refused():
    """As in TE, a split or slice the scheme cannot make quantized gives pieces of the dequantized values,
    exactly; FSDP2's padding of such a shard (``new_zeros`` with the shard's rows) is refused instead, so
    a weight is never re-quantized from a dequantized piece."""
    whole = MXFP8Quantizer(E4M3)(torch.randn(64, 64))
    pieces = torch.split(whole, 16)
    assert [type(p) for p in pieces] == [torch.Tensor] * 4
    assert torch.equal(torch.cat(pieces), whole.dequantize())
    assert type(whole[:16]) is torch.Tensor and torch.equal(whole[:16], whole.dequantize()[:16])
    left, right = torch.chunk(whole, 2, dim=1)
    assert type(left) is torch.Tensor and torch.equal(torch.cat([left, right], 1), whole.dequantize())
    with pytest.raises(NotImplementedError, match=r"can only be cut at multiples of 32 rows .*rows of 16 cannot"):
        whole.new_zeros((16, 64))


def test_a_quantized_shard_shares_no_scale_with_its_neighbour():
    """Re-quantizing one shard in place (an optimizer step) must not change another shard's scale."""
    whole = Float8CurrentScalingQuantizer(E4M3)(torch.randn(64, 64))
    top, bottom = torch.chunk(whole, 2)
    before = bottom._scale_inv.clone()
    top.copy_(torch.full((32, 64), 100.0))
    assert not torch.equal(top._scale_inv, before) and torch.equal(bottom._scale_inv, before)
