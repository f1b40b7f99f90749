"""The one state-dict form of a quantized weight: its row blocks, a plain matrix in one process and a DTensor of
the same matrix under FSDP2. Importing this module installs it as ``refops.ops.quantized_checkpoint``'s form."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..ops.quantized_checkpoint import install_quantized_parameter_form
from ..quantization.quantized_tensor import QuantizedTensor
from .row_blocks import decode_row_blocks, describe_row_blocks, encode_row_blocks, is_row_blocks
from .sharded_checkpoint import decode_sharded_entry, is_sharded_quantized, sharded_row_blocks

__all__ = ["RowBlockForm"]


class RowBlockForm:
    """:class:`refops.ops.quantized_checkpoint.QuantizedParameterForm` by row blocks."""

    def encode(self, param: Any, *, what: str) -> torch.Tensor:
        return sharded_row_blocks(param, what=what) if is_sharded_quantized(param) else encode_row_blocks(param, what=what)

    def is_entry(self, value: Any) -> bool:
        return is_row_blocks(value)

    def describe(self, value: torch.Tensor, *, what: str) -> str:
        return describe_row_blocks(value, what=what)

    def decode(self, value: torch.Tensor, *, like: Optional[QuantizedTensor], rows: Optional[int],
               what: str) -> QuantizedTensor:
        return decode_row_blocks(value, like=like, rows=rows, what=what)

    def decode_shard(self, param: Any, value: Any, *, what: str, decode_legacy: Any) -> QuantizedTensor:
        return decode_sharded_entry(param, value, what=what, decode_legacy=decode_legacy)


install_quantized_parameter_form(RowBlockForm())
