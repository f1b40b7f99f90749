"""Row blocks: a quantized 2-D tensor as one plain uint8 matrix whose rows follow the tensor's rows.

A sharded checkpoint (``torch.distributed.checkpoint``) stores plain tensors and reshards them by slicing
along their dims. A quantized weight is not one plain tensor: per-tensor FP8 keeps a transposed copy,
MXFP8 and NVFP4 pad their scales, shared scales belong to no row. Its row-major layout
(:mod:`refops.quantization.row_layout`) is the way out: every array, un-padded and transposed where
needed, has dim 0 over the weight's rows in blocks of ``g`` rows (``g`` = the scheme's block rows).

Block ``b`` of the encoding holds everything about rows ``[b g, (b + 1) g)``, as one uint8 row of
``width`` bytes::

    b"RQB1" | crc32 of the encoding description (4 bytes) | shared arrays | each row-major array's rows

The description is the tensor class, its format metadata (FP8 format, 2D scaling, NVFP4 options), its
usages and its trailing dims: what the bytes mean. Shared arrays (per-tensor FP8's ``scale_inv``, NVFP4's
global amaxes) are repeated in every block, so any slice of blocks can be decoded on its own. The last
block of a tensor whose rows are not a multiple of ``g`` is zero-padded to ``width``.

Invariants: ``decode_row_blocks(t, encode_row_blocks(t), rows=t.shape[0])`` rebuilds ``t`` bit for bit,
and the blocks of rows ``[a, b)`` (``a``, ``b`` on block bounds) are rows ``[a / g, ceil(b / g))`` of the
whole tensor's blocks. So a checkpoint saved from any sharding loads into any other, bit for bit.
Decoding checks the magic, the description (a block of another scheme, format or layout is refused,
never reinterpreted) and that every block agrees on the shared arrays.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import torch

from .quantized_tensor import QuantizedTensor
from .row_layout import from_row_major, row_layout, to_row_major

__all__ = ["ROW_BLOCK_MAGIC", "block_rows", "encode_row_blocks", "decode_row_blocks", "row_block_width",
           "is_row_blocks"]

ROW_BLOCK_MAGIC = b"RQB1"
_HEADER = 8  # magic + crc32


def _ceil_div(n: int, d: int) -> int:
    return -(-n // d)


def block_rows(tensor: QuantizedTensor, *, what: str = "row blocks") -> int:
    """``g``: the rows of ``tensor`` one block covers (the largest row granularity of its arrays)."""
    return row_layout(tensor, what=what).block_rows(tensor)


def _description(tensor: QuantizedTensor) -> bytes:
    """What the bytes mean, canonically: class, format metadata, usages, trailing dims (not the nominal dtype,
    which only says how values are returned, nor the row count, which the blocks carry)."""
    meta = {kw: getattr(tensor, attr) for kw, (attr, _) in tensor._CTOR_META.items()}
    meta = {kw: int(v) if isinstance(v, (bool, int)) or hasattr(v, "value") else v for kw, v in meta.items()}
    usages = [u for u in ("rowwise", "columnwise") if tensor.has_usage(u)]
    return json.dumps({"class": type(tensor).__name__, "meta": meta, "usages": usages,
                       "trailing": list(tensor.shape[1:])}, sort_keys=True).encode()


def _fingerprint(tensor: QuantizedTensor) -> bytes:
    return zlib.crc32(_description(tensor)).to_bytes(4, "little")


def _parts(tensor: QuantizedTensor, *, what: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict]:
    """(row-major arrays, shared arrays, granularities), each in a fixed (constructor keyword) order."""
    layout = row_layout(tensor, what=what)
    arrays = to_row_major(tensor, what=what)
    metadata = tensor.get_metadata()
    shared = {kw: metadata[kw] for kw in layout.shared if metadata[kw] is not None}
    order = list(type(tensor)._CTOR_TENSORS)
    return ({kw: arrays[kw] for kw in order if kw in arrays}, {kw: shared[kw] for kw in order if kw in shared},
            layout.granularities(tensor))


def _row_bytes(array: torch.Tensor) -> int:
    """Bytes of one row (dim-0 slice) of ``array``."""
    per_row = 1
    for d in array.shape[1:]:
        per_row *= d
    return per_row * array.element_size()


def _as_bytes(array: torch.Tensor) -> torch.Tensor:
    """``array`` as a (rows, bytes per row) uint8 matrix."""
    rows = array.shape[0] if array.dim() else 1
    flat = _dense(array.reshape(-1))
    return (flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat).reshape(rows, -1)


def _dense(flat: torch.Tensor) -> torch.Tensor:
    """A 1-D tensor with stride 1 (a size-1 slice may keep another stride, and then cannot be viewed as bytes)."""
    if flat.numel() == 0 or flat.stride(0) == 1:
        return flat
    return torch.empty(flat.shape, dtype=flat.dtype, device=flat.device).copy_(flat)


def row_block_width(tensor: QuantizedTensor, *, what: str = "row blocks") -> int:
    """Bytes in one block of ``tensor``'s encoding (independent of its row count)."""
    arrays, shared, grans = _parts(tensor, what=what)
    g = block_rows(tensor, what=what)
    width = _HEADER + sum(v.numel() * v.element_size() for v in shared.values())
    return width + sum((g // grans[kw]) * _row_bytes(a) for kw, a in arrays.items())


def encode_row_blocks(tensor: QuantizedTensor, *, what: str = "row blocks") -> torch.Tensor:
    """``tensor`` (2-D) as a ``(ceil(rows / g), width)`` uint8 matrix, block ``b`` holding rows ``[b g, (b+1) g)``."""
    arrays, shared, grans = _parts(tensor, what=what)
    g, rows = block_rows(tensor, what=what), tensor.shape[0]
    count, width = _ceil_div(rows, g), row_block_width(tensor, what=what)
    out = torch.zeros(count, width, dtype=torch.uint8, device=tensor.device)
    if count == 0:
        return out
    header = torch.tensor(list(ROW_BLOCK_MAGIC + _fingerprint(tensor)), dtype=torch.uint8, device=tensor.device)
    column = 0

    def put(values: torch.Tensor) -> None:  # values: (count, n) uint8
        nonlocal column
        out[:, column : column + values.shape[1]] = values
        column += values.shape[1]

    put(header.expand(count, -1))
    for value in shared.values():
        put(_as_bytes(value.reshape(1, -1)).reshape(1, -1).expand(count, -1))
    for kw, array in arrays.items():
        per_block = g // grans[kw]  # array rows per block
        raw = _as_bytes(array)
        padded = raw.new_zeros(count * per_block, raw.shape[1])
        padded[: raw.shape[0]] = raw
        put(padded.reshape(count, per_block * raw.shape[1]))
    return out


def is_row_blocks(value: Any) -> bool:
    """Whether ``value`` looks like :func:`encode_row_blocks` output (2-D uint8 whose blocks start with the magic)."""
    if not isinstance(value, torch.Tensor) or isinstance(value, QuantizedTensor) or value.is_meta:
        return False
    if value.dtype != torch.uint8 or value.dim() != 2 or value.shape[1] < _HEADER:
        return False
    return value.shape[0] == 0 or bytes(value[0, :4].tolist()) == ROW_BLOCK_MAGIC


def decode_row_blocks(template: QuantizedTensor, blocks: torch.Tensor, *, rows: int,
                      what: str = "row blocks") -> QuantizedTensor:
    """A tensor of ``template``'s class, quantizer, format and trailing dims, with ``rows`` rows, from ``blocks``.

    Raises ``ValueError`` naming ``what`` when ``blocks`` were not encoded from a tensor stored the way
    ``template`` is (another scheme, format, usages or size), are too few for ``rows``, or disagree on
    the shared arrays (shards whose whole-tensor scales differ cannot form one tensor).
    """
    arrays, shared, grans = _parts(template, what=what)
    g = block_rows(template, what=what)
    count, width = _ceil_div(rows, g), row_block_width(template, what=what)
    if blocks.dim() != 2 or blocks.dtype != torch.uint8 or tuple(blocks.shape) != (count, width):
        raise ValueError(
            f"{what}: expected {count} row blocks of {width} bytes (a {type(template).__name__} of "
            f"{rows} x {tuple(template.shape[1:])} stored like this one), got a {blocks.dtype} tensor of shape "
            f"{tuple(blocks.shape)}: the checkpoint holds this weight quantized another way or with another shape"
        )
    blocks = blocks.to(template.device)
    if count and not all(bytes(row[:4].tolist()) == ROW_BLOCK_MAGIC for row in blocks[:, :4].cpu()):
        raise ValueError(f"{what}: the row blocks are not refops row blocks (bad magic): corrupt or not a weight")
    expected = torch.tensor(list(_fingerprint(template)), dtype=torch.uint8, device=blocks.device)
    if count and not bool((blocks[:, 4:_HEADER] == expected).all()):
        raise ValueError(
            f"{what}: the row blocks were encoded from a tensor stored another way (scheme, format or usages), "
            f"not as this {type(template).__name__} ({_description(template).decode()}); nothing is "
            "reinterpreted: build the model with the checkpoint's recipe"
        )
    column = _HEADER

    def take(nbytes: int) -> torch.Tensor:
        nonlocal column
        part = blocks[:, column : column + nbytes]
        column += nbytes
        return part

    decoded_shared = {}
    for kw, value in shared.items():
        part = take(value.numel() * value.element_size())
        if count and not bool((part == part[:1]).all()):
            raise ValueError(
                f"{what}: the row blocks disagree on the whole-tensor {kw}: they come from shards quantized with "
                "different scales and cannot form one tensor"
            )
        source = part[0] if count else _as_bytes(value.reshape(1, -1)).reshape(-1)
        decoded_shared[kw] = _dense(source.clone()).view(value.dtype).reshape(value.shape)
    decoded = {}
    for kw, array in arrays.items():
        per_block, row_bytes = g // grans[kw], _row_bytes(array)
        part = take(per_block * row_bytes).reshape(count * per_block, row_bytes)[: _ceil_div(rows, grans[kw])]
        decoded[kw] = _dense(part.reshape(-1)).view(array.dtype).reshape(part.shape[0], *array.shape[1:])
    return from_row_major(template, decoded, torch.Size((rows, *template.shape[1:])), decoded_shared)
