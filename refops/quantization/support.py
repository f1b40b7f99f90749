"""TE's "can this run here?" queries: ``is_fp8_available`` and its siblings, ``check_*_support``.

TransformerEngine answers about the GPU: FP8 needs compute capability 8.9 or newer,
MXFP8 and NVFP4 need 10.0, FP8 block scaling 9.0 with CUDA 12.9, bf16 8.0. Its own code
and its users branch on these answers (``if te.is_mxfp8_available(): ...``), and TE's
tests skip every recipe the answer rules out.

refops answers the question its callers are asking, "can refops run this recipe
here?", and that is always yes: the reference computes every recipe in plain torch on
any device, the CPU included, with TE's quantization bit for bit; the CUDA fast path
(built and measured on sm_90) runs every recipe too, dequantizing first where the GPU has
no GEMM for the format (``fastpath.gemm.GEMM_PATHS``). So each query returns ``True`` (``(True, "")`` with
``return_reason=True``), and TE code or tests run under refops exercise every recipe.
Whether *this GPU* has native FP8/MXFP8/NVFP4 hardware is a different question, which
``torch.cuda.get_device_capability()`` answers.

Return conventions are TE's: ``is_*_available(return_reason=False)`` gives a bool, or
``(bool, reason)`` with ``return_reason=True``, the reason empty when available;
``check_*_support()`` always gives ``(bool, reason)``.
"""

from __future__ import annotations

from typing import Any, Union

__all__ = [
    "check_fp8_support",
    "check_mxfp8_support",
    "check_nvfp4_support",
    "check_fp8_block_scaling_support",
    "check_recipe_support",
    "is_fp8_available",
    "is_mxfp8_available",
    "is_fp8_block_scaling_available",
    "is_nvfp4_available",
    "is_bf16_available",
]

#: Every scheme runs wherever refops runs (see the module docstring): supported, with no reason to give.
_SUPPORTED: tuple[bool, str] = (True, "")


def check_fp8_support() -> tuple[bool, str]:
    """Per-tensor FP8 (delayed and current scaling): ``(True, "")``; refops runs it on every device."""
    return _SUPPORTED


def check_mxfp8_support() -> tuple[bool, str]:
    """MXFP8: ``(True, "")``; refops runs it on every device (TE needs compute capability 10.0)."""
    return _SUPPORTED


def check_nvfp4_support() -> tuple[bool, str]:
    """NVFP4: ``(True, "")``; refops runs it on every device (TE needs compute capability 10.0)."""
    return _SUPPORTED


def check_fp8_block_scaling_support() -> tuple[bool, str]:
    """FP8 block scaling: ``(True, "")``; refops runs it on every device (TE needs 9.0 and CUDA 12.9)."""
    return _SUPPORTED


def check_recipe_support(recipe: Any) -> None:
    """TE raises ``RuntimeError`` for a recipe the GPU cannot run; refops runs every recipe.

    Raises ``TypeError`` when ``recipe`` is not a :class:`refops.recipe.Recipe`.
    """
    from ..recipe import Recipe

    if not isinstance(recipe, Recipe):
        raise TypeError(f"check_recipe_support: expected a refops.recipe.Recipe, got {type(recipe).__name__}")


def _answer(support: tuple[bool, str], return_reason: bool) -> Union[bool, tuple[bool, str]]:
    return support if return_reason else support[0]


def is_fp8_available(return_reason: bool = False) -> Union[bool, tuple[bool, str]]:
    """Whether refops can run the FP8 delayed and current scaling recipes here: always (see the module docstring).

    ``return_reason=True`` gives ``(available, reason)``, the reason empty when available.
    """
    return _answer(check_fp8_support(), return_reason)


def is_mxfp8_available(return_reason: bool = False) -> Union[bool, tuple[bool, str]]:
    """Whether refops can run the MXFP8 recipe here: always (TE answers for the GPU: compute capability 10.0)."""
    return _answer(check_mxfp8_support(), return_reason)


def is_fp8_block_scaling_available(return_reason: bool = False) -> Union[bool, tuple[bool, str]]:
    """Whether refops can run the FP8 block scaling recipe here: always (TE: compute capability 9.0, CUDA 12.9)."""
    return _answer(check_fp8_block_scaling_support(), return_reason)


def is_nvfp4_available(return_reason: bool = False) -> Union[bool, tuple[bool, str]]:
    """Whether refops can run the NVFP4 recipe here: always (TE answers for the GPU: compute capability 10.0)."""
    return _answer(check_nvfp4_support(), return_reason)


def is_bf16_available(return_reason: bool = False) -> Union[bool, tuple[bool, str]]:
    """Whether refops can compute in bfloat16 here: always; torch runs bf16 on the CPU and every GPU
    (TE answers for the GPU: compute capability 8.0)."""
    return _answer(_SUPPORTED, return_reason)
