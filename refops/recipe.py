"""Quantization recipes: TransformerEngine's ``transformer_engine.common.recipe`` names and defaults.

A recipe says *how* tensors are quantized inside ``refops.autocast``; the
numerics live in :mod:`refops.quantization` and ``docs/recipes/index.md``.

* :class:`Format` gives the FP8/FP4 format of forward and backward tensors and
  the largest finite value of each (``max_fwd``/``max_bwd``). Under ``HYBRID``
  forward tensors (input, weight, output) are E4M3 and backward tensors
  (grad_output, grad_input) are E5M2.
* Every recipe has ``backward_override`` in ``{None, "high_precision",
  "dequantized"}`` (default from env ``NVTE_BACKWARD_OVERRIDE``). With a non-None
  value the backward runs unquantized: on the original operands
  ("high_precision") or on the dequantized forward operands ("dequantized").

Environment overrides (``NVTE_*``) are read when a recipe is *constructed*
(TE reads them once, at import), so a test can set them with ``monkeypatch``.
Recipes are mutable dataclasses as in TE; ``QParams`` and ``MMParams`` are frozen.
Invalid configurations raise an error naming the recipe and the field, at
construction (TE asserts only some of them): ``ValueError`` for a value out of
range, ``TypeError`` for a wrong type (``margin=1.5``, ``reduce_amax="yes"``,
``fp8_format="E4M3"``).
"""

from __future__ import annotations

import dataclasses
import enum
import os
from typing import Any, Callable, NamedTuple, Optional, Union

from .recipe_checks import FieldChecks

__all__ = [
    "Format",
    "MMParams",
    "QParams",
    "Recipe",
    "DelayedScaling",
    "Float8CurrentScaling",
    "MXFP8BlockScaling",
    "Float8BlockScaling",
    "NVFP4BlockScaling",
    "CustomRecipe",
]

BACKWARD_OVERRIDES = (None, "high_precision", "dequantized")
NVFP4_4OVER6_SCOPES = ("none", "weights", "activations", "all")
NVFP4_4OVER6_ERR_MODES = ("MAE", "MSE")


def _env_flag(name: str) -> Callable[[], bool]:
    """Default factory: True iff env ``name`` is ``"1"``."""
    return lambda: os.getenv(name, "0") == "1"


def _env_str(name: str, default: Optional[str]) -> Callable[[], Optional[str]]:
    return lambda: os.getenv(name, default)


def _backward_override_default() -> Any:
    return dataclasses.field(default_factory=_env_str("NVTE_BACKWARD_OVERRIDE", None))


class _FormatHelper(NamedTuple):
    """Largest finite value of the forward and backward format."""

    max_fwd: float
    max_bwd: float


class Format(enum.Enum):
    """FP8/FP4 formats: ``E2M1`` (6/6), ``E4M3`` (448/448), ``E5M2`` (57344/57344), ``HYBRID`` (448/57344)."""

    E2M1 = _FormatHelper(max_fwd=6, max_bwd=6)
    E4M3 = _FormatHelper(max_fwd=448, max_bwd=448)
    E5M2 = _FormatHelper(max_fwd=57344, max_bwd=57344)
    HYBRID = _FormatHelper(max_fwd=448, max_bwd=57344)

    @property
    def max_fwd(self) -> float:
        return self.value.max_fwd

    @property
    def max_bwd(self) -> float:
        return self.value.max_bwd


@dataclasses.dataclass(frozen=True)
class MMParams:
    """GEMM options. ``use_split_accumulator=False`` means cuBLAS fast (FP8) accumulation."""

    use_split_accumulator: bool = True


@dataclasses.dataclass(frozen=True)
class QParams:
    """Quantization options of one tensor role.

    ``power_2_scale``: scales rounded down to a power of two (mantissa dropped);
    ``amax_epsilon``: lower bound on the amax; the last three are NVFP4 options.
    """

    power_2_scale: bool = False
    amax_epsilon: float = 0.0
    random_hadamard_transform: bool = False
    stochastic_rounding: bool = False
    fp4_2d_quantization: bool = False


