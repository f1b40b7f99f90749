"""torchao's block-scaled casts: two shipped defects, each one fix away from TE's encoding.

* MXFP8 (pytorch/ao#4117): ``mx_cast`` is TE's rule (``docs/recipes/mxfp8.md#the-arithmetic``), the one
  :mod:`.quantizer_mxfp8` builds: block exponent e from v = RN(amax * fl(1/448)) rounded up to a power
  of two, data ``x * 2^(127 - e)``, the exact reciprocal of the block scale. torchao's CUDA kernel took
  that reciprocal with ``exp2f_rcp``, which returned 1 for the biased exponent 0 (the scale 2^-127,
  whose reciprocal is 2^127): a block with a tiny amax is scaled by 1 and its codes flush to zero.
* NVFP4 packing (pytorch/ao, commit 28612d0, "align fp4 packing to PyTorch Core definition"): torchao
  put element 2j of each pair in the high nibble and 2j+1 in the low one, the reverse of
  ``torch.float4_e2m1fn_x2`` (and of TE's and cuBLAS's layout, which refops keeps); its own unpacking
  and GEMMs agreed with it, so only bytes handed to other code decode swapped. The fix swapped them.
"""

from __future__ import annotations

from typing import Any

import torch

import refops as te
from refops.quantization import NVFP4Quantizer
from refops.testing import check_quantizer

from .cases import RecallCase
from .quantizer_mxfp8 import mxfp8_quantize
from .quantizer_nvfp4 import nvfp4_quantize


def mx_cast(x: torch.Tensor, quantizer: Any, rcp_of_zero_exponent_is_one: bool = False
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(E4M3 data, E8M0 scale bytes)`` in TE's unpadded layout for the orientation asked: the corpus's MXFP8
    quantizer, with the reciprocal defect of pytorch/ao#4117 when asked."""
    return mxfp8_quantize(x, quantizer, "rcp_of_zero_exponent_is_one" if rcp_of_zero_exponent_is_one else None)


def nvfp4_packed(x: torch.Tensor, quantizer: Any, first_in_high_nibble: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NVFP4 codes packed two a byte along the blocked dim, with the block scales and the amax."""
    codes, block_scales, amax = nvfp4_quantize(x, quantizer, decode_factor_for_encode=False)
    first, second = codes[..., 0::2], codes[..., 1::2]
    packed = (first << 4) | second if first_in_high_nibble else first | (second << 4)
    return packed, block_scales, amax


def _check(rcp_of_zero_exponent_is_one: bool) -> Any:
    return check_quantizer(lambda x, quantizer: mx_cast(x, quantizer, rcp_of_zero_exponent_is_one),
                           te.recipe.MXFP8BlockScaling(), output="data_and_scale_inv")


def _check_packing(first_in_high_nibble: bool) -> Any:
    return check_quantizer(lambda x, quantizer: nvfp4_packed(x, quantizer, first_in_high_nibble), NVFP4Quantizer(),
                           output="data_and_scale_inv")


CASES = [
    RecallCase("mxfp8_rcp_of_smallest_scale_is_one", "https://github.com/pytorch/ao/pull/4117", "quantizer",
               "the E8M0 reciprocal returns 1 for the biased exponent 0 (scale 2^-127) instead of 2^127: "
               "a block with a tiny amax is not scaled up and flushes to zero",
               lambda: _check(True), lambda: _check(False)),
    RecallCase("fp4_pair_packed_high_nibble_first", "https://github.com/pytorch/ao/commit/"
               "28612d00eaa711ba91e23d0aa9aec3ca45ba37b2", "quantizer",
               "FP4 codes are packed with element 2j in the high nibble, the reverse of torch.float4_e2m1fn_x2 "
               "(and TE's layout): every other code decodes swapped with its neighbour",
               lambda: _check_packing(True), lambda: _check_packing(False)),
]
