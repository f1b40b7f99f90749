"""Row blocks (:mod:`refops.quantization.row_blocks`): a quantized 2-D tensor as one uint8 matrix, one row per
block of its rows, which is how an FSDP2-sharded quantized weight travels through ``torch.distributed.checkpoint``.

Checked for every scheme: the encoding decodes bit for bit; the blocks of a cut (on block bounds) are the
rows of the whole tensor's blocks, so any sharding's checkpoint decodes into any other; and blocks of another
scheme, format or usages, of another size, or whose shared scales disagree are refused, never reinterpreted.
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
from refops.quantization.row_blocks import block_rows, decode_row_blocks, encode_row_blocks, is_row_blocks
from refops.quantization.row_layout import rows as cut

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
}


def _arrays(t: QuantizedTensor) -> dict[str, torch.Tensor]:
    return {a: getattr(t, a) for a in t._array_names() if getattr(t, a) is not None}


def _same(a: QuantizedTensor, b: QuantizedTensor) -> bool:
    x, y = _arrays(a), _arrays(b)
    return type(a) is type(b) and x.keys() == y.keys() and all(
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
    assert _same(decode_row_blocks(whole, blocks, rows=512), whole)
    for start, stop in ((0, 256), (256, 512), (128, 384)):
        piece = cut(whole, start, stop)
        assert torch.equal(encode_row_blocks(piece), blocks[start // g : stop // g])
        assert _same(decode_row_blocks(piece, blocks[start // g : stop // g], rows=stop - start), piece)


def test_a_partial_last_block_round_trips():
    whole = Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True)(torch.randn(200, 64))
    blocks = encode_row_blocks(whole)
    assert blocks.shape[0] == 2  # 128 + 72 rows
    assert _same(decode_row_blocks(whole, blocks, rows=200), whole)


def test_blocks_of_another_format_size_or_with_disagreeing_scales_are_refused():
    x = torch.randn(16, 64)
    blocks = encode_row_blocks(Float8CurrentScalingQuantizer(E4M3)(x))
    e5m2 = Float8CurrentScalingQuantizer(E5M2)(x)  # same width, other meaning
    with pytest.raises(ValueError, match="encoded from a tensor stored another way"):
        decode_row_blocks(e5m2, blocks, rows=16)
    rowwise_only = Float8CurrentScalingQuantizer(E4M3, columnwise=False)(x)  # same bytes, other usages
    with pytest.raises(ValueError, match=r"stored another way .*\"usages\": \[\"rowwise\"\]"):
        decode_row_blocks(rowwise_only, blocks, rows=16)
    mx = torch.randn(64, 64)
    mx_blocks = encode_row_blocks(MXFP8Quantizer(E4M3)(mx))
    with pytest.raises(ValueError, match=r"expected 2 row blocks of 2120 bytes .* got a torch.uint8 tensor of shape "
                                         r"\(2, 4232\)"):
        decode_row_blocks(MXFP8Quantizer(E4M3, columnwise=False)(mx), mx_blocks, rows=64)
    with pytest.raises(ValueError, match=r"expected 1 row blocks"):
        decode_row_blocks(MXFP8Quantizer(E4M3)(mx[:32]), mx_blocks, rows=32)
    mixed = blocks.clone()
    mixed[8:, 8:12] = encode_row_blocks(Float8CurrentScalingQuantizer(E4M3)(2 * x))[8:, 8:12]
    with pytest.raises(ValueError, match="disagree on the whole-tensor fp8_scale_inv"):
        decode_row_blocks(Float8CurrentScalingQuantizer(E4M3)(x), mixed, rows=16)
    corrupt = blocks.clone()
    corrupt[3, 0] = 0
    with pytest.raises(ValueError, match="bad magic"):
        decode_row_blocks(Float8CurrentScalingQuantizer(E4M3)(x), corrupt, rows=16)


def test_dequantize_state_dict_refuses_row_blocks_it_cannot_read():
    blocks = encode_row_blocks(_tensor("mxfp8"))
    with pytest.raises(ValueError, match=r"state_dict\['1.weight'\] holds a quantized weight as row blocks"):
        dequantize_state_dict({"1.weight": blocks})
