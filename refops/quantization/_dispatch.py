"""How torch operations treat a ``QuantizedTensor`` (its ``__torch_dispatch__``).

* ``detach`` / ``alias`` / a ``view`` to the same shape: a new tensor of the same
  class sharing the arrays (what ``nn.Parameter(q)``, ``state_dict()`` and autograd
  returning an input unchanged need);
* ``clone``: same class, copied arrays;
* ``copy_(dst, src)``: into a quantized ``dst``, raw arrays are copied when
  ``src`` is quantized the same way, else ``src`` is re-quantized with ``dst``'s
  quantizer; in place either way (same object, same buffers). Into a plain
  ``dst``, ``src`` is dequantized;
* ``_to_copy`` (``.to(device)``, ``.to(dtype)``, ``.half()``, ``.float()``, ``.cpu()``):
  stays quantized with the new nominal dtype (fp32/fp16/bf16) and/or device;
* ``empty_like``: same class, uninitialized arrays;
* ``split``/``chunk`` give exact pieces, as in TE: quantized for per-tensor FP8 (any dim) and for dim-0
  cuts on scaling-block bounds (how FSDP2 shards a parameter), else pieces of the dequantized values;
* the other cuts FSDP2 makes: a dim-0 ``slice``/``narrow`` on scaling-block bounds, ``new_zeros`` with only
  the row count changed (a row count that splits a scaling block is refused: FSDP2 would re-quantize a
  dequantized shard into it), and the identity ``as_strided`` keep the scheme
  (:mod:`refops.quantization.row_layout`);
* any other op runs on the dequantized values; an op that writes into a quantized
  argument (``add_``, ``mul_``, ``zero_``, ...) re-quantizes the result into it in
  place, like an optimizer step.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._pytree import tree_map

from .quantized_tensor import QuantizedTensor

__all__ = ["dispatch"]

aten = torch.ops.aten
_NOMINAL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _alias(tensor: QuantizedTensor, *_: Any, **__: Any) -> QuantizedTensor:
    """A view of a normal tensor is a normal tensor, even under ``torch.inference_mode`` (as for plain
    tensors): the wrapper is made outside it, or autograd could not give the view a version counter."""
    with torch.inference_mode(tensor.is_inference()):
        return type(tensor).make_like(tensor)


def _view(tensor: QuantizedTensor, size: Any) -> torch.Tensor:
    """A view to the same shape (what autograd's ``view_as`` does to a returned input) stays quantized."""
    try:
        same = torch.Size(torch.empty(tensor.shape, device="meta").view(size).shape) == tensor.shape
    except RuntimeError:
        same = False
    if same:
        return _alias(tensor)
    return tensor._dequantize_impl(tensor.dtype, None).view(size)


def _clone(tensor: QuantizedTensor, *, memory_format: Any = None) -> QuantizedTensor:
    return tensor._map_arrays(lambda t: t.clone())


def _same_encoding(dst: QuantizedTensor, src: Any) -> bool:
    """Whether ``src``'s arrays can be copied byte for byte into ``dst``'s."""
    if type(src) is not type(dst) or src.shape != dst.shape:
        return False
    for kw, (attr, _) in dst._CTOR_META.items():
        if getattr(src, attr) != getattr(dst, attr):
            return False
    for attr in dst._array_names():
        mine, theirs = getattr(dst, attr), getattr(src, attr)
        if mine is not None and (theirs is None or theirs.shape != mine.shape or theirs.dtype != mine.dtype):
            return False
    return True


def _copy_(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    if not isinstance(dst, QuantizedTensor):
        dst.copy_(src._dequantize_impl(src.dtype, None), non_blocking)
        return dst
    if _same_encoding(dst, src):
        for attr in dst._array_names():
            if getattr(dst, attr) is not None:
                getattr(dst, attr).copy_(getattr(src, attr), non_blocking)
        return dst
    if isinstance(src, QuantizedTensor):
        src = src._dequantize_impl(src.dtype, None)
    dst._get_quantizer().update_quantized(src, dst)
    return dst


def _to_copy(tensor: QuantizedTensor, **kwargs: Any) -> torch.Tensor:
    dtype = kwargs.get("dtype") or tensor.dtype
    device = kwargs.get("device") or tensor.device
    if dtype not in _NOMINAL_DTYPES:
        return tensor._dequantize_impl(tensor.dtype, None).to(dtype=dtype, device=device)
    return tensor._map_arrays(lambda t: t.to(device=device, non_blocking=kwargs.get("non_blocking", False)),
                              dtype=dtype, device=torch.device(device))


def _empty_like(tensor: QuantizedTensor, **kwargs: Any) -> torch.Tensor:
    dtype = kwargs.get("dtype") or tensor.dtype
    device = kwargs.get("device") or tensor.device
    if dtype not in _NOMINAL_DTYPES:
        return torch.empty(tensor.shape, dtype=dtype, device=device)
    return tensor._map_arrays(lambda t: torch.empty_like(t, device=device), dtype=dtype, device=torch.device(device))


def _rows_or_none(tensor: QuantizedTensor, start: int, stop: int) -> Any:
    """Rows ``[start, stop)`` kept quantized (the whole tensor: an alias), or None where the scheme cannot cut there."""
    from .row_layout import _LAYOUTS, rows

    if start == 0 and stop == tensor.shape[0]:
        return _alias(tensor)
    layout = _LAYOUTS.get(type(tensor).__name__)
    if layout is None or tensor.dim() != 2 or (layout.check is not None and layout.check(tensor)):
        return None
    g = layout.block_rows(tensor)
    if start % g or (stop % g and stop != tensor.shape[0]):
        return None
    return rows(tensor, start, stop)


def _split_bounds(n: int, split_size: Any) -> list[tuple[int, int]]:
    """``[start, stop)`` of each piece ``torch.split(t, split_size)`` makes along a dim of size ``n``."""
    if isinstance(split_size, (list, tuple)):
        sizes = list(split_size)
    else:
        sizes = [min(split_size, n - start) for start in range(0, n, split_size)] or [0]
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


def _split(tensor: QuantizedTensor, split_size: Any, dim: int = 0) -> list[torch.Tensor]:
    """``split``/``chunk``: exact pieces, quantized where the scheme allows the cut, as in TE.

    Per-tensor FP8 cuts along any dim (its one scale serves every piece). Other schemes keep
    dim-0 cuts on their scaling-block bounds quantized (how FSDP2 shards a parameter). Any other
    cut returns the pieces of the dequantized values, exactly (TE's fallback); FSDP2's padding of
    such a shard is then refused by ``new_zeros`` (see :func:`_new_zeros`), so a quantized weight
    is never sharded into dequantized pieces silently.
    """
    from .float8 import Float8Tensor

    if tensor.dim() == 0:
        raise RuntimeError(f"{type(tensor).__name__}: split expects at least a 1-dimensional tensor")
    dim = dim % tensor.dim()
    bounds = _split_bounds(tensor.shape[dim], split_size)
    if isinstance(tensor, Float8Tensor):
        return [_float8_piece(tensor, dim, start, stop) for start, stop in bounds]
    if dim == 0:
        pieces = [_rows_or_none(tensor, start, stop) for start, stop in bounds]
        if all(piece is not None for piece in pieces):
            return pieces
    values = tensor._dequantize_impl(tensor.dtype, None)
    return [values.narrow(dim, start, stop - start) for start, stop in bounds]


def _float8_piece(tensor: QuantizedTensor, dim: int, start: int, stop: int) -> QuantizedTensor:
    """Elements ``[start, stop)`` along ``dim`` of a per-tensor FP8 tensor: its bytes, its usages, a copy of its scale."""
    from ..kernels.reference.quant_float8 import columnwise_layout

    if start == 0 and stop == tensor.shape[dim]:
        return _alias(tensor)
    full = tensor
    if tensor._data is None:  # derive the row-wise bytes on a copy that shares the arrays
        full = type(tensor).make_like(tensor)
        full.update_usage(rowwise_usage=True)
    data = full._data.narrow(dim, start, stop - start).contiguous()
    return type(tensor).make_like(
        tensor, shape=data.shape,
        data=data if tensor._data is not None else None,
        data_transpose=columnwise_layout(data) if tensor._transpose is not None else None,
        fp8_scale_inv=tensor._scale_inv.clone(),  # re-quantizing one piece never writes another's scale
    )


def _slice(tensor: QuantizedTensor, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> torch.Tensor:
    """A dim-0 slice on block bounds stays quantized (FSDP2's ``narrow``); any other slice reads dequantized values."""
    n = tensor.shape[0] if tensor.dim() else 0
    lo = 0 if start is None else (start + n if start < 0 else min(start, n))
    hi = n if end is None else (end + n if end < 0 else min(end, n))
    if tensor.dim() and dim % tensor.dim() == 0 and step == 1 and 0 <= lo <= hi:
        piece = _rows_or_none(tensor, lo, hi)
        if piece is not None:
            return piece
    return aten.slice.Tensor(tensor._dequantize_impl(tensor.dtype, None), dim, start, end, step)


def _new_zeros(tensor: QuantizedTensor, size: Any, **kwargs: Any) -> torch.Tensor:
    """Zeros of ``tensor``'s scheme (FSDP2 pads a shard with them) when only the row count changes; else plain zeros."""
    from .row_layout import _LAYOUTS, zeros_like_rows

    size = torch.Size(size)
    dtype = kwargs.get("dtype") or tensor.dtype
    layout = _LAYOUTS.get(type(tensor).__name__)
    quantizable = (layout is not None and tensor.dim() == 2 and len(size) == 2 and size[1:] == tensor.shape[1:]
                   and dtype == tensor.dtype and not (layout.check is not None and layout.check(tensor)))
    if quantizable:
        block = layout.block_rows(tensor)
        if size[0] % block and size[0] != tensor.shape[0]:
            # FSDP2 pads each shard with new_zeros(shard rows) before copying the shard in: a shard that
            # splits a scaling block would be re-quantized from its dequantized piece (a silent loss).
            raise NotImplementedError(
                f"{type(tensor).__name__}: new_zeros{tuple(size)} on a tensor of shape {tuple(tensor.shape)}: a "
                f"{type(tensor).__name__} can only be cut at multiples of {block} rows (its scaling blocks), so "
                f"rows of {size[0]} cannot hold its shards (FSDP2 pads each shard this way). Choose sizes whose "
                f"shards are multiples of {block} rows, or keep this weight in high precision"
            )
        return zeros_like_rows(tensor, size)
    return torch.zeros(size, dtype=dtype, device=kwargs.get("device") or tensor.device)


def _as_strided(tensor: QuantizedTensor, size: Any, stride: Any, storage_offset: Any = None) -> torch.Tensor:
    """The identity ``as_strided`` (FSDP2 applies it to an unsharded parameter) is an alias; others dequantize."""
    if torch.Size(size) == tensor.shape and tuple(stride) == tuple(tensor.stride()) and not storage_offset:
        return _alias(tensor)
    return tensor._dequantize_impl(tensor.dtype, None).as_strided(size, stride, storage_offset)


_HANDLERS: dict[Any, Callable[..., Any]] = {
    aten.split.Tensor: _split,
    aten.split_with_sizes.default: _split,
    aten.slice.Tensor: _slice,
    aten.new_zeros.default: _new_zeros,
    aten.as_strided.default: _as_strided,
    aten.detach.default: _alias,
    aten.alias.default: _alias,
    aten.view.default: _view,
    aten.clone.default: _clone,
    aten.copy_.default: _copy_,
    aten._to_copy.default: _to_copy,
    aten.empty_like.default: _empty_like,
}


def _dequantized(value: Any) -> Any:
    return value._dequantize_impl(value.dtype, None) if isinstance(value, QuantizedTensor) else value


def _run_mutating(func: Any, args: tuple, kwargs: dict) -> Any:
    """Run an in-place op on dequantized copies; re-quantize every written quantized argument."""
    written: list[tuple[QuantizedTensor, torch.Tensor]] = []
    schema_args = func._schema.arguments

    def unwrap(value: Any, schema_arg: Any) -> Any:
        alias = schema_arg.alias_info if schema_arg is not None else None
        is_write = alias is not None and alias.is_write

        def one(v: Any) -> Any:
            if not isinstance(v, QuantizedTensor):
                return v
            plain = _dequantized(v)
            if is_write:
                written.append((v, plain))
            return plain

        # Tensor-list arguments (``_foreach_*_``) hold one tensor per element.
        return type(value)(one(v) for v in value) if isinstance(value, (list, tuple)) else one(value)

    by_name = {a.name: a for a in schema_args}
    new_args = tuple(unwrap(v, schema_args[i] if i < len(schema_args) else None) for i, v in enumerate(args))
    new_kwargs = {k: unwrap(v, by_name.get(k)) for k, v in kwargs.items()}
    out = func(*new_args, **new_kwargs)
    originals = {id(plain): quantized for quantized, plain in written}
    for quantized, plain in written:
        quantized._get_quantizer().update_quantized(plain, quantized)
    return tree_map(lambda o: originals.get(id(o), o), out)


def dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    """``QuantizedTensor.__torch_dispatch__``: see the module docstring."""
    handler = _HANDLERS.get(func)
    if handler is not None:
        return handler(*args, **kwargs)
    if func._schema.is_mutable:
        return _run_mutating(func, args, kwargs)
    return func(*tree_map(_dequantized, args), **tree_map(_dequantized, kwargs))
