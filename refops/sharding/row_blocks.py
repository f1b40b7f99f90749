"""Row blocks: a quantized 2-D tensor as one plain uint8 matrix whose rows follow the tensor's rows.

This is the one state-dict form of a quantized weight, in one process and under FSDP2 alike. A checkpoint
(``torch.save``, ``torch.distributed.checkpoint``) stores plain tensors, and DCP reshards them by slicing
along dim 0, which a quantized tensor's stored arrays do not follow; its row-major form
(:mod:`refops.sharding.row_major`) does: every array, without padding and transposed where needed, has dim
0 over the weight's rows in blocks of ``g`` rows (``g`` = :func:`~refops.sharding.row_major.block_rows`).

Block ``b`` holds everything about rows ``[b g, (b + 1) g)``, as one uint8 row of ``width`` bytes::

    b"RQB2" | crc32 of the quantizer's scheme | descriptor (int32s)
            | shared arrays | each row-major array's rows

The descriptor says what the bytes mean: the tensor class, nominal dtype, usages, the quantizer class, the
columns and the format metadata (FP8 format, 2-D scaling, NVFP4 options), the same in every block; then the
rows the block holds (``g``, fewer in a last block, which is zero-padded to ``width``). Shared arrays
(per-tensor FP8's ``scale_inv``, NVFP4's global amaxes) are repeated in every block. So any slice of blocks
decodes on its own, without a model (:func:`decode_row_blocks` with no ``like``, which is how
``dequantize_state_dict`` reads them).

Invariants: ``decode_row_blocks(encode_row_blocks(t))`` rebuilds ``t`` bit for bit (without its quantizer;
``like=`` gives one), and the blocks of rows ``[a, b)`` (``a``, ``b`` on block bounds) are rows
``[a / g, ceil(b / g))`` of the whole tensor's blocks: a checkpoint saved from any sharding loads into any
other, bit for bit. Decoding checks the magic, that every block has the same descriptor and agrees on the
shared arrays, and, given ``like``, that the blocks hold the same scheme, format and quantizer options:
nothing is ever reinterpreted.
"""

from __future__ import annotations

import dataclasses
import json
import math
import zlib
from typing import Any, Optional

import torch

from ..ops.quantized_checkpoint import quantizer_scheme
from ..quantization.quantized_tensor import TENSOR_CLASSES, USAGES, QuantizedTensor
from ..layouts import ceil_div
from .row_major import block_rows, build_from_row_major, meta_of, shared_arrays, to_row_major, usages_of
from .scheme_forms import SCHEME_FORMS

__all__ = ["ROW_BLOCK_MAGIC", "RowBlockHeader", "encode_row_blocks", "decode_row_blocks", "describe_row_blocks",
           "read_header", "read_first_header", "scheme_mismatch", "HEADER_PREFIX_BYTES", "row_block_width",
           "is_row_blocks", "block_rows"]

ROW_BLOCK_MAGIC = b"RQB2"
# Codes of the descriptor (index + 1; 0 is "none"). Appending keeps old checkpoints readable; never reorder.
_CLASSES = ("Float8Tensor", "MXFP8Tensor", "Float8BlockwiseQTensor", "NVFP4Tensor")
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_QUANTIZERS = ("Float8Quantizer", "Float8CurrentScalingQuantizer", "MXFP8Quantizer", "Float8BlockQuantizer",
               "NVFP4Quantizer")
_UNNAMED_QUANTIZER = 255  # a quantizer class refops does not name: its scheme's crc still identifies it
_FIXED_FIELDS = 6  # class, dtype, usages, quantizer, cols, the class's metadata..., then the block's rows


@dataclasses.dataclass(frozen=True)
class RowBlockHeader:
    """What a block's header says of the tensor the blocks come from."""

    tensor_class: type[QuantizedTensor]
    dtype: torch.dtype
    usages: tuple[str, ...]
    quantizer: Optional[str]  # class name; None: stored without a quantizer
    scheme_crc: int
    cols: int
    meta: dict[str, Any]
    rows: int  # the rows the first block holds

    @property
    def nbytes(self) -> int:
        return 8 + 4 * (_FIXED_FIELDS + len(self.meta))


def _scheme_crc(quantizer: Any) -> int:
    if quantizer is None:
        return 0
    return zlib.crc32(json.dumps(quantizer_scheme(quantizer), sort_keys=True).encode())


def _header_of(tensor: QuantizedTensor, rows: int = 0) -> RowBlockHeader:
    quantizer = tensor.quantizer
    return RowBlockHeader(type(tensor), tensor.dtype, usages_of(tensor),
                          None if quantizer is None else type(quantizer).__name__, _scheme_crc(quantizer),
                          tensor.shape[1], meta_of(tensor), rows)


