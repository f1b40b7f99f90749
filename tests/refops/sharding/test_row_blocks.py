"""Row blocks (:mod:`refops.sharding.row_blocks`): a quantized 2-D tensor as one uint8 matrix, one row per block of
its rows, the one state-dict form of a quantized weight (one process and FSDP2 alike).

Checked for every scheme: the encoding decodes bit for bit, with or without a tensor to decode like (the blocks
say what they hold); the blocks of a cut (on block bounds) are the rows of the whole tensor's blocks, so any
sharding's checkpoint decodes into any other; and blocks of another scheme, format, quantizer or size, whose
shared scales disagree, or put together from different tensors are refused, never reinterpreted.
"""

from __future__ import annotations

import pytest
import torch

from refops.ops.quantized_checkpoint import dequantize_state_dict
from refops.quantization import (
    DType,
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
    QuantizedTensor,
)
from refops.sharding.row_blocks import block_rows, decode_row_blocks, encode_row_blocks, is_row_blocks
from refops.sharding.row_major import rows as cut

E4M3, E5M2 = DType.kFloat8E4M3, DType.kFloat8E5M2
SCHEMES = {
    "fp8_delayed": lambda: Float8Quantizer(torch.full((1,), 2.0), torch.zeros(1), E4M3),
    "fp8_current": lambda: Float8CurrentScalingQuantizer(E4M3),
    "mxfp8": lambda: MXFP8Quantizer(E4M3),
    "mxfp8_2d": lambda: MXFP8Quantizer(E4M3, with_2d_quantization=True),
    "block_1d": lambda: Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True, block_scaling_dim=1),
    "block_2d": lambda: Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True),
    "nvfp4": lambda: NVFP4Quantizer(),
    "nvfp4_rht": lambda: NVFP4Quantizer(with_rht=True),
    "nvfp4_2d": lambda: NVFP4Quantizer(with_2d_quantization=True),
    "nvfp4_row_scaled": lambda: NVFP4Quantizer(row_scaled_nvfp4=True),
}


def _arrays(t: QuantizedTensor) -> dict[str, torch.Tensor]:
    return {a: getattr(t, a) for a in t._array_names() if getattr(t, a) is not None}


def _same(a: QuantizedTensor, b: QuantizedTensor) -> bool:
    x, y = _arrays(a), _arrays(b)
    return type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape and x.keys() == y.keys() and all(
        x[k].shape == y[k].shape and x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]) for k in x)


def _tensor(name: str, rows: int = 512) -> QuantizedTensor:
    torch.manual_seed(0)
    return SCHEMES[name]()(torch.randn(rows, 64, dtype=torch.bfloat16))


@pytest.mark.parametrize("name", list(SCHEMES))
def test_row_blocks_round_trip_and_cuts_are_their_rows(name):
    whole = _tensor(name)
    blocks = encode_row_blocks(whole)
    g = block_rows(whole)
    assert is_row_blocks(blocks) and blocks.shape[0] == 512 // g
    assert _same(decode_row_blocks(blocks), whole)  # the blocks say what they hold
    like = decode_row_blocks(blocks, like=whole, rows=512)
    assert _same(like, whole) and like.quantizer is whole.quantizer
    if name == "nvfp4_row_scaled":
        return  # one amax per row: FSDP2 does not cut it (refops.sharding.row_major.cuttable)
    for start, stop in ((0, 256), (256, 512), (128, 384)):
        piece = cut(whole, start, stop)
        assert torch.equal(encode_row_blocks(piece), blocks[start // g : stop // g])
        assert _same(decode_row_blocks(blocks[start // g : stop // g], like=piece, rows=stop - start), piece)


def test_a_partial_last_block_round_trips():
    whole = Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True)(torch.randn(200, 64))
    blocks = encode_row_blocks(whole)
    assert blocks.shape[0] == 2  # 128 + 72 rows
    assert _same(decode_row_blocks(blocks), whole) and _same(decode_row_blocks(blocks, like=whole, rows=200), whole)


def test_the_blocks_usages_are_the_decoded_tensors():
    """As a single-process checkpoint always did, the loaded weight holds what was saved, whatever the target's usages."""
    x = torch.randn(64, 64)
    both = MXFP8Quantizer(E4M3)(x)
    decoded = decode_row_blocks(encode_row_blocks(both), like=MXFP8Quantizer(E4M3, columnwise=False)(x))
    assert _same(decoded, both)


def test_blocks_of_another_format_quantizer_or_size_are_refused():
    x = torch.randn(16, 64)
    blocks = encode_row_blocks(Float8CurrentScalingQuantizer(E4M3)(x))
    with pytest.raises(ValueError, match=r"is stored as a Float8Tensor of \(16, 64\) .* but the checkpoint's row blocks "
                                         r"hold a Float8Tensor of 16 x 64 made by Float8CurrentScalingQuantizer"):
        decode_row_blocks(blocks, like=Float8CurrentScalingQuantizer(E5M2)(x))  # same width, other meaning
    delayed = SCHEMES["fp8_delayed"]()(x)  # the same tensor class and format, another recipe
    with pytest.raises(ValueError, match=r"quantized by Float8CurrentScalingQuantizer but this weight by "
                                         r"Float8Quantizer .*another recipe"):
        decode_row_blocks(blocks, like=delayed)
    mx = torch.randn(64, 64)
    mx_blocks = encode_row_blocks(MXFP8Quantizer(E4M3)(mx))
    with pytest.raises(ValueError, match=r"expected 1 row blocks of \d+ bytes .*truncated or corrupt"):
        decode_row_blocks(mx_blocks, like=MXFP8Quantizer(E4M3)(mx[:32]), rows=32)
    with pytest.raises(ValueError, match=r"expected 2 row blocks .*got a torch.uint8 tensor of shape \(1, "):
        decode_row_blocks(mx_blocks[:1], like=MXFP8Quantizer(E4M3)(mx), rows=64)


def test_blocks_that_disagree_or_are_corrupt_are_refused():
    x = torch.randn(16, 64)
    blocks = encode_row_blocks(Float8CurrentScalingQuantizer(E4M3)(x))
    other = encode_row_blocks(Float8CurrentScalingQuantizer(E4M3)(2 * x))
    mixed = torch.cat([blocks[:8], other[8:]])
    with pytest.raises(ValueError, match="disagree on the whole-tensor fp8_scale_inv"):
        decode_row_blocks(mixed)
    corrupt = blocks.clone()
    corrupt[0, 0] = 0
    with pytest.raises(ValueError, match="bad magic"):
        decode_row_blocks(corrupt)
    corrupt = blocks.clone()
    corrupt[3, 8] = 2  # another tensor class in one block
    with pytest.raises(ValueError, match="do not all carry the same descriptor"):
        decode_row_blocks(corrupt)
    block = Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True)(torch.randn(200, 64))
    wrong = torch.cat([encode_row_blocks(block)[1:], encode_row_blocks(block)[:1]])  # the partial block first
    with pytest.raises(ValueError, match=r"row counts \[72, 128\] are not those of consecutive blocks"):
        decode_row_blocks(wrong)


def test_dequantize_state_dict_reads_row_blocks():
    whole = _tensor("mxfp8")
    out = dequantize_state_dict({"1.weight": encode_row_blocks(whole), "1.bias": torch.ones(3)})
    assert torch.equal(out["1.weight"], whole.dequantize()) and torch.equal(out["1.bias"], torch.ones(3))
