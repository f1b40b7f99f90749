"""The one quantized dim-0 gather (:mod:`refops.sharding.quantized_gather`) without a process group.

The all-gather itself concatenates each input along dim 0, so concatenating two shards' inputs here is what 2
ranks receive. Checked: gathered shards rebuild, bit for bit, what quantizing the whole gives (block-local
schemes, and per-tensor FP8 with one scale), for weights and for the 3-D activations sequence parallelism
gathers, with the usages asked; shards cut from one tensor rebuild it for every scheme; shards whose
whole-tensor scales differ are found; and a shard that splits a scaling block is refused.
"""

from __future__ import annotations

import pytest
import torch

from refops.quantization import (
    DType,
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
    QuantizedTensor,
)
from refops.sharding.quantized_gather import assemble, first_disagreement, gather_inputs
from refops.sharding.row_major import rows, shared_arrays, usages_of

E4M3 = DType.kFloat8E4M3
#: Quantizers whose shards quantize alone to the whole's bytes (no whole-tensor amax).
LOCAL = {
    "fp8_delayed": lambda: Float8Quantizer(torch.full((1,), 4.0), torch.zeros(1), E4M3),
    "mxfp8": lambda: MXFP8Quantizer(E4M3),
    "block_2d": lambda: Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True),
    "block_1d": lambda: Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True, block_scaling_dim=1),
}
CUT = {**LOCAL, "fp8_current": lambda: Float8CurrentScalingQuantizer(E4M3), "nvfp4": lambda: NVFP4Quantizer(),
       "nvfp4_rht": lambda: NVFP4Quantizer(with_rht=True)}


def _arrays(t: QuantizedTensor) -> dict[str, torch.Tensor]:
    return {a: getattr(t, a) for a in t._array_names() if getattr(t, a) is not None}


def _same(a: QuantizedTensor, b: QuantizedTensor) -> bool:
    x, y = _arrays(a), _arrays(b)
    return type(a) is type(b) and a.shape == b.shape and x.keys() == y.keys() and all(
        x[k].shape == y[k].shape and torch.equal(x[k], y[k]) for k in x)


def _gather(shards: list[QuantizedTensor], usages: tuple[str, ...]) -> QuantizedTensor:
    plans, inputs = zip(*(gather_inputs(s, usages, what="test") for s in shards))
    outputs = tuple(torch.cat(parts) for parts in zip(*inputs))
    assert first_disagreement(plans[0], outputs) is None
    shape = torch.Size((len(shards) * shards[0].shape[0], *shards[0].shape[1:]))
    return assemble(shards[0], plans[0], outputs, shape=shape, shared=shared_arrays(shards[0], usages))


@pytest.mark.parametrize("shape", [(256, 128), (128, 2, 128)], ids=["weight", "sequence-parallel-activation"])
@pytest.mark.parametrize("name", list(LOCAL))
def test_gathered_shards_are_the_whole_quantized(name, shape):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    whole = LOCAL[name]()(x)
    halves = [LOCAL[name]()(part) for part in x.chunk(2)]
    assert _same(_gather(halves, usages_of(whole)), whole)


@pytest.mark.parametrize("name", list(CUT))
def test_shards_cut_from_one_tensor_gather_back_to_it(name):
    x = torch.randn(256, 128, generator=torch.Generator().manual_seed(1))
    if name == "nvfp4_rht":
        x = x.to(torch.bfloat16)
    whole = CUT[name]()(x)
    assert _same(_gather([rows(whole, 0, 128), rows(whole, 128, 256)], usages_of(whole)), whole)


def test_a_gather_keeps_the_usages_asked():
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(2))
    rowwise = MXFP8Quantizer(E4M3, columnwise=False)
    assert _same(_gather([MXFP8Quantizer(E4M3)(p) for p in x.chunk(2)], ("rowwise",)), rowwise(x))
    fp8 = LOCAL["fp8_delayed"]
    only_rowwise = fp8()
    only_rowwise.set_usage(rowwise=True, columnwise=False)  # per-tensor FP8 rebuilds the transpose after the gather
    assert _same(_gather([only_rowwise(p) for p in x.chunk(2)], ("rowwise", "columnwise")), fp8()(x))


def test_disagreeing_scales_are_found_and_split_blocks_refused():
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(3))
    shards = [Float8CurrentScalingQuantizer(E4M3)(p) for p in (x[:32], 2 * x[32:])]
    plans, inputs = zip(*(gather_inputs(s, usages_of(s), what="test") for s in shards))
    bad = first_disagreement(plans[0], tuple(torch.cat(parts) for parts in zip(*inputs)))
    assert bad is not None and bad[0] == "fp8_scale_inv" and bad[1].shape == (2, 1)
    tiles = LOCAL["block_2d"]()(x)  # 64 rows: half a 128-row tile
    with pytest.raises(ValueError, match=r"test: a Float8BlockwiseQTensor shard of shape \(64, 64\) does not quantize "
                                         r"to whole blocks along dim 0"):
        gather_inputs(tiles, usages_of(tiles), what="test")