class Recipe(FieldChecks):
    """Base class. The predicates are classmethods, usable on the class or an instance."""

    @classmethod
    def nvfp4(cls) -> bool:
        """NVFP4 block scaling."""
        return issubclass(cls, NVFP4BlockScaling)

    @classmethod
    def mxfp8(cls) -> bool:
        """MXFP8 block scaling."""
        return issubclass(cls, MXFP8BlockScaling)

    @classmethod
    def delayed(cls) -> bool:
        """Per-tensor delayed scaling."""
        return issubclass(cls, DelayedScaling)

    @classmethod
    def float8_current_scaling(cls) -> bool:
        """Per-tensor current scaling."""
        return issubclass(cls, Float8CurrentScaling)

    @classmethod
    def float8_per_tensor_scaling(cls) -> bool:
        """Either per-tensor recipe (delayed or current scaling)."""
        return issubclass(cls, (DelayedScaling, Float8CurrentScaling))

    @classmethod
    def float8_block_scaling(cls) -> bool:
        """FP8 1x128 / 128x128 block scaling."""
        return issubclass(cls, Float8BlockScaling)

    @classmethod
    def custom(cls) -> bool:
        """A user quantizer factory."""
        return issubclass(cls, CustomRecipe)

    def _options_key(self) -> tuple:
        """A snapshot of every field's value: recipes are mutable (as in TE), so a change made in place
        is seen by comparing snapshots, not objects. Ops rebuild their quantizers when it changes."""
        return (type(self),) + tuple(getattr(self, f.name) for f in dataclasses.fields(self))  # type: ignore[arg-type]

    # ----------------------------------------------------------- validation
    def _check_backward_override(self) -> None:
        if self.backward_override not in BACKWARD_OVERRIDES:  # type: ignore[attr-defined]
            raise ValueError(
                f"{type(self).__name__}: backward_override (env NVTE_BACKWARD_OVERRIDE) must be None, "
                f"'high_precision' or 'dequantized', got {self.backward_override!r}"  # type: ignore[attr-defined]
            )

    def _check_fp8_format(self) -> None:
        fmt = self.fp8_format  # type: ignore[attr-defined]
        if not isinstance(fmt, Format):
            raise TypeError(f"{type(self).__name__}: fp8_format must be a Format, got {fmt!r}")
        if fmt in (Format.E5M2, Format.E2M1):
            raise ValueError(f"{type(self).__name__}: fp8_format {fmt.name} is not supported (use E4M3 or HYBRID)")


@dataclasses.dataclass
class DelayedScaling(Recipe):
    """Per-tensor scales from an amax history (``docs/recipes/delayed-scaling.md#the-arithmetic``).

    ``scale = (fmax / amax_eff) / 2^margin`` where ``amax_eff`` is the max of the
    last ``amax_history_len`` amaxes ("max") or the latest ("most_recent"), or
    ``amax_compute_algo(history)`` when callable. Only ``backward_override=None``.
    """

    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: Union[str, Callable] = "max"
    scaling_factor_compute_algo: Optional[Callable] = None
    reduce_amax: bool = True
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = _backward_override_default()

    def __post_init__(self) -> None:
        self._check_fp8_format()
        self._check_backward_override()
        if self.backward_override is not None:
            raise ValueError(
                f"DelayedScaling only supports backward_override=None, got {self.backward_override!r} "
                "(check env NVTE_BACKWARD_OVERRIDE)"
            )
        if not callable(self.amax_compute_algo) and self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(
                f"DelayedScaling: amax_compute_algo must be 'max', 'most_recent' or a callable, "
                f"got {self.amax_compute_algo!r}"
            )
        self._check_int("margin", 0)
        self._check_int("amax_history_len", 1)
        if self.scaling_factor_compute_algo is not None and not callable(self.scaling_factor_compute_algo):
            raise TypeError(
                f"DelayedScaling: scaling_factor_compute_algo must be None or a callable, "
                f"got {self.scaling_factor_compute_algo!r}"
            )
        self._check_bools("reduce_amax", "fp8_dpa", "fp8_mha")


@dataclasses.dataclass
class Float8CurrentScaling(Recipe):
    """Per-tensor scales from each tensor's own amax (``docs/recipes/current-scaling.md#the-arithmetic``).

    ``fp8_quant_*`` are derived from ``use_power_2_scales`` (env
    ``NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES``); in TE they are class attributes
    fixed at import. fprop uses fast accumulation, dgrad/wgrad the split accumulator.
    """

    use_power_2_scales: bool = dataclasses.field(
        default_factory=_env_flag("NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES")
    )
    fp8_format: Format = Format.HYBRID
    fp8_quant_fwd_inp: QParams = dataclasses.field(init=False)
    fp8_quant_fwd_weight: QParams = dataclasses.field(init=False)
    fp8_quant_bwd_grad: QParams = dataclasses.field(init=False)
    fp8_gemm_fprop: MMParams = MMParams(use_split_accumulator=False)
    fp8_gemm_dgrad: MMParams = MMParams(use_split_accumulator=True)
    fp8_gemm_wgrad: MMParams = MMParams(use_split_accumulator=True)
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = _backward_override_default()

    def __post_init__(self) -> None:
        self._check_fp8_format()
        self._check_backward_override()
        self._check_bools("use_power_2_scales", "fp8_dpa", "fp8_mha")
        params = QParams(power_2_scale=bool(self.use_power_2_scales), amax_epsilon=0.0)
        self.fp8_quant_fwd_inp = params
        self.fp8_quant_fwd_weight = params
        self.fp8_quant_bwd_grad = params


