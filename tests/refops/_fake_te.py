"""Stand-ins for TransformerEngine, installed under its module names (``sys.modules``) by the tests.

* :func:`install_refops_as_te`: a *working* TE made of refops itself (refops mirrors TE's
  names: ``ops``, ``autocast``, ``quantized_model_init``, the quantizers, the recipe
  dataclasses, ``RecipeState``). The adapters and ``python -m refops conformance`` run end to
  end on the CPU against it; a planted bug then shows as a failing row.
* :func:`install_recording_te`: TE classes that record how they are constructed and called,
  with values of their own (a ``DType`` whose members have other numbers than refops'), so
  that a test can assert the adapters' mapping of every option.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
import types
from typing import Any, Optional

import torch

import refops
import refops.recipe
from refops.quantization import NVFP4Quantizer, QuantizerRole
from refops.quantization.recipe_state import RecipeState

_AVAILABILITY = ("is_fp8_available", "is_mxfp8_available", "is_fp8_block_scaling_available", "is_nvfp4_available")
_QUANTIZERS = ("Float8Quantizer", "Float8CurrentScalingQuantizer", "MXFP8Quantizer", "Float8BlockQuantizer",
               "NVFP4Quantizer")


def _install(monkeypatch, pytorch, recipe_module, quantization, version: str) -> None:
    root = types.ModuleType("transformer_engine")
    root.__path__ = []
    root.__version__ = version
    common = types.ModuleType("transformer_engine.common")
    common.__path__ = []
    common.recipe = recipe_module
    pytorch.quantization = quantization
    root.pytorch, root.common = pytorch, common
    for name, module in {
        "transformer_engine": root,
        "transformer_engine.pytorch": pytorch,
        "transformer_engine.pytorch.quantization": quantization,
        "transformer_engine.common": common,
        "transformer_engine.common.recipe": recipe_module,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)


def _availability(answers: dict[str, tuple[bool, str]]):
    def make(name):
        def check(return_reason: bool = False):
            ok, reason = answers.get(name, (True, ""))
            return (ok, reason) if return_reason else ok

        return check

    return {name: make(name) for name in _AVAILABILITY}


def install_refops_as_te(monkeypatch, *, version: str = "0.0+refops", available: Optional[dict] = None,
                         quantizers: Optional[dict] = None, ops: Optional[dict] = None) -> types.ModuleType:
    """refops under TransformerEngine's module names; returns the fake ``transformer_engine.pytorch``.

    Args:
        available: ``{"is_mxfp8_available": (False, "reason")}``: what TE's availability checks answer.
        quantizers: quantizer classes replacing refops' (a planted bug).
        ops: op classes replacing refops' in ``te.ops`` (a planted bug).
    """
    pytorch = types.ModuleType("transformer_engine.pytorch")
    pytorch.__path__ = []
    for name in ("ops", "autocast", "quantized_model_init", "DType", *_QUANTIZERS[:-1]):
        setattr(pytorch, name, getattr(refops, name))
    if ops:
        namespace = {n: getattr(refops.ops, n) for n in dir(refops.ops) if not n.startswith("_")}
        pytorch.ops = types.SimpleNamespace(**{**namespace, **ops})
    pytorch.NVFP4Quantizer = NVFP4Quantizer
    for name, cls in (quantizers or {}).items():
        setattr(pytorch, name, cls)
    quantization = types.ModuleType("transformer_engine.pytorch.quantization")
    quantization.RecipeState, quantization.QuantizerRole = _recipe_state(quantizers or {}), QuantizerRole
    for name, check in _availability(available or {}).items():
        setattr(quantization, name, check)
        setattr(pytorch, name, check)
    _install(monkeypatch, pytorch, refops.recipe, quantization, version)
    return pytorch


def _recipe_state(replacements: dict[str, type]) -> type:
    """refops' RecipeState, whose quantizers take the replacement class of their name (a planted bug)."""
    if not replacements:
        return RecipeState

    class PlantedRecipeState:
        @staticmethod
        def create(recipe, **kwargs):
            state = RecipeState.create(recipe, **kwargs)
            made = state.make_quantizers

            def make_quantizers():
                quantizers = made()
                for q in quantizers:
                    if type(q).__name__ in replacements:
                        q.__class__ = replacements[type(q).__name__]
                return quantizers

            state.make_quantizers = make_quantizers
            return state

    return PlantedRecipeState


