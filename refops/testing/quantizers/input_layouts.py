"""The same input values presented in other memory layouts, for :func:`refops.testing.check_quantizer`.

A kernel that is right on a contiguous tensor can be wrong on the same values
laid out otherwise: it writes its output with the input's strides
(``torch.empty_like`` keeps them) and hands on bytes in the wrong order, it reads
the storage from its start and ignores a slice's storage offset, or it walks an
expanded tensor (stride 0) as if every element had its own memory. Each layout
here is a different tensor with the *same values*, so the candidate's result on
it must be bit-identical to the reference's on the contiguous tensor:

* ``"non-contiguous"``: the dims reversed, made contiguous, reversed back
  (``x.t().contiguous().t()`` for 2-D): column-major storage, the same values;
* ``"storage offset"``: the values copied into a larger buffer behind 512 bytes of
  NaN and sliced out: contiguous, but ``storage_offset() > 0``, and a kernel that reads
  from the buffer's start reads the NaN. 512 bytes keeps the slice as aligned as a
  fresh allocation, so a kernel that needs aligned pointers (vector loads, TMA) is
  tested here on what it promises, where the offset is honoured;
* ``"expanded"``: one row expanded over every row (stride 0 along the rows), for an
  input whose rows are all equal (the ``broadcast_row`` case).

One more layout runs only when asked (it is not in :data:`LAYOUTS`):

* ``"unaligned storage offset"``: the slice starts 37 elements in, an address that
  is not a multiple of 16 bytes. Torch's own ops take it; a kernel that needs
  alignment should say so with an error, not read out of place. On a GPU an
  unchecked misaligned vector load is a sticky CUDA error that ends the process's
  use of the device, which is why the default matrix leaves this layout out.

Which case runs in which layouts is the case's :attr:`~.cases.QuantizerCase.layouts`.

Every presentation is a fresh tensor, so a candidate that writes into its input
cannot change the values a later run sees.
"""

from __future__ import annotations

import math

import torch

__all__ = ["CONTIGUOUS", "LAYOUTS", "OPTIONAL_LAYOUTS", "STORAGE_OFFSET_BYTES", "UNALIGNED_OFFSET", "rows_equal",
           "present", "storage_offset_elements", "describe_layouts"]

CONTIGUOUS = "contiguous"
#: The layouts other than contiguous, in report order.
LAYOUTS = ("non-contiguous", "storage offset", "expanded")

#: Layouts that run only when named in ``layouts``.
OPTIONAL_LAYOUTS = ("unaligned storage offset",)

#: NaN bytes in front of the values in the "storage offset" buffer: torch's CUDA allocator aligns blocks to 512
#: bytes, so the slice is aligned exactly as a fresh tensor would be.
STORAGE_OFFSET_BYTES = 512

#: NaN elements in front of the values in the "unaligned storage offset" buffer: 74 bytes in bf16 / fp16 and 148
#: in fp32, not a multiple of 16, so a kernel that rounds the pointer down to an aligned address reads NaN.
UNALIGNED_OFFSET = 37


def storage_offset_elements(layout: str, dtype: torch.dtype) -> int:
    """How many NaN elements precede the values in ``layout`` ("storage offset" or "unaligned storage offset")."""
    if layout == "unaligned storage offset":
        return UNALIGNED_OFFSET
    return STORAGE_OFFSET_BYTES // torch.empty((), dtype=dtype).element_size()


def rows_equal(x: torch.Tensor) -> bool:
    """Whether every row of ``x``'s ``(M, K)`` view holds the same bits as the first (so it can be expanded)."""
    if x.dim() < 2 or x.numel() == 0:
        return False
    rows = x.reshape(-1, x.shape[-1])
    bits = rows.view(torch.int16 if x.element_size() == 2 else torch.int32)
    return bool((bits == bits[:1]).all())


def present(x: torch.Tensor, layout: str) -> torch.Tensor:
    """A new tensor with ``x``'s values in ``layout`` (``x`` is contiguous and is not aliased)."""
    if layout == CONTIGUOUS:
        return x.clone()
    if layout == "non-contiguous":
        reversed_dims = list(range(x.dim()))[::-1]
        return x.permute(*reversed_dims).contiguous().permute(*reversed_dims)
    if layout in ("storage offset", "unaligned storage offset"):
        offset = storage_offset_elements(layout, x.dtype)
        buffer = torch.full((offset + x.numel(),), math.nan, dtype=x.dtype, device=x.device)
        buffer[offset:] = x.reshape(-1)
        return buffer[offset:].view(x.shape)
    if layout == "expanded":
        if not rows_equal(x):  # a case that declares this layout must build equal rows
            raise ValueError(f"present: an expanded layout needs equal rows; shape {tuple(x.shape)} has other rows")
        row = x.reshape(-1, x.shape[-1])[:1].clone()
        return row.reshape((1,) * (x.dim() - 1) + (x.shape[-1],)).expand(x.shape)
    raise ValueError(f"present: unknown layout {layout!r}; the layouts are {(CONTIGUOUS,) + LAYOUTS + OPTIONAL_LAYOUTS}")


def describe_layouts(layouts: tuple[str, ...]) -> str:
    """``non-contiguous (dims reversed: column-major storage), ...``: what each layout ran as."""
    how = {
        "non-contiguous": "non-contiguous (dims reversed: column-major storage)",
        "storage offset": f"storage offset (a slice behind {STORAGE_OFFSET_BYTES} bytes of NaN, aligned)",
        "unaligned storage offset": f"unaligned storage offset (a slice behind {UNALIGNED_OFFSET} NaN elements, "
                                    "not 16-byte aligned)",
        "expanded": "expanded (one row, stride 0 along the rows)",
    }
    return ", ".join(how[layout] for layout in layouts)
