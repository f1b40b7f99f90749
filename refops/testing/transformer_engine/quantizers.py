"""TransformerEngine's quantizers as candidates of :func:`refops.testing.check_quantizer`.

* :func:`te_quantizer` (in :mod:`.quantizer_classes`): TE's quantizer with every option of a refops quantizer (same class
  name, same constructor arguments, same usages; delayed scaling's scale and amax copied).
* :func:`te_role_quantizer`: the quantizer TE's own recipe state makes for a recipe and a
  tensor role, so that TE's mapping of recipe fields to quantizer options is checked too.
* :func:`quantizer_candidate`: the ``candidate(x, quantizer)`` that ``check_quantizer`` calls.
  It quantizes with TE in the orientation the case asks for and returns
  ``{"data", "scale_inv"[, "amax"]}`` in refops' layout, which is TE's: TE's quantized tensors
  hold the same attributes (``_data`` / ``_transpose`` / ``_scale_inv`` for per-tensor FP8,
  ``_rowwise_data``, ``_columnwise_scale_inv``... for the block formats, ``_amax_rowwise`` /
  ``_amax_columnwise`` for NVFP4).

What TE cannot do, handled here rather than reported as a difference:

* TE does not make a column-wise-only per-tensor FP8 tensor on Hopper: the candidate asks
  for both usages and returns ``_transpose``. Where TE keeps no transpose (GPUs on which
  cuBLAS takes non-TN FP8 GEMMs, compute capability 10.0 and up), the column-wise codes are
  the row-wise ones transposed, which is what the candidate returns.
* Block-format scales come unswizzled (``optimize_for_gemm=False``); a swizzled result is
  refused with an error rather than compared.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch

from ...quantization import Float8CurrentScalingQuantizer, Float8Quantizer, Quantizer
from ...recipe import Recipe
from .availability import import_te
from .quantizer_classes import default_device, te_quantizer
from .recipes import te_recipe

__all__ = ["te_quantizer", "te_role_quantizer", "quantizer_candidate", "quantized_fields", "ROLES"]

#: The tensor roles of a recipe: forward input and weight, backward output grad.
ROLES = ("input", "weight", "grad_output")

def te_role_quantizer(recipe: Recipe, role: str, *, device: Optional[Union[torch.device, str]] = None) -> Any:
    """The quantizer TransformerEngine's recipe state makes for ``role`` of ``recipe`` (TE's own mapping).

    Args:
        recipe: a refops recipe (translated with :func:`te_recipe`).
        role: "input", "weight" or "grad_output" (the backward recipe state for "grad_output"), of a
            linear layer, as ``check_quantizer`` builds its reference: TE gives a linear's weight
            options no other slot has (MXFP8's 2D blocks).
        device: where the recipe state lives (default: the current CUDA device, else the CPU).
    """
    if role not in ROLES:
        raise ValueError(f"te_role_quantizer: role must be one of {ROLES}, got {role!r}")
    te = import_te("te_role_quantizer")
    state = te.quantization.RecipeState.create(
        te_recipe(recipe),
        mode="backward" if role == "grad_output" else "forward",
        num_quantizers=1,
        device=default_device(device),
        roles=[te.quantization.QuantizerRole(module_type="linear", tensor_type=role)],
    )
    made = state.make_quantizers()[0]
    if hasattr(made, "optimize_for_gemm"):
        made.optimize_for_gemm = False
    return made


def quantized_fields(tensor: Any, usage: str) -> dict[str, torch.Tensor]:
    """``{"data", "scale_inv"[, "amax"]}`` of one usage of a TE (or refops) quantized tensor, in refops' layout.

    Raises:
        ValueError: the tensor holds no data for ``usage``, or its scales are swizzled for cuBLAS.
    """
    if usage not in ("rowwise", "columnwise"):
        raise ValueError(f"quantized_fields: usage must be 'rowwise' or 'columnwise', got {usage!r}")
    name = type(tensor).__name__
    if hasattr(tensor, "_transpose") and hasattr(tensor, "_scale_inv"):  # per-tensor FP8
        data = tensor._data if usage == "rowwise" else _column_wise_fp8(tensor)
        if data is None:
            raise ValueError(f"{name} holds no {usage} data")
        return {"data": data, "scale_inv": tensor._scale_inv.reshape(-1)}
    if getattr(tensor, "_with_gemm_swizzled_scales", False):
        raise ValueError(f"{name}'s scales are swizzled for cuBLAS; quantize with optimize_for_gemm=False")
    data, scale_inv = getattr(tensor, f"_{usage}_data", None), getattr(tensor, f"_{usage}_scale_inv", None)
    if data is None or scale_inv is None:
        raise ValueError(f"{name} holds no {usage} data")
    fields = {"data": data, "scale_inv": scale_inv}
    amax = getattr(tensor, f"_amax_{usage}", None)
    if amax is not None:
        fields["amax"] = amax
    return fields


def _column_wise_fp8(tensor: Any) -> Optional[torch.Tensor]:
    """The column-wise codes of a per-tensor FP8 tensor: its transpose, or its row-wise codes transposed."""
    transpose = tensor._transpose
    if transpose is not None and not getattr(tensor, "_transpose_invalid", False):
        return transpose
    data = tensor._data
    if data is None:
        return None
    return data.reshape(-1, data.shape[-1]).t().contiguous() if data.dim() else data


def quantizer_candidate(
    quantizer_or_recipe: Union[Quantizer, Recipe],
    *,
    role: str = "input",
    device: Optional[Union[torch.device, str]] = None,
) -> Callable[[torch.Tensor, Quantizer], dict[str, torch.Tensor]]:
    """A ``check_quantizer`` candidate that quantizes with TransformerEngine.

    Pass the same quantizer or recipe (and ``role``) to ``check_quantizer``::

        candidate = quantizer_candidate(recipe, role="weight")
        check_quantizer(candidate, recipe, role="weight", output="data_and_scale_inv").assert_ok()

    Args:
        quantizer_or_recipe: a refops quantizer (TE's is built from each case's quantizer by
            :func:`te_quantizer`), or a refops recipe (TE's recipe state makes the quantizer for
            ``role``, :func:`te_role_quantizer`; the case gives the usage and delayed scaling's scale).
        role: for a recipe, "input", "weight" or "grad_output".
        device: where TE runs (default: the current CUDA device, else the CPU).

    Returns:
        ``candidate(x, quantizer) -> {"data", "scale_inv"[, "amax"]}``. For delayed scaling the
        amax TE records is also written into the case quantizer's ``amax``.
    """
    if not isinstance(quantizer_or_recipe, (Quantizer, Recipe)):
        raise TypeError(
            "quantizer_candidate: expected a refops Quantizer or Recipe, "
            f"got {type(quantizer_or_recipe).__name__}"
        )
    if isinstance(quantizer_or_recipe, Recipe) and role not in ROLES:
        raise ValueError(f"quantizer_candidate: role must be one of {ROLES}, got {role!r}")
    import_te("quantizer_candidate")  # fail now, not at the first case
    where = default_device(device)
    from_recipe = isinstance(quantizer_or_recipe, Recipe)

    def candidate(x: torch.Tensor, quantizer: Quantizer) -> dict[str, torch.Tensor]:
        usage = "rowwise" if quantizer.rowwise_usage else "columnwise"
        if from_recipe:
            te_q = te_role_quantizer(quantizer_or_recipe, role, device=where)
            _take_case_settings(te_q, quantizer, where)
        else:
            te_q = te_quantizer(quantizer, device=where)
        if isinstance(quantizer, (Float8Quantizer, Float8CurrentScalingQuantizer)) and usage == "columnwise":
            te_q.set_usage(rowwise=True, columnwise=True)  # TE refuses column-wise-only per-tensor FP8
        with torch.no_grad():
            result = te_q(x.detach().to(where))
        fields = quantized_fields(result, usage)
        if isinstance(quantizer, Float8Quantizer):
            quantizer.amax.copy_(te_q.amax.detach().reshape(quantizer.amax.shape).to(quantizer.amax.device))
            fields["amax"] = te_q.amax.detach().reshape(-1)
        return fields

    candidate.__qualname__ = f"TransformerEngine ({_describe(quantizer_or_recipe, role, from_recipe)})"
    return candidate


def _take_case_settings(te_q: Any, case: Quantizer, device: torch.device) -> None:
    """The case's usage, and for delayed scaling its scale (TE's recipe state starts at 1)."""
    te_q.set_usage(rowwise=case.rowwise_usage, columnwise=case.columnwise_usage)
    if isinstance(case, Float8Quantizer):
        te_q.scale = case.scale.detach().to(device=device, dtype=torch.float32).clone()
        te_q.amax = torch.zeros(1, dtype=torch.float32, device=device)


def _describe(quantizer_or_recipe: Any, role: str, from_recipe: bool) -> str:
    if from_recipe:
        return f"{type(quantizer_or_recipe).__name__}, {role}"
    return type(quantizer_or_recipe).__name__
