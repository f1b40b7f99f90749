"""The two sides: TransformerEngine (through the oracle's adapters, ``refops.testing.transformer_engine``) and
refops with its fast-path backend selected."""

from __future__ import annotations

from typing import Any, Optional


def load_te() -> tuple[Any, Optional[str]]:
    """``(TransformerEngine, None)`` (the adapters' handle: ``.pytorch``, ``.recipe``, ``.version``), or
    ``(None, reason)`` when it does not import."""
    from refops.testing.transformer_engine import TransformerEngineUnavailable, import_te

    try:
        return import_te("bench_vs_te.py"), None
    except TransformerEngineUnavailable as exc:  # not installed, or built for another torch / CUDA
        return None, str(exc)


def load_refops_fastpath() -> tuple[Any, Any]:
    """``(refops, fastpath)`` with the fast path selected (registered here: works from a source tree too)."""
    import fastpath
    import refops
    from refops.kernels import register_backend

    register_backend("fastpath", fastpath.make_backend)
    refops.use_backend("fastpath")
    return refops, fastpath


def te_reset(te: Any) -> None:
    """Forget TE's global quantization state between rows (``FP8GlobalStateManager.reset()``, as TE's own tests do
    after each test): its delayed-scaling amax buffers keep every module that ever ran under a recipe, so later
    rows would update the amaxes of the models of earlier ones and keep their tensors alive."""
    manager = getattr(getattr(te, "quantization", None), "FP8GlobalStateManager", None)
    reset = getattr(manager, "reset", None)
    if callable(reset):
        reset()


def error_text(exc: BaseException) -> str:
    """``Type: first line of the message``, at most 300 characters (what a record says of a failure)."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
