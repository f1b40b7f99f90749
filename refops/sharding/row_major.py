"""The row-major form of a quantized tensor, and the dim-0 cuts it makes exact.

Built on each scheme's form (:mod:`refops.sharding.scheme_forms`):

* :func:`to_row_major` / :func:`from_row_major`: a tensor's row-major arrays and its inverse, for a tensor of
  any row count with the template's class, format, quantizer (and usages, unless given);
* :func:`rows`: rows ``[start, stop)`` of a 2-D tensor as a tensor of the same class holding exactly the
  bytes and scales the whole tensor holds for them; :func:`zeros_like_rows`: zero bytes of another row count;
* :func:`block_rows`: the rows a cut must be a multiple of (the largest granularity over both usages, so the
  rule does not depend on which usages a tensor holds).

Invariant: ``from_row_major(t, to_row_major(t), t.shape)`` rebuilds ``t`` bit for bit, and concatenating the
row-major arrays of consecutive row ranges gives those of their union. So cuts and gathers along dim 0 are
exact, provided the pieces' shared arrays agree (the amax of a whole-tensor scale is reduced over the
pieces' group, or the pieces were cut from one quantized tensor).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..quantization.quantized_tensor import USAGES, QuantizedTensor
from ..layouts import ceil_div
from ..layouts import dim0_rows_cols as rows_cols
from .scheme_forms import SCHEME_FORMS, RowArray, SchemeForm

__all__ = ["form_of", "usages_of", "meta_of", "row_arrays", "shared_arrays", "to_row_major", "from_row_major",
           "build_from_row_major", "block_rows", "cuttable", "rows", "zeros_like_rows"]


def form_of(tensor: QuantizedTensor, *, what: str = "QuantizedTensor") -> SchemeForm:
    """``tensor``'s scheme form, or a ``NotImplementedError`` naming ``what``."""
    form = SCHEME_FORMS.get(type(tensor).__name__)
    if form is None:
        raise NotImplementedError(f"{what}: a {type(tensor).__name__} has no row-major form in refops")
    return form


def usages_of(tensor: QuantizedTensor) -> tuple[str, ...]:
    return tuple(u for u in USAGES if tensor.has_usage(u))


def meta_of(tensor: QuantizedTensor) -> dict[str, Any]:
    """The constructor metadata (format options) of ``tensor``."""
    return {kw: getattr(tensor, attr) for kw, (attr, _) in tensor._CTOR_META.items()}


def row_arrays(tensor: QuantizedTensor, usages: Optional[tuple[str, ...]] = None) -> dict[str, RowArray]:
    """The row-major arrays ``tensor`` holds (or would hold with ``usages``)."""
    _, cols = rows_cols(tensor.shape)
    return form_of(tensor).arrays(cols, meta_of(tensor), usages_of(tensor) if usages is None else usages)


def shared_arrays(tensor: QuantizedTensor, usages: Optional[tuple[str, ...]] = None) -> dict[str, torch.Tensor]:
    """The whole-tensor arrays of ``tensor`` for ``usages`` (default: its own), by constructor keyword."""
    _, cols = rows_cols(tensor.shape)
    usages = usages_of(tensor) if usages is None else usages
    metadata = tensor.get_metadata()
    specs = form_of(tensor).shared(cols, meta_of(tensor), usages)
    return {kw: metadata[kw] for kw in specs if metadata[kw] is not None}


def to_row_major(tensor: QuantizedTensor, *, what: str = "QuantizedTensor") -> dict[str, torch.Tensor]:
    """Constructor keyword -> array whose dim 0 runs over the rows (shared arrays excluded), in constructor order."""
    if tensor.dim() == 0:
        raise NotImplementedError(f"{what}: a 0-dim {type(tensor).__name__} has no rows")
    rows_, cols = rows_cols(tensor.shape)
    arrays = form_of(tensor, what=what).to_rows(tensor, rows_, cols)
    return {kw: arrays[kw] for kw in type(tensor)._CTOR_TENSORS if kw in arrays}


