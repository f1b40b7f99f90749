"""TransformerEngine's recipe for a refops recipe: every field, and the quantization parameters derived from them.

refops' recipes mirror TE's dataclasses field for field (``refops.recipe``), so the
mapping is by name: each constructor field is passed to TE's class of the same name,
``Format``, ``MMParams`` and ``QParams`` values become TE's. Two things go beyond a
plain copy:

* the derived quantization parameters (``fp8_quant_fwd_inp`` and friends) are set on
  TE's instance too. TE computes those of ``Float8CurrentScaling`` and
  ``Float8BlockScaling`` as *class* attributes, once, from environment variables read at
  import: ``Float8BlockScaling(use_f32_scales=True)`` keeps power-of-two scales in TE
  2.20.2, while refops (and the user) asked for fp32 scales. Setting them on the
  instance makes TE quantize as the refops recipe says.
* a field TE's class lacks is an error when refops' value is not its default (the
  recipe could not be reproduced); at its default it means "feature off" and is left out.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from ...quantization.quantizer import QuantizerRole as RefopsQuantizerRole
from ...recipe import (
    CustomRecipe,
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    MMParams,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    QParams,
    Recipe,
    Format,
)
from .availability import import_te
from .quantizer_classes import te_quantizer

__all__ = ["te_recipe"]

#: refops' recipe classes, by the name of TE's class that mirrors each.
_RECIPE_CLASSES = (DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling, Float8BlockScaling, NVFP4BlockScaling,
                   CustomRecipe)


def te_recipe(recipe: Optional[Recipe]) -> Any:
    """TransformerEngine's recipe with the settings of the refops ``recipe`` (None for None).

    Raises:
        TypeError: ``recipe`` is not a refops recipe.
        ValueError: TE's class lacks a field that ``recipe`` sets to a non-default value.
        TransformerEngineUnavailable: TransformerEngine cannot be imported.
    """
    if recipe is None:
        return None
    if not isinstance(recipe, Recipe):
        raise TypeError(f"te_recipe: expected a refops Recipe (refops.recipe), got {type(recipe).__name__}")
    te = import_te("te_recipe")
    base = next((cls for cls in _RECIPE_CLASSES if isinstance(recipe, cls)), None)
    if base is None:
        raise TypeError(f"te_recipe: no TransformerEngine recipe mirrors {type(recipe).__name__}")
    te_class = getattr(te.recipe, base.__name__, None)
    if te_class is None:
        raise ValueError(f"te_recipe: this TransformerEngine ({te.version}) has no recipe {base.__name__}")
    accepted = {f.name for f in dataclasses.fields(te_class) if f.init}
    kwargs, dropped = {}, []
    for field in dataclasses.fields(recipe):
        if not field.init:
            continue
        value = getattr(recipe, field.name)
        if field.name not in accepted:
            if value != _default(field):
                raise ValueError(
                    f"te_recipe: {type(recipe).__name__}.{field.name}={value!r}, but TransformerEngine "
                    f"{te.version}'s {base.__name__} has no field {field.name!r}: the recipe cannot be reproduced"
                )
            dropped.append(field.name)
            continue
        kwargs[field.name] = _to_te(te, value, what=f"{type(recipe).__name__}.{field.name}")
    if isinstance(recipe, CustomRecipe):
        kwargs["qfactory"] = _te_qfactory(recipe.qfactory)
    result = te_class(**kwargs)
    for field in dataclasses.fields(recipe):
        value = getattr(recipe, field.name, None)
        if not field.init and isinstance(value, QParams):
            setattr(result, field.name, _to_te(te, value, what=f"{type(recipe).__name__}.{field.name}"))
    return result


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return field.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def _to_te(te: Any, value: Any, *, what: str) -> Any:
    """A field value in TE's types: formats by name, MMParams and QParams field by field."""
    if isinstance(value, Format):
        return getattr(te.recipe.Format, value.name)
    if isinstance(value, (MMParams, QParams)):
        te_class = getattr(te.recipe, type(value).__name__)
        accepted = {f.name for f in dataclasses.fields(te_class)}
        fields = dataclasses.asdict(value)
        missing = {k: v for k, v in fields.items() if k not in accepted and v != _default_of(type(value), k)}
        if missing:
            raise ValueError(f"te_recipe: {what} sets {missing}, which TransformerEngine's {te_class.__name__} lacks")
        return te_class(**{k: v for k, v in fields.items() if k in accepted})
    return value


def _default_of(cls: type, name: str) -> Any:
    return _default(next(f for f in dataclasses.fields(cls) if f.name == name))


def _te_qfactory(qfactory: Any) -> Any:
    """A CustomRecipe factory for TE: TE's role in, refops' factory called, TE's quantizer out."""
    def factory(role: Any = None) -> Any:
        refops_role = None if role is None else RefopsQuantizerRole(
            module_type=getattr(role, "module_type", "") or "",
            tensor_type=getattr(role, "tensor_type", "") or "",
            name=getattr(role, "name", "") or "",
        )
        made = qfactory(refops_role)
        return None if made is None else te_quantizer(made)

    return factory
