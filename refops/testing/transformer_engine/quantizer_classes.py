"""TransformerEngine's quantizer of the same class and options as a refops quantizer (:func:`te_quantizer`).

Apart from :mod:`.quantizers` because TE's recipe translation (:mod:`.recipes`, a ``CustomRecipe``'s
factory) needs it too, and the quantizer tier needs the recipe translation.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch

from ...quantization import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
    Quantizer,
)
from .availability import TransformerEngine, import_te

__all__ = ["te_quantizer", "default_device"]

#: For each refops quantizer class, the constructor arguments TE's class of the same name takes, read
#: from the refops quantizer's attribute of the same name (the dtype and ``device`` are handled apart).
_OPTIONS: dict[type, tuple[str, ...]] = {
    Float8Quantizer: (),
    Float8CurrentScalingQuantizer: ("with_amax_reduction", "amax_reduction_group", "force_pow_2_scales",
                                    "amax_epsilon"),
    MXFP8Quantizer: ("with_2d_quantization",),
    Float8BlockQuantizer: ("amax_epsilon", "force_pow_2_scales", "block_scaling_dim"),
    NVFP4Quantizer: ("with_amax_reduction", "amax_reduction_group", "with_rht", "with_post_rht_amax",
                     "with_2d_quantization", "stochastic_rounding", "row_scaled_nvfp4", "nvfp4_use_4over6",
                     "nvfp4_e4m3_max", "nvfp4_4over6_err_mode", "with_random_sign_mask"),
}


def default_device(device: Optional[Union[torch.device, str]]) -> torch.device:
    if device is not None:
        return torch.device(device)
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _te_dtype(te: TransformerEngine, dtype: Any) -> Any:
    """TE's ``DType`` member of the same name as refops' (``kFloat8E4M3``...)."""
    enum = getattr(te.pytorch, "DType", None)
    if enum is None:  # TE before 2.x exposed only the extension's enum
        import transformer_engine_torch as tex  # noqa: PLC0415

        enum = tex.DType
    return getattr(enum, dtype.name)


def te_quantizer(quantizer: Quantizer, *, device: Optional[Union[torch.device, str]] = None) -> Any:
    """TransformerEngine's quantizer configured as ``quantizer``: class, dtype, usages and every option.

    Args:
        quantizer: a refops quantizer (any of the five schemes).
        device: where TE's quantizer state lives (delayed scaling's scale and amax; current
            scaling's workspace). Default: the current CUDA device, else the CPU.

    Raises:
        TypeError: ``quantizer`` is not one of refops' quantizer classes.
        TransformerEngineUnavailable: TransformerEngine cannot be imported.
    """
    kind = next((cls for cls in _OPTIONS if type(quantizer) is cls), None)
    if kind is None:
        raise TypeError(
            f"te_quantizer: expected one of refops' quantizers ({', '.join(c.__name__ for c in _OPTIONS)}), "
            f"got {type(quantizer).__name__}"
        )
    te = import_te("te_quantizer")
    device = default_device(device)
    te_class = getattr(te.pytorch, kind.__name__)
    options = {name: getattr(quantizer, name) for name in _OPTIONS[kind]}
    usages = dict(rowwise=quantizer.rowwise_usage, columnwise=quantizer.columnwise_usage)
    dtype = _te_dtype(te, quantizer.dtype)
    if kind is Float8Quantizer:
        scale = quantizer.scale.detach().to(device=device, dtype=torch.float32).clone()
        amax = quantizer.amax.detach().to(device=device, dtype=torch.float32).clone()
        made = te_class(scale, amax, dtype, **usages)
    elif kind is Float8CurrentScalingQuantizer:
        made = te_class(dtype, device, **usages, **options)
    elif kind is NVFP4Quantizer:
        made = te_class(fp4_dtype=dtype, **usages, **options)
    else:
        made = te_class(dtype, **usages, **options)
    made.internal = False
    if hasattr(made, "optimize_for_gemm"):
        made.optimize_for_gemm = False  # scales in the plain layout refops compares, not swizzled for cuBLAS
    return made