@dataclasses.dataclass
class MXFP8BlockScaling(Recipe):
    """1x32 blocks with E8M0 scales (``docs/recipes/mxfp8.md#the-arithmetic``).

    ``enable_2d_quantization`` (env ``NVTE_MXFP8_ENABLE_2D_QUANTIZATION``): forward
    Linear weights use one scale per 32x32 tile. ``margin`` is unused by the kernels.
    """

    margin: int = 0
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = _backward_override_default()
    enable_2d_quantization: bool = dataclasses.field(default_factory=_env_flag("NVTE_MXFP8_ENABLE_2D_QUANTIZATION"))

    def __post_init__(self) -> None:
        self._check_fp8_format()
        self._check_backward_override()
        self._check_int("margin", 0)
        self._check_bools("fp8_dpa", "fp8_mha", "enable_2d_quantization")


@dataclasses.dataclass
class Float8BlockScaling(Recipe):
    """DeepSeek-style 1x128 (``*_block_scaling_dim=1``) / 128x128 (``=2``) blocks, fp32 scales.

    Scales are powers of two unless ``use_f32_scales`` (env
    ``NVTE_FP8_BLOCK_SCALING_FP32_SCALES``). 2D x 2D GEMMs are forbidden, the split
    accumulator is required (``docs/recipes/fp8-block.md#the-arithmetic``) and FP8 attention is not supported.
    """

    use_f32_scales: bool = dataclasses.field(default_factory=_env_flag("NVTE_FP8_BLOCK_SCALING_FP32_SCALES"))
    fp8_format: Format = Format.E4M3
    fp8_quant_fwd_inp: QParams = dataclasses.field(init=False)
    fp8_quant_fwd_weight: QParams = dataclasses.field(init=False)
    fp8_quant_bwd_grad: QParams = dataclasses.field(init=False)
    x_block_scaling_dim: int = 1
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1
    fp8_gemm_fprop: MMParams = MMParams(use_split_accumulator=True)
    fp8_gemm_dgrad: MMParams = MMParams(use_split_accumulator=True)
    fp8_gemm_wgrad: MMParams = MMParams(use_split_accumulator=True)
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = _backward_override_default()

    def __post_init__(self) -> None:
        dims = {
            "x_block_scaling_dim": self.x_block_scaling_dim,
            "w_block_scaling_dim": self.w_block_scaling_dim,
            "grad_block_scaling_dim": self.grad_block_scaling_dim,
        }
        self._check_bools("use_f32_scales", "fp8_dpa", "fp8_mha")
        for name, dim in dims.items():
            if isinstance(dim, bool) or dim not in (1, 2):
                raise ValueError(f"Float8BlockScaling: {name} must be 1 or 2, got {dim}")
        two_d = [name for name, dim in dims.items() if dim == 2]
        if len(two_d) > 1:
            raise ValueError(f"Float8BlockScaling: 2D x 2D block GEMMs are not supported ({', '.join(two_d)} are 2)")
        for name in ("fp8_gemm_fprop", "fp8_gemm_dgrad", "fp8_gemm_wgrad"):
            if not getattr(self, name).use_split_accumulator:
                raise ValueError(f"Float8BlockScaling: {name} needs use_split_accumulator=True")
        if self.fp8_dpa or self.fp8_mha:
            raise ValueError("Float8BlockScaling: FP8 attention (fp8_dpa / fp8_mha) is not supported")
        self._check_fp8_format()
        self._check_backward_override()
        params = QParams(power_2_scale=not self.use_f32_scales, amax_epsilon=0.0)
        self.fp8_quant_fwd_inp = params
        self.fp8_quant_fwd_weight = params
        self.fp8_quant_bwd_grad = params


