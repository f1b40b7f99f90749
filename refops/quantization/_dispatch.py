"""How torch operations treat a ``QuantizedTensor``: the rules this layer adds to its handler table.

Importing this module fills :data:`refops.quantization.quantized_tensor.TORCH_DISPATCH` (the cuts,
``split``/``slice``/``new_zeros``, need every scheme's row-major form and are added by
:mod:`refops.sharding.cuts`):

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
* the identity ``as_strided`` (FSDP2 applies it to an unsharded parameter) is an alias;
* any other op runs on the dequantized values; an op that writes into a quantized
  argument (``add_``, ``mul_``, ``zero_``, ...) re-quantizes the result into it in
  place, like an optimizer step.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map

from .quantized_tensor import OTHER_OPS, TORCH_DISPATCH, QuantizedTensor

__all__ = ["alias", "same_encoding", "other_op"]

aten = torch.ops.aten
_NOMINAL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def alias(tensor: QuantizedTensor, *_: Any, **__: Any) -> QuantizedTensor:
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
        return alias(tensor)
    return tensor._dequantize_impl(tensor.dtype, None).view(size)


def _clone(tensor: QuantizedTensor, *, memory_format: Any = None) -> QuantizedTensor:
    return tensor._map_arrays(lambda t: t.clone())


def same_encoding(dst: QuantizedTensor, src: Any) -> bool:
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
    if same_encoding(dst, src):
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


def _as_strided(tensor: QuantizedTensor, size: Any, stride: Any, storage_offset: Any = None) -> torch.Tensor:
    """The identity ``as_strided`` (FSDP2 applies it to an unsharded parameter) is an alias; others dequantize."""
    if torch.Size(size) == tensor.shape and tuple(stride) == tuple(tensor.stride()) and not storage_offset:
        return alias(tensor)
    return tensor._dequantize_impl(tensor.dtype, None).as_strided(size, stride, storage_offset)


TORCH_DISPATCH.update({
    aten.as_strided.default: _as_strided,
    aten.detach.default: alias,
    aten.alias.default: alias,
    aten.view.default: _view,
    aten.clone.default: _clone,
    aten.copy_.default: _copy_,
    aten._to_copy.default: _to_copy,
    aten.empty_like.default: _empty_like,
})


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


def other_op(func: Any, args: tuple, kwargs: dict) -> Any:
    """An op without a handler: in place, re-quantized into the written quantized arguments; else on the
    dequantized values."""
    if func._schema.is_mutable:
        return _run_mutating(func, args, kwargs)
    return func(*tree_map(_dequantized, args), **tree_map(_dequantized, kwargs))


TORCH_DISPATCH[OTHER_OPS] = other_op