def _header_bytes(header: RowBlockHeader) -> bytes:
    quantizer = 0 if header.quantizer is None else (
        _QUANTIZERS.index(header.quantizer) + 1 if header.quantizer in _QUANTIZERS else _UNNAMED_QUANTIZER)
    usages = sum(1 << i for i, u in enumerate(USAGES) if u in header.usages)
    fields = [_CLASSES.index(header.tensor_class.__name__) + 1, _DTYPES.index(header.dtype) + 1, usages, quantizer,
              header.cols, *(int(v) for v in header.meta.values()), header.rows]
    return (ROW_BLOCK_MAGIC + header.scheme_crc.to_bytes(4, "little")
            + b"".join(v.to_bytes(4, "little", signed=True) for v in fields))


def _parse_header(raw: bytes, *, what: str) -> RowBlockHeader:
    """The header at the start of ``raw`` (one block), or a ``ValueError`` naming ``what``."""
    if raw[:4] != ROW_BLOCK_MAGIC or len(raw) < 8 + 4 * _FIXED_FIELDS:
        raise ValueError(f"{what}: the row blocks are not refops row blocks (bad magic): corrupt or not a weight")
    fields = [int.from_bytes(raw[i : i + 4], "little", signed=True) for i in range(8, len(raw) - 3, 4)]
    code, dtype, usages, quantizer = fields[:4]
    if not (1 <= code <= len(_CLASSES) and 1 <= dtype <= len(_DTYPES)):
        raise ValueError(f"{what}: the row blocks' header is corrupt (tensor class {code}, dtype {dtype})")
    cls = TENSOR_CLASSES[_CLASSES[code - 1]]
    meta_kinds = list(cls._CTOR_META.items())
    values = fields[_FIXED_FIELDS - 1 : _FIXED_FIELDS - 1 + len(meta_kinds) + 1]
    if len(values) != len(meta_kinds) + 1:
        raise ValueError(f"{what}: the row blocks' header is truncated")
    meta = {kw: type(default)(v) for (kw, (_, default)), v in zip(meta_kinds, values)}
    name = None if quantizer == 0 else (_QUANTIZERS[quantizer - 1] if quantizer <= len(_QUANTIZERS) else "a quantizer")
    return RowBlockHeader(cls, _DTYPES[dtype - 1], tuple(u for i, u in enumerate(USAGES) if usages >> i & 1), name,
                          int.from_bytes(raw[4:8], "little"), fields[4], meta, values[-1])


