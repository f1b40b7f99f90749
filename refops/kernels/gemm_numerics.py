"""GEMM numerics modes: which arithmetic the reference GEMM models (``refops.gemm_numerics``).

* ``"exact"`` (the default): a quantized GEMM is the exact fp32 product of the dequantized operands,
  summed in IEEE fp32 and rounded once to the output dtype (``refops.kernels.reference.gemm``).
* ``"hopper"``: per-tensor FP8 GEMMs (delayed and current scaling) as an H100 / H200 tensor core
  computes them, bit for bit (through the optional ``mmaemu`` package: ``pip install refops[hopper]``),
  with the accumulation each GEMM's role asks for in TE's per-tensor recipes (fprop: fast accumulation;
  dgrad and wgrad: the split accumulator); fp32 GEMMs with TF32 operands, as TE's cuBLAS calls
  (``docs/tensor-cores.md`` says what is bit-exact and what is not).

The mode is process-wide, as ``torch.backends.cuda.matmul.allow_tf32`` is: autograd runs CUDA
backward passes on its own worker threads, which must see the mode the forward ran under. The mode
in force is that of the most recently entered context not yet left (the default, ``"exact"``, when
none is open); entering and leaving are guarded by a lock, and a context left out of order (by
another thread) removes only itself, so nesting restores the mode it found and nothing stays
behind once every context is closed. Threads that want different modes at the same time cannot
have them: as with torch's backend flags, the setting is one per process.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Optional, Union

__all__ = [
    "GEMM_NUMERICS",
    "GEMM_ROLES",
    "HopperGemmError",
    "SPLIT_ACCUMULATOR",
    "gemm_numerics",
    "gemm_role",
]

#: The modes ``gemm_numerics`` accepts.
GEMM_NUMERICS = ("exact", "hopper")
#: A Linear's three GEMMs (TE's names): y = x W^T, dx = dy W, dW = dy^T x.
GEMM_ROLES = ("fprop", "dgrad", "wgrad")
#: ``use_split_accumulator`` of TE's per-tensor FP8 recipes: ``Float8CurrentScaling``'s
#: ``fp8_gemm_fprop/dgrad/wgrad`` (refops.recipe has the same defaults) and, for ``DelayedScaling``, which
#: has no such fields, the constants TE's modules use (``_2X_ACC_FPROP = False``, ``_2X_ACC_DGRAD`` and
#: ``_2X_ACC_WGRAD = True``).
#: False is cuBLAS's fast accumulation (``use_fast_accum=True`` in ``torch._scaled_mm``).
SPLIT_ACCUMULATOR = {"fprop": False, "dgrad": True, "wgrad": True}


class HopperGemmError(RuntimeError):
    """A GEMM that ``gemm_numerics("hopper")`` cannot compute as a Hopper tensor core would.

    Raised instead of falling back to the exact GEMM: an operand format outside the mode's scope
    (only per-tensor FP8 and fp32/TF32 GEMMs are modelled), a contracted dim that is not a multiple
    of 16 (TE refuses those FP8 GEMMs on Hopper), or a call ``mmaemu`` rejects or cannot decide
    (for example an unknown split-K decision under ``split_k="auto"``).
    """


_LOCK = threading.Lock()
_DEFAULT = ("exact", 1)
#: The contexts entered and not yet left, in the order entered: ``(token, (name, split_k))``. The mode in
#: force is the last one's; leaving a context removes its own entry wherever it is, so contexts that
#: threads leave out of order never leave a stale mode behind once all are closed.
_ACTIVE: list[tuple[object, tuple[str, Union[int, str]]]] = []


def _in_force() -> tuple[str, Union[int, str]]:
    active = _ACTIVE  # a list read is atomic under the GIL; entries are tuples
    return active[-1][1] if active else _DEFAULT


def _check_name(name: object) -> str:
    if not isinstance(name, str) or name not in GEMM_NUMERICS:
        raise ValueError(f"gemm_numerics: unknown GEMM numerics {name!r}; choose one of {', '.join(GEMM_NUMERICS)}")
    return name


def _check_split_k(split_k: object) -> Union[int, str]:
    if split_k == "auto" or (isinstance(split_k, int) and not isinstance(split_k, bool) and split_k == 1):
        return split_k  # type: ignore[return-value]
    raise ValueError(f"gemm_numerics: split_k must be 1 (unsplit) or 'auto' (mmaemu's table), got {split_k!r}")


class _NumericsContext(contextlib.AbstractContextManager):
    """The context ``gemm_numerics(name)`` returns (re-entrant: each ``with`` adds its own entry)."""

    def __init__(self, name: str, split_k: Union[int, str]) -> None:
        self._setting = (name, split_k)
        self._tokens: list[object] = []

    def __enter__(self) -> str:
        token = object()
        with _LOCK:
            _ACTIVE.append((token, self._setting))
            self._tokens.append(token)
        return self._setting[0]

    def __exit__(self, *exc: object) -> None:
        with _LOCK:
            token = self._tokens.pop()
            _ACTIVE[:] = [entry for entry in _ACTIVE if entry[0] is not token]


def gemm_numerics(name: Optional[str] = None, *, split_k: Union[int, str] = 1):
    """The GEMM numerics mode: a context manager, or with no argument the name in force.

    ``with refops.gemm_numerics("hopper"): ...`` runs the reference's GEMMs as a Hopper tensor core
    computes them; ``refops.gemm_numerics()`` returns ``"exact"`` or ``"hopper"``. An unknown name is
    a ``ValueError``.

    ``split_k`` (``"hopper"`` only): ``1`` (default) models the GEMM cuBLASLt runs without splitting
    K, the case measured bit-exact on an H200; ``"auto"`` asks mmaemu's split-K table of TE's calls on
    an H100 PCIe (profile ``hopper-te``) and raises ``HopperGemmError`` for a shape it cannot decide.
    """
    if name is None:
        return _in_force()[0]
    return _NumericsContext(_check_name(name), _check_split_k(split_k))


def current_split_k() -> Union[int, str]:
    """The ``split_k`` of the mode in force."""
    return _in_force()[1]


def gemm_role(role: Optional[str], *, trans_a: bool, trans_b: bool) -> str:
    """``role`` checked, or inferred from TE's layouts: fprop is TN (``trans_b``), dgrad NN, wgrad NT (``trans_a``)."""
    if role is None:
        return "wgrad" if trans_a else ("fprop" if trans_b else "dgrad")
    if role not in GEMM_ROLES:
        raise ValueError(f"gemm: role must be one of {GEMM_ROLES} or None, got {role!r}")
    return role