# ------------------------------------------------------------------ the recording TE
class DType(enum.IntEnum):
    """TE's DType names with numbers of its own: a mapping by value would pick the wrong member."""

    kFloat32 = 104
    kFloat8E4M3 = 107
    kFloat8E5M2 = 108
    kFloat4E2M1 = 110


class Format(enum.Enum):
    """TE's Format: members by name, values of its own."""

    E4M3 = "te-e4m3"
    E5M2 = "te-e5m2"
    HYBRID = "te-hybrid"
    E2M1 = "te-e2m1"


@dataclasses.dataclass(frozen=True)
class MMParams:
    use_split_accumulator: bool = True


@dataclasses.dataclass(frozen=True)
class QParams:
    power_2_scale: bool = False
    amax_epsilon: float = 0.0
    random_hadamard_transform: bool = False
    stochastic_rounding: bool = False
    fp4_2d_quantization: bool = False


def _fake_recipe_class(refops_class: type, *, drop: tuple[str, ...] = ()) -> type:
    """A dataclass named like ``refops_class`` with its constructor fields (and defaults), minus ``drop``."""
    fields = []
    for f in dataclasses.fields(refops_class):
        if not f.init or f.name in drop:
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        if isinstance(default, enum.Enum):
            default = getattr(Format, default.name)
        elif isinstance(default, refops.recipe.MMParams):
            default = MMParams(default.use_split_accumulator)
        fields.append((f.name, Any, dataclasses.field(default=default)))
    return dataclasses.make_dataclass(refops_class.__name__, fields, eq=False)


