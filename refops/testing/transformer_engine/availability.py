"""Finding TransformerEngine: imported when an adapter is first used, never when refops is imported.

Every adapter of :mod:`refops.testing.transformer_engine` calls :func:`import_te`. Without
TransformerEngine it raises :class:`TransformerEngineUnavailable` (an ``ImportError``) whose
message names the adapter that needed it and the command that installs TE.
"""

from __future__ import annotations

import dataclasses
import importlib
from importlib import metadata
from types import ModuleType

__all__ = ["INSTALL_HINT", "TransformerEngineUnavailable", "TransformerEngine", "import_te"]

#: How to install TransformerEngine's PyTorch package (its extension builds against the installed torch).
INSTALL_HINT = "pip install --no-build-isolation 'transformer_engine[pytorch]'"


class TransformerEngineUnavailable(ImportError):
    """TransformerEngine (``transformer_engine.pytorch``) cannot be imported here; the message says why."""


@dataclasses.dataclass(frozen=True)
class TransformerEngine:
    """The parts of TransformerEngine the adapters use."""

    #: ``transformer_engine.pytorch`` (``te.ops``, ``te.autocast``, the quantizers, ``te.DType``).
    pytorch: ModuleType
    #: ``transformer_engine.common.recipe`` (the recipe dataclasses, ``Format``, ``MMParams``, ``QParams``).
    recipe: ModuleType
    #: ``transformer_engine.pytorch.quantization`` (``RecipeState``, ``QuantizerRole``, ``is_*_available``).
    quantization: ModuleType
    #: The installed version, e.g. ``"2.20.2"``.
    version: str


def import_te(user: str) -> TransformerEngine:
    """Import TransformerEngine for ``user`` (the adapter's name, for the error message).

    Raises:
        TransformerEngineUnavailable: TE is not installed, or it is installed but fails to import
            (a missing CUDA library, a torch it was not built for); the message names ``user``,
            the import error and :data:`INSTALL_HINT`.
    """
    try:
        pytorch = importlib.import_module("transformer_engine.pytorch")
        recipe = importlib.import_module("transformer_engine.common.recipe")
        quantization = importlib.import_module("transformer_engine.pytorch.quantization")
    except ModuleNotFoundError as error:
        if not (error.name or "").startswith("transformer_engine"):
            raise _unavailable(user, "is installed but fails to import", error) from error
        raise _unavailable(user, "is not installed", error) from error
    except Exception as error:  # noqa: BLE001  (TE's import can fail with OSError or RuntimeError too)
        raise _unavailable(user, "is installed but fails to import", error) from error
    return TransformerEngine(pytorch, recipe, quantization, _version())


def _unavailable(user: str, what: str, error: BaseException) -> TransformerEngineUnavailable:
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return TransformerEngineUnavailable(
        f"{user} needs TransformerEngine, which {what} here ({type(error).__name__}: {first}); "
        f"install it with: {INSTALL_HINT}"
    )


def _version() -> str:
    package = importlib.import_module("transformer_engine")
    version = getattr(package, "__version__", None)
    if version:
        return str(version)
    for name in ("transformer_engine", "transformer-engine"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"