def build_from_row_major(cls: type[QuantizedTensor], arrays: dict[str, torch.Tensor], shape: torch.Size, *,
                         dtype: torch.dtype, meta: dict[str, Any], usages: tuple[str, ...],
                         shared: dict[str, torch.Tensor], quantizer: Any) -> QuantizedTensor:
    """A ``cls`` tensor of nominal ``shape`` with ``usages``, from its row-major and shared arrays."""
    shape = torch.Size(shape)
    rows_, cols = rows_cols(shape)
    stored = SCHEME_FORMS[cls.__name__].from_rows(arrays, shape, rows_, cols, meta, usages)
    return cls(shape, dtype, quantizer=quantizer, **stored, **shared, **meta)


def from_row_major(template: QuantizedTensor, arrays: dict[str, torch.Tensor], shape: torch.Size,
                   shared: Optional[dict[str, torch.Tensor]] = None,
                   usages: Optional[tuple[str, ...]] = None) -> QuantizedTensor:
    """A tensor of ``template``'s class, format, quantizer and dtype, of nominal ``shape``, from row-major ``arrays``.

    ``usages`` default to ``template``'s. ``shared`` gives the whole-tensor arrays (default: clones of
    ``template``'s, so that re-quantizing one tensor in place never writes into another's scale).
    """
    usages = usages_of(template) if usages is None else usages
    _, cols = rows_cols(template.shape)
    given, own = shared or {}, template.get_metadata()
    values = {}
    for kw in form_of(template).shared(cols, meta_of(template), usages):
        value = given.get(kw, own[kw].clone() if own[kw] is not None else None)
        if value is not None:
            values[kw] = value
    return build_from_row_major(type(template), arrays, shape, dtype=template.dtype, meta=meta_of(template),
                                usages=usages, shared=values, quantizer=template.quantizer)


def block_rows(tensor: QuantizedTensor, *, what: str = "QuantizedTensor") -> int:
    """The rows a cut of ``tensor`` must be a multiple of: its scheme's largest granularity over both usages."""
    form_of(tensor, what=what)
    return max(a.granularity for a in row_arrays(tensor, USAGES).values())


def cuttable(tensor: QuantizedTensor, *, what: str) -> SchemeForm:
    """``tensor``'s form if it can be cut into row ranges (2-D, a scheme that allows it), else a
    ``NotImplementedError`` naming ``what`` and the reason."""
    form = form_of(tensor, what=what)
    reason = form.cut_refusal(tensor)
    if reason is None and tensor.dim() != 2:
        reason = f"only 2-D quantized tensors are sharded (got shape {tuple(tensor.shape)})"
    if reason is not None:
        raise NotImplementedError(f"{what}: cannot shard a {type(tensor).__name__} along dim 0: {reason}")
    return form


def rows(tensor: QuantizedTensor, start: int, stop: int, *, what: str = "QuantizedTensor") -> QuantizedTensor:
    """Rows ``[start, stop)`` of ``tensor``: the same bytes and scales as the whole tensor holds for them."""
    cuttable(tensor, what=what)
    g = block_rows(tensor)
    if start % g or (stop % g and stop != tensor.shape[0]):
        raise NotImplementedError(
            f"{what}: a {type(tensor).__name__} can only be cut at multiples of {g} rows (its scaling blocks); "
            f"got rows [{start}, {stop}) of {tuple(tensor.shape)}. Choose sizes whose shards are multiples of {g} rows"
        )
    specs = row_arrays(tensor)
    arrays = {kw: a[start // specs[kw].granularity : ceil_div(stop, specs[kw].granularity)]
              for kw, a in to_row_major(tensor).items()}
    return from_row_major(tensor, arrays, torch.Size((stop - start, *tensor.shape[1:])))


def zeros_like_rows(tensor: QuantizedTensor, shape: torch.Size, *, what: str = "QuantizedTensor") -> QuantizedTensor:
    """A tensor of ``tensor``'s class and nominal ``shape`` (same trailing dims) whose arrays are all zero bytes."""
    cuttable(tensor, what=what)
    if tuple(shape[1:]) != tuple(tensor.shape[1:]):
        raise NotImplementedError(
            f"{what}: new_zeros{tuple(shape)} on a {type(tensor).__name__} of shape {tuple(tensor.shape)} needs the "
            "same trailing dims"
        )
    specs = row_arrays(tensor)
    arrays = {kw: a.new_zeros((ceil_div(shape[0], specs[kw].granularity), *a.shape[1:]))
              for kw, a in to_row_major(tensor).items()}
    shared = {kw: torch.zeros_like(v) for kw, v in shared_arrays(tensor).items()}
    return from_row_major(tensor, arrays, torch.Size(shape), shared)