def _specs(header: RowBlockHeader) -> tuple[dict, dict, int, int]:
    """(row-major array specs, shared array specs, g, width) of blocks with ``header``."""
    form = SCHEME_FORMS[header.tensor_class.__name__]
    arrays = form.arrays(header.cols, header.meta, header.usages)
    shared = form.shared(header.cols, header.meta, header.usages)
    g = max(a.granularity for a in form.arrays(header.cols, header.meta, USAGES).values())
    width = header.nbytes + sum(math.prod(s.shape) * s.dtype.itemsize for s in shared.values())
    width += sum((g // a.granularity) * math.prod(a.row_shape) * a.dtype.itemsize for a in arrays.values())
    return arrays, shared, g, width


def row_block_width(tensor: QuantizedTensor, *, what: str = "row blocks") -> int:
    """Bytes in one block of ``tensor``'s encoding (independent of its row count)."""
    return _specs(_encodable(tensor, what=what))[3]


def _encodable(tensor: QuantizedTensor, *, what: str) -> RowBlockHeader:
    if type(tensor).__name__ not in _CLASSES or tensor.dim() != 2:
        raise NotImplementedError(f"{what}: only 2-D quantized tensors of refops' schemes are stored as row blocks "
                                  f"(got a {type(tensor).__name__} of shape {tuple(tensor.shape)})")
    return _header_of(tensor)


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


def encode_row_blocks(tensor: QuantizedTensor, *, what: str = "row blocks") -> torch.Tensor:
    """``tensor`` (2-D) as a ``(ceil(rows / g), width)`` uint8 matrix, block ``b`` holding rows ``[b g, (b+1) g)``."""
    header = _encodable(tensor, what=what)
    specs, _, g, width = _specs(header)
    arrays, shared = to_row_major(tensor, what=what), shared_arrays(tensor)
    rows = tensor.shape[0]
    count = ceil_div(rows, g)
    out = torch.zeros(count, width, dtype=torch.uint8, device=tensor.device)
    if count == 0:
        return out
    column = 0

    def put(values: torch.Tensor) -> None:  # values: (count, n) uint8
        nonlocal column
        out[:, column : column + values.shape[1]] = values
        column += values.shape[1]

    full, last = (_header_bytes(dataclasses.replace(header, rows=n)) for n in (g, rows - (count - 1) * g))
    put(torch.tensor(list(full), dtype=torch.uint8, device=tensor.device).expand(count, -1))
    out[-1, : header.nbytes] = torch.tensor(list(last), dtype=torch.uint8, device=tensor.device)
    for value in shared.values():
        put(_as_bytes(value.reshape(1, -1)).reshape(1, -1).expand(count, -1))
    for kw, array in arrays.items():
        spec = specs[kw]
        if array.dtype != spec.dtype or tuple(array.shape[1:]) != spec.row_shape:
            raise NotImplementedError(f"{what}: the {kw} of this {type(tensor).__name__} is {array.dtype} "
                                      f"{tuple(array.shape)}, not laid out as its row-major form states")
        per_block = g // spec.granularity  # array rows per block
        raw = _as_bytes(array)
        padded = raw.new_zeros(count * per_block, raw.shape[1])
        padded[: raw.shape[0]] = raw
        put(padded.reshape(count, per_block * raw.shape[1]))
    return out


def is_row_blocks(value: Any) -> bool:
    """Whether ``value`` looks like :func:`encode_row_blocks` output (plain 2-D uint8 whose blocks start with the magic)."""
    if type(value) is not torch.Tensor and not isinstance(value, torch.nn.Parameter):
        return False  # a QuantizedTensor or a DTensor is no plain matrix of blocks
    if value.is_meta or value.dtype != torch.uint8 or value.dim() != 2 or value.shape[1] < 8:
        return False
    return value.shape[0] == 0 or bytes(value[0, :4].tolist()) == ROW_BLOCK_MAGIC


def read_header(blocks: torch.Tensor, *, what: str = "row blocks") -> tuple[RowBlockHeader, int]:
    """The header the blocks share (its ``rows`` those of the first block) and the rows they hold together, or a
    ``ValueError`` naming ``what``: blocks must share their descriptor, and only a last block may hold fewer
    than ``g`` rows."""
    if blocks.dim() != 2 or blocks.dtype != torch.uint8 or blocks.shape[0] == 0:
        raise ValueError(f"{what}: expected row blocks (a non-empty 2-D uint8 tensor), got a {blocks.dtype} tensor "
                         f"of shape {tuple(blocks.shape)}: truncated or corrupt")
    header = _parse_header(bytes(blocks[0, : min(blocks.shape[1], 256)].cpu().tolist()), what=what)
    shared_part = header.nbytes - 4  # everything but the block's own row count
    expected = torch.tensor(list(_header_bytes(header)[:shared_part]), dtype=torch.uint8, device=blocks.device)
    if blocks.shape[1] < header.nbytes or not bool((blocks[:, :shared_part] == expected).all()):
        raise ValueError(f"{what}: the row blocks do not all carry the same descriptor: corrupt, or blocks of "
                         "different tensors put together")
    counts = _dense(blocks[:, shared_part : header.nbytes].reshape(-1).clone()).view(torch.int32).tolist()
    g = _specs(header)[2]
    if any(c != g for c in counts[:-1]) or not 1 <= counts[-1] <= g:
        raise ValueError(f"{what}: the row blocks' row counts {counts} are not those of consecutive blocks of {g} "
                         "rows: corrupt, or blocks of different tensors put together")
    return header, sum(counts)


#: Bytes at the start of a block that always hold its whole header (what a checkpoint check reads of a weight).
HEADER_PREFIX_BYTES = 256


def read_first_header(raw: bytes, *, what: str = "row blocks") -> RowBlockHeader:
    """The header at the start of one block's bytes (at most :data:`HEADER_PREFIX_BYTES` are needed), or a
    ``ValueError`` naming ``what`` (bad magic: not row blocks). Reads one block only: no consistency check."""
    return _parse_header(bytes(raw[:HEADER_PREFIX_BYTES]), what=what)


def scheme_mismatch(saved: RowBlockHeader, target: RowBlockHeader) -> Optional[str]:
    """Why blocks with header ``saved`` cannot load into a weight whose blocks carry ``target`` (None: they can);
    the checks :func:`decode_row_blocks` makes with ``like=``, on headers alone."""
    if (saved.tensor_class, saved.cols, saved.meta) != (target.tensor_class, target.cols, target.meta):
        return "another scheme or format"
    if saved.quantizer is not None and target.quantizer is not None and saved.scheme_crc != target.scheme_crc:
        return "another quantizer or other quantizer options"
    return None


def _check_like(header: RowBlockHeader, like: QuantizedTensor, *, what: str, rows: int) -> None:
    """The blocks mean the same values stored as ``like`` is: same scheme, format and quantizer options."""
    mine = _header_of(like) if like.dim() == 2 else None
    if header.tensor_class is not type(like) or mine is None or (header.cols, header.meta) != (mine.cols, mine.meta):
        raise ValueError(
            f"{what} is stored as a {type(like).__name__} of {tuple(like.shape)} "
            f"({json.dumps({k: int(v) for k, v in meta_of(like).items()})}) but the checkpoint's row blocks hold a "
            f"{header.tensor_class.__name__} {_described(header, rows)}: it was saved with another recipe or "
            "format, and nothing is reinterpreted. Build the model under quantized_model_init with that recipe, or "
            "load dequantize_state_dict(state_dict) to re-quantize"
        )
    if header.quantizer is not None and like.quantizer is not None and header.scheme_crc != mine.scheme_crc:
        raise ValueError(
            f"{what}: the row blocks were quantized by {header.quantizer} but this weight by "
            f"{type(like.quantizer).__name__} ({quantizer_scheme(like.quantizer)}): the checkpoint was saved with "
            "another recipe or other quantizer options. Build the model with that recipe, or load "
            "dequantize_state_dict(state_dict) to re-quantize"
        )


def _described(header: RowBlockHeader, rows: int) -> str:
    made_by = f" made by {header.quantizer}" if header.quantizer else ""
    meta = json.dumps({k: int(v) for k, v in header.meta.items()})
    return f"of {rows} x {header.cols}{made_by} ({meta}, usages {list(header.usages)})"


def describe_row_blocks(blocks: torch.Tensor, *, what: str = "row blocks") -> str:
    """What ``blocks`` hold, in words (for errors): class, shape, quantizer, format."""
    header, rows = read_header(blocks, what=what)
    return f"{header.tensor_class.__name__} {_described(header, rows)}"


def decode_row_blocks(blocks: torch.Tensor, *, like: Optional[QuantizedTensor] = None, rows: Optional[int] = None,
                      what: str = "row blocks") -> QuantizedTensor:
    """The tensor ``blocks`` hold, on ``blocks``' device; ``rows``, if given, the rows it must have.

    Without ``like`` the tensor has no quantizer. With ``like`` (a tensor stored the way the blocks must be)
    the blocks are checked against it and the tensor takes its quantizer; empty blocks then decode too.
    Raises ``ValueError`` naming ``what`` for blocks of another scheme, format or quantizer options, other than
    ``rows`` rows, or disagreeing on the shared arrays.
    """
    if blocks.dim() == 2 and blocks.shape[0] == 0 and like is not None:
        header, held = _encodable(like, what=what), 0
    else:
        header, held = read_header(blocks, what=what)
    if like is not None:
        _check_like(header, like, what=what, rows=held)
    specs, shared_specs, g, width = _specs(header)
    if blocks.shape[1] != width or (rows is not None and held != rows):
        expected = held if rows is None else rows
        raise ValueError(
            f"{what}: expected {ceil_div(expected, g)} row blocks of {width} bytes (a {header.tensor_class.__name__} "
            f"of {expected} x {header.cols} stored like this one), got a {blocks.dtype} tensor of shape "
            f"{tuple(blocks.shape)}: truncated or corrupt, or saved from a weight of another shape"
        )
    count, column = blocks.shape[0], header.nbytes

    def take(nbytes: int) -> torch.Tensor:
        nonlocal column
        part = blocks[:, column : column + nbytes]
        column += nbytes
        return part

    like_meta = like.get_metadata() if like is not None else {}
    shared = {}
    for kw, spec in shared_specs.items():
        part = take(math.prod(spec.shape) * spec.dtype.itemsize)
        if count and not bool((part == part[:1]).all()):
            raise ValueError(
                f"{what}: the row blocks disagree on the whole-tensor {kw}: they come from shards quantized with "
                "different scales and cannot form one tensor"
            )
        source = part[0] if count else _as_bytes(like_meta[kw].reshape(1, -1)).reshape(-1)
        value = _dense(source.clone()).view(spec.dtype).reshape(spec.shape)
        mine = like_meta.get(kw)
        shared[kw] = value.reshape(mine.shape) if mine is not None and mine.numel() == value.numel() else value
    arrays = {}
    for kw, spec in specs.items():
        per_block, row_bytes = g // spec.granularity, math.prod(spec.row_shape) * spec.dtype.itemsize
        part = take(per_block * row_bytes).reshape(count * per_block, row_bytes)[: ceil_div(held, spec.granularity)]
        arrays[kw] = _dense(part.reshape(-1)).view(spec.dtype).reshape(part.shape[0], *spec.row_shape)
    quantizer = like.quantizer if like is not None else None
    return build_from_row_major(header.tensor_class, arrays, torch.Size((held, header.cols)), dtype=header.dtype,
                                meta=header.meta, usages=header.usages, shared=shared, quantizer=quantizer)