@dataclasses.dataclass
class NVFP4BlockScaling(Recipe):
    """E2M1 data, E4M3 scales per 16 elements, one fp32 amax per tensor (``docs/recipes/nvfp4.md#the-arithmetic``).

    Defaults: weights 16x16 (2D) blocks; inputs and grads get the random Hadamard
    transform on their column-wise copy; grads use stochastic rounding. Each
    ``disable_*`` flag has its ``NVTE_NVFP4_DISABLE_*`` env override.
    ``fp4_quant_fwd_inp / fwd_weight / bwd_grad`` are built in ``__post_init__``.
    """

    disable_rht: bool = dataclasses.field(default_factory=_env_flag("NVTE_NVFP4_DISABLE_RHT"))
    disable_stochastic_rounding: bool = dataclasses.field(
        default_factory=_env_flag("NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING")
    )
    disable_2d_quantization: bool = dataclasses.field(
        default_factory=_env_flag("NVTE_NVFP4_DISABLE_2D_QUANTIZATION")
    )
    row_scaled_activation: bool = dataclasses.field(default_factory=_env_flag("NVTE_NVFP4_ROW_SCALED_ACTIVATION"))
    nvfp4_4over6: str = dataclasses.field(default_factory=_env_str("NVTE_NVFP4_4OVER6", "none"))
    nvfp4_4over6_e4m3_use_256: str = dataclasses.field(
        default_factory=_env_str("NVTE_NVFP4_4OVER6_E4M3_USE_256", "all")
    )
    nvfp4_4over6_err_mode: str = dataclasses.field(
        default_factory=lambda: os.getenv("NVTE_NVFP4_4OVER6_ERR_MODE", "MAE").upper()
    )
    fp4_format: Format = Format.E2M1
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = _backward_override_default()
    fp4_quant_fwd_inp: QParams = dataclasses.field(init=False)
    fp4_quant_fwd_weight: QParams = dataclasses.field(init=False)
    fp4_quant_bwd_grad: QParams = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        if self.fp4_format != Format.E2M1:
            raise ValueError(f"NVFP4BlockScaling: fp4_format must be Format.E2M1, got {self.fp4_format!r}")
        if self.fp8_format != Format.E4M3:
            raise ValueError(f"NVFP4BlockScaling: fp8_format (block scales) must be Format.E4M3, got {self.fp8_format!r}")
        self._check_backward_override()
        self._check_bools(
            "disable_rht", "disable_stochastic_rounding", "disable_2d_quantization", "row_scaled_activation",
            "fp8_dpa", "fp8_mha",
        )
        for name in ("nvfp4_4over6", "nvfp4_4over6_e4m3_use_256"):
            if getattr(self, name) not in NVFP4_4OVER6_SCOPES:
                raise ValueError(
                    f"NVFP4BlockScaling: {name} must be one of {NVFP4_4OVER6_SCOPES}, got {getattr(self, name)!r}"
                )
        if self.nvfp4_4over6_err_mode not in NVFP4_4OVER6_ERR_MODES:
            raise ValueError(
                f"NVFP4BlockScaling: nvfp4_4over6_err_mode must be one of {NVFP4_4OVER6_ERR_MODES}, "
                f"got {self.nvfp4_4over6_err_mode!r}"
            )
        # RHT applies to column-wise (wgrad) copies only.
        self.fp4_quant_fwd_inp = QParams(random_hadamard_transform=not self.disable_rht)
        self.fp4_quant_fwd_weight = QParams(fp4_2d_quantization=not self.disable_2d_quantization)
        self.fp4_quant_bwd_grad = QParams(
            random_hadamard_transform=not self.disable_rht,
            stochastic_rounding=not self.disable_stochastic_rounding,
        )


@dataclasses.dataclass
class CustomRecipe(Recipe):
    """``qfactory(role) -> Quantizer`` per tensor role (``refops.quantization.QuantizerRole``).

    ``fp8_format`` does not affect quantization; it only feeds format decisions.
    """

    qfactory: Callable[..., Any]
    fp8_format: Format = Format.HYBRID
    fp8_dpa: bool = False
    fp8_mha: bool = False
    quantization_alignment: int = 128
    backward_override: Optional[str] = _backward_override_default()

    def __post_init__(self) -> None:
        if not callable(self.qfactory):
            raise ValueError(f"CustomRecipe: qfactory must be callable, got {self.qfactory!r}")
        self._check_fp8_format()
        self._check_backward_override()
        self._check_int("quantization_alignment", 1)
        self._check_bools("fp8_dpa", "fp8_mha")
