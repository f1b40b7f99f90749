"""The sharding layer: quantized tensors cut, gathered and checkpointed along dim 0, above ``ops``, below
``distributed``.

* :mod:`.scheme_forms`, :mod:`.row_major`: each scheme's row-major form (its arrays with dim 0 over the
  tensor's rows), and the exact dim-0 cuts it gives;
* :mod:`.cuts`: ``split``/``slice``/``new_zeros`` of quantized tensors (how FSDP2 shards a weight);
* :mod:`.quantized_gather`: the one quantized all-gather along dim 0, for tensor parallelism and FSDP2;
* :mod:`.fsdp2_all_gather`: FSDP2's all-gather extension of quantized tensors;
* :mod:`.row_blocks`, :mod:`.sharded_checkpoint`, :mod:`.state_dict_form`: the one state-dict form of a
  quantized weight (row blocks), in one process and under FSDP2;
* :mod:`.parameter_owners`: the FSDP2 route from ``meta`` (``reset_parameter_owners``).

The layers below dispatch to this one through hooks it fills when imported (``import refops`` imports it):
``QuantizedTensor``'s torch-dispatch table and FSDP2 extension (``refops.quantization.quantized_tensor``),
tensor parallelism's quantized gather (``refops.ops.tensor_parallel_gather``) and the state-dict form
(``refops.ops.quantized_checkpoint``).
"""

from . import cuts, fsdp2_all_gather, quantized_gather, state_dict_form  # noqa: F401  (they install the hooks)
from ..ops.dtensor_parameters import PER_OP_SHARDING_FIX
from .parameter_owners import reset_parameter_owners
from .row_blocks import decode_row_blocks, encode_row_blocks, is_row_blocks
from .row_major import block_rows, from_row_major, rows, to_row_major, zeros_like_rows

__all__ = [
    "PER_OP_SHARDING_FIX",
    "reset_parameter_owners",
    "encode_row_blocks",
    "decode_row_blocks",
    "is_row_blocks",
    "block_rows",
    "to_row_major",
    "from_row_major",
    "rows",
    "zeros_like_rows",
]