class Recording:
    """Everything the fake TE was asked to do, in order: ``(what, args, kwargs)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def of(self, what: str) -> list[tuple[tuple, dict]]:
        return [(a, k) for w, a, k in self.calls if w == what]


def install_recording_te(monkeypatch, *, drop_fields: Optional[dict[str, tuple[str, ...]]] = None) -> Recording:
    """A TE whose quantizers, recipes, recipe state, autocast and quantized_model_init record their calls.

    The quantizers quantize (through the refops quantizer with the same options, rebuilt from what
    they were given), so the candidate's outputs can be checked too.
    """
    rec = Recording()

    class FakeQuantizer:
        def __init__(self, *args, **kwargs):
            rec.calls.append((type(self).__name__, args, kwargs))
            self.args, self.kwargs = args, kwargs
            self.rowwise_usage = kwargs.get("rowwise", True)
            self.columnwise_usage = kwargs.get("columnwise", True)
            self.internal = True  # the adapter must set what it needs
            self.optimize_for_gemm = True
            if type(self).__name__ == "Float8Quantizer":
                self.scale, self.amax = args[0], args[1]

        def set_usage(self, *, rowwise=None, columnwise=None):
            rec.calls.append(("set_usage", (), dict(rowwise=rowwise, columnwise=columnwise)))
            if rowwise is not None:
                self.rowwise_usage = rowwise
            if columnwise is not None:
                self.columnwise_usage = columnwise

        def _refops(self):
            name = type(self).__name__
            cls = NVFP4Quantizer if name == "NVFP4Quantizer" else getattr(refops, name)
            args, kwargs = list(self.args), dict(self.kwargs)
            usages = dict(rowwise=self.rowwise_usage, columnwise=self.columnwise_usage)
            kwargs.pop("rowwise", None), kwargs.pop("columnwise", None)
            if name == "Float8Quantizer":
                return cls(self.scale, self.amax, refops.DType[args[2].name], **usages)
            if name == "NVFP4Quantizer":
                kwargs["fp4_dtype"] = refops.DType[kwargs["fp4_dtype"].name]
                return cls(**kwargs, **usages)
            return cls(refops.DType[args[0].name], *args[1:], **kwargs, **usages)

        def __call__(self, x):
            rec.calls.append(("quantize", (), dict(rowwise=self.rowwise_usage, columnwise=self.columnwise_usage)))
            if (type(self).__name__ in ("Float8Quantizer", "Float8CurrentScalingQuantizer")
                    and self.columnwise_usage and not self.rowwise_usage):
                raise RuntimeError("TE: column-wise-only per-tensor FP8 is not supported")
            return self._refops()(x)

    pytorch = types.ModuleType("transformer_engine.pytorch")
    pytorch.__path__ = []
    pytorch.DType = DType
    for name in _QUANTIZERS:
        setattr(pytorch, name, type(name, (FakeQuantizer,), {}))

    class autocast:
        def __init__(self, enabled=True, calibrating=False, recipe=None, amax_reduction_group=None):
            rec.calls.append(("autocast", (), dict(enabled=enabled, recipe=recipe)))

        def __enter__(self):
            rec.calls.append(("autocast.enter", (), {}))
            return self

        def __exit__(self, *exc):
            rec.calls.append(("autocast.exit", (), {}))

    class quantized_model_init:
        def __init__(self, enabled=True, recipe=None, preserve_high_precision_init_val=False):
            rec.calls.append(("quantized_model_init", (), dict(enabled=enabled, recipe=recipe)))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    pytorch.autocast, pytorch.quantized_model_init = autocast, quantized_model_init
    pytorch.ops = refops.ops  # building needs real ops; what is recorded is the context they run in

    recipe_module = types.ModuleType("transformer_engine.common.recipe")
    recipe_module.Format, recipe_module.MMParams, recipe_module.QParams = Format, MMParams, QParams
    for cls in (refops.recipe.DelayedScaling, refops.recipe.Float8CurrentScaling, refops.recipe.MXFP8BlockScaling,
                refops.recipe.Float8BlockScaling, refops.recipe.NVFP4BlockScaling, refops.recipe.CustomRecipe):
        setattr(recipe_module, cls.__name__, _fake_recipe_class(cls, drop=(drop_fields or {}).get(cls.__name__, ())))

    @dataclasses.dataclass(frozen=True)
    class FakeRole:
        module_type: str = ""
        tensor_type: str = ""
        name: str = ""

    class FakeRecipeState:
        @staticmethod
        def create(recipe, *, mode, num_quantizers=1, device=None, roles=None):
            rec.calls.append(("RecipeState.create", (recipe,), dict(mode=mode, num_quantizers=num_quantizers,
                                                                     device=device, roles=roles)))
            state = types.SimpleNamespace()
            fp8 = DType.kFloat8E5M2 if mode == "backward" else DType.kFloat8E4M3
            state.make_quantizers = lambda: [pytorch.Float8CurrentScalingQuantizer(fp8, device)]
            return state

    quantization = types.ModuleType("transformer_engine.pytorch.quantization")
    quantization.RecipeState, quantization.QuantizerRole = FakeRecipeState, FakeRole
    _install(monkeypatch, pytorch, recipe_module, quantization, "9.9-recording")
    return rec


def flip_first_code(cls: type) -> type:
    """A subclass of the quantizer ``cls`` whose row-wise data has its first byte flipped: a planted bug."""

    class Flipped(cls):
        def quantize(self, tensor, *, out=None):
            result = super().quantize(tensor, out=out)
            for name in ("_data", "_rowwise_data"):
                data = getattr(result, name, None)
                if data is not None:
                    data.view(torch.uint8).view(-1)[0] ^= 0x01
                    break
            return result

    Flipped.__name__ = cls.__name__
    return Flipped
