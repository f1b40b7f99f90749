"""GEMM numerics modes: which arithmetic the reference GEMM models (``refops.gemm_numerics``).

* ``"exact"`` (the default): a quantized GEMM is the exact fp32 product of the dequantized operands,
  summed in IEEE fp32 and rounded once to the output dtype (``refops.kernels.reference.gemm``).
* ``"hopper"``: per-tensor FP8 GEMMs (delayed and current scaling) as an H100 / H200 tensor core
  computes them, bit for bit (through the optional ``mmaemu`` package: ``pip install refops[hopper]``),
  with the accumulation each GEMM's role asks for in TE's per-tensor recipes (fprop: fast accumulation;
  dgrad and wgrad: the split accumulator); fp32 GEMMs with TF32 operands, as TE's cuBLAS calls
  (``docs/tensor-cores.md`` says what is bit-exact and what is not).

The mode is captured with the forward, as the recipe is: a fuser's forward records the mode in force
(:func:`numerics_in_force`) and its backward runs its GEMMs under that mode (:func:`forward_numerics`),
wherever and whenever ``backward()`` is called, on whichever thread autograd runs it; a backward inside a
context of another mode still gets its forward's (``docs/tensor-cores.md#the-mode-is-captured-with-the-forward``).

Outside a backward the mode is process-wide, as ``torch.backends.cuda.matmul.allow_tf32`` is. The mode
in force is that of the most recently entered context not yet left (the default, ``"exact"``, when
none is open); entering and leaving are guarded by a lock, and a context left out of order (by
another thread) removes only itself, so nesting restores the mode it found and nothing stays
behind once every context is closed. Threads that want different modes for their forwards at the
same time cannot have them: as with torch's backend flags, the setting is one per process. A
backward's captured mode is the exception: it is set for the thread running that backward only, so
it never leaks into what other threads run meanwhile.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, NamedTuple, Optional, Union

__all__ = [
    "GEMM_NUMERICS",
    "GEMM_ROLES",
    "GemmNumericsSetting",
    "HopperGemmError",
    "SPLIT_ACCUMULATOR",
    "forward_numerics",
    "gemm_numerics",
    "gemm_role",
    "numerics_in_force",
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


class GemmNumericsSetting(NamedTuple):
    """A mode with its options: what a forward captures for its backward (:func:`numerics_in_force`)."""

    name: str
    split_k: Union[int, str]


_LOCK = threading.Lock()
_DEFAULT = GemmNumericsSetting("exact", 1)
#: The contexts entered and not yet left, in the order entered: ``(token, setting)``. The mode in
#: force is the last one's; leaving a context removes its own entry wherever it is, so contexts that
#: threads leave out of order never leave a stale mode behind once all are closed.
_ACTIVE: list[tuple[object, GemmNumericsSetting]] = []
#: ``.setting``: the mode captured by the forward whose backward this thread is running, if any. Per thread,
#: because a backward's GEMMs all run on the thread autograd runs it on, and no other thread may see its mode.
_BACKWARD = threading.local()


def _in_force() -> GemmNumericsSetting:
    captured = getattr(_BACKWARD, "setting", None)
    if captured is not None:
        return captured
    active = _ACTIVE  # a list read is atomic under the GIL; entries are tuples
    return active[-1][1] if active else _DEFAULT


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise ValueError(f"gemm_numerics: the mode is a name (str), one of {', '.join(GEMM_NUMERICS)}; "
                         f"got {type(name).__name__} {name!r}")
    if name not in GEMM_NUMERICS:
        raise ValueError(f"gemm_numerics: unknown GEMM numerics {name!r}; choose one of {', '.join(GEMM_NUMERICS)}")
    return name


def _check_split_k(name: str, split_k: object) -> Union[int, str]:
    if not (split_k == "auto" or (isinstance(split_k, int) and not isinstance(split_k, bool) and split_k == 1)):
        raise ValueError(f"gemm_numerics: split_k must be 1 (unsplit) or 'auto' (mmaemu's table), got {split_k!r}")
    if split_k == "auto" and name != "hopper":
        # Only the tensor core splits K; accepting it in exact mode would suggest it changes something.
        raise ValueError(f"gemm_numerics: split_k='auto' applies to 'hopper' only, not to {name!r}")
    return split_k  # type: ignore[return-value]


class _ModeName(str):
    """The name ``gemm_numerics()`` returns: a plain string, except that ``with`` on it says what went wrong
    (``with gemm_numerics():`` reads the mode, it selects none)."""

    def __enter__(self) -> None:
        raise TypeError(f"gemm_numerics() with no name returns the mode in force ({str(self)!r}), which is not a "
                        f"context; select one with `with refops.gemm_numerics('hopper'):`")

    def __exit__(self, *exc: object) -> None:  # pragma: no cover - __enter__ always raises
        return None


class _NumericsContext(contextlib.AbstractContextManager):
    """The context ``gemm_numerics(name)`` returns (re-entrant: each ``with`` adds its own entry)."""

    def __init__(self, setting: GemmNumericsSetting) -> None:
        self._setting = setting
        self._tokens: list[object] = []

    def __enter__(self) -> str:
        token = object()
        with _LOCK:
            _ACTIVE.append((token, self._setting))
            self._tokens.append(token)
        return self._setting.name

    def __exit__(self, *exc: object) -> None:
        with _LOCK:
            if not self._tokens:
                raise RuntimeError(f"gemm_numerics({self._setting.name!r}): left more often than entered")
            token = self._tokens.pop()
            _ACTIVE[:] = [entry for entry in _ACTIVE if entry[0] is not token]


def gemm_numerics(name: Optional[str] = None, *, split_k: Union[int, str] = 1) -> Union[str, _NumericsContext]:
    """The GEMM numerics mode: a context manager, or with no argument the name in force.

    ``with refops.gemm_numerics("hopper"): ...`` runs the reference's GEMMs as a Hopper tensor core
    computes them; ``refops.gemm_numerics()`` returns ``"exact"`` or ``"hopper"``. A backward's GEMMs
    run under the mode its forward ran under, wherever ``backward()`` is called. An unknown name or
    a bad ``split_k`` is a ``ValueError``, ``split_k`` without a name a ``TypeError``.

    ``split_k`` (``"hopper"`` only): ``1`` (default) models the GEMM cuBLASLt runs without splitting
    K, the case measured bit-exact on an H200; ``"auto"`` asks mmaemu's split-K table of TE's calls on
    an H100 PCIe (profile ``hopper-te``) and raises ``HopperGemmError`` for a shape it cannot decide.
    """
    if name is None:
        if not (isinstance(split_k, int) and not isinstance(split_k, bool) and split_k == 1):
            raise TypeError(f"gemm_numerics: split_k={split_k!r} needs a mode name, as in "
                            f"gemm_numerics('hopper', split_k={split_k!r}); with no name it returns the mode in force")
        return _ModeName(_in_force().name)
    name = _check_name(name)
    return _NumericsContext(GemmNumericsSetting(name, _check_split_k(name, split_k)))


def current_split_k() -> Union[int, str]:
    """The ``split_k`` of the mode in force."""
    return _in_force().split_k


def numerics_in_force() -> GemmNumericsSetting:
    """The mode in force with its options: what a forward records for its backward (:func:`forward_numerics`)."""
    return _in_force()


@contextlib.contextmanager
def forward_numerics(setting: GemmNumericsSetting) -> Iterator[None]:
    """Run a backward's GEMMs under ``setting``, the mode its forward captured, whatever contexts are open.

    Set for the calling thread only (the thread autograd runs the backward on), and restored on the way
    out, so a backward nested in another (activation recomputation) gets its own forward's mode back.
    """
    if not isinstance(setting, GemmNumericsSetting):
        raise TypeError(f"gemm_numerics: forward_numerics takes a GemmNumericsSetting, got {type(setting).__name__}")
    previous = getattr(_BACKWARD, "setting", None)
    _BACKWARD.setting = setting
    try:
        yield
    finally:
        _BACKWARD.setting = previous


def gemm_role(role: Optional[str], *, trans_a: bool, trans_b: bool) -> str:
    """``role`` checked, or inferred from TE's layouts: fprop is TN (``trans_b``), dgrad NN, wgrad NT (``trans_a``)."""
    if role is None:
        return "wgrad" if trans_a else ("fprop" if trans_b else "dgrad")
    if role not in GEMM_ROLES:
        raise ValueError(f"gemm: role must be one of {GEMM_ROLES} or None, got {role!r}")
    return role
