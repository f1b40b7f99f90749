"""Recipe state: what one basic op keeps per mode ("forward"/"backward") for a recipe, and its quantizers.

Only delayed scaling is stateful (a scale and an amax history per quantizer
slot); every other recipe computes scales from the tensor being quantized, so
its state is just the recipe and the roles. ``RecipeState.create`` picks the
class; ``make_quantizers`` builds one quantizer per slot, chosen by the slot's
tensor type (its role's, else its position's: TE's forward ``[input, weight,
output]`` and backward ``[grad_output, grad_input]``) where the recipe treats
tensor types differently.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from ..recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    Format,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    Recipe,
)
from ..kernels import current_backend
from ..kernels.reference.delayed_scaling import nan_skipping_max, scale_from_amax
from .float8 import Float8CurrentScalingQuantizer, Float8Quantizer
from .float8_block import Float8BlockQuantizer
from .mxfp8 import MXFP8Quantizer
from .nvfp4 import NVFP4Quantizer
from .quantizer import DType, Quantizer, QuantizerRole

__all__ = ["RecipeState", "DelayedScalingRecipeState", "fp8_dtype_for"]

FLT_MAX = torch.finfo(torch.float32).max
MODES = ("forward", "backward")


def fp8_dtype_for(recipe: Recipe, mode: str) -> DType:
    """E4M3 everywhere, except backward tensors under HYBRID, which are E5M2."""
    if recipe.fp8_format == Format.HYBRID and mode == "backward":
        return DType.kFloat8E5M2
    return DType.kFloat8E4M3


#: The tensor types a slot's role may name; any other (a custom name such as "qkv", or none) falls back
#: to the slot's position, as in TE.
KNOWN_TENSOR_TYPES = ("input", "weight", "output", "grad_output", "grad_input")
#: TE's positional layout of role-less slots: forward ``[input, weight, output, ...]``, backward
#: ``[grad_output, grad_input, ...]``, repeating (so slot 1 of a forward state is a weight).
POSITIONAL_TENSOR_TYPES = {"forward": ("input", "weight", "output"), "backward": ("grad_output", "grad_input")}
GRADIENT_TENSOR_TYPES = ("grad_output", "grad_input")


class RecipeState:
    """The quantizer state of one op, in one mode, for one recipe."""

    def __init__(
        self, recipe: Recipe, *, mode: str, num_quantizers: int, roles: Optional[Sequence[QuantizerRole]] = None,
        device: Optional[torch.device] = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"RecipeState: mode must be 'forward' or 'backward', got {mode!r}")
        if roles is not None and len(roles) != num_quantizers:
            raise ValueError(f"{len(roles)} quantizer roles given for {num_quantizers} quantizers")
        self.recipe, self.mode, self.num_quantizers = recipe, mode, num_quantizers
        self.roles = list(roles) if roles is not None else None
        self.device = device if device is not None else torch.get_default_device()

    @staticmethod
    def create(
        recipe: Recipe, *, mode: str, num_quantizers: int, roles: Optional[Sequence[QuantizerRole]] = None,
        device: Optional[torch.device] = None,
    ) -> "RecipeState":
        for recipe_type, state_type in _STATE_TYPES:
            if isinstance(recipe, recipe_type):
                return state_type(recipe, mode=mode, num_quantizers=num_quantizers, roles=roles, device=device)
        raise TypeError(f"no recipe state for {type(recipe).__name__}")

    def slot_role(self, index: int) -> QuantizerRole:
        """The role given for slot ``index``, or an empty role when none was (TE's ``_slot_role``)."""
        role = self.roles[index] if self.roles is not None else None
        return role if role is not None else QuantizerRole()

    def tensor_type(self, index: int) -> str:
        """What slot ``index`` quantizes, one of :data:`KNOWN_TENSOR_TYPES` (TE's ``_slot_tensor_type``).

        The role's ``tensor_type`` when it is a known one; otherwise the slot's position decides:
        forward slots run ``input, weight, output``, backward slots ``grad_output, grad_input``.
        Recipes choose per-slot settings by this type, never by the mode alone.
        """
        role = self.slot_role(index)
        if role.tensor_type in KNOWN_TENSOR_TYPES:
            return role.tensor_type
        layout = POSITIONAL_TENSOR_TYPES[self.mode]
        return layout[index % len(layout)]

    def make_quantizers(self) -> list[Quantizer]:
        return [self.make_quantizer(i) for i in range(self.num_quantizers)]

    def make_quantizer(self, index: int) -> Quantizer:
        raise NotImplementedError

    # Checkpoints: stateless recipes save nothing.
    def state_dict(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if state:
            raise ValueError(f"{type(self.recipe).__name__} recipe state has nothing to load, got {sorted(state)}")


class DelayedScalingRecipeState(RecipeState):
    """``scale`` (n,) and ``amax_history`` (L, n), fp32; each quantizer's amax is ``amax_history[0, i]``."""

    def __init__(self, recipe: DelayedScaling, **kwargs: Any) -> None:
        super().__init__(recipe, **kwargs)
        n, length = self.num_quantizers, recipe.amax_history_len
        # Ordinary tensors even when first touched under inference_mode: training
        # later updates them in place, which an inference tensor forbids.
        with torch.inference_mode(False):
            self.scale = torch.ones(n, dtype=torch.float32, device=self.device)
            self.amax_history = torch.zeros(length, n, dtype=torch.float32, device=self.device)

    @property
    def fmax(self) -> float:
        """The format's largest value for this mode, from the current recipe (its format may change)."""
        fmt = self.recipe.fp8_format.value
        return fmt.max_fwd if self.mode == "forward" else fmt.max_bwd

    def make_quantizer(self, index: int) -> Quantizer:
        """A quantizer on views of slot ``index``: its casts record into ``amax_history[0, index]`` and read
        ``scale[index]``, which the update writes. It keeps the link when copied or pickled (``recipe_slot``)."""
        quantizer = Float8Quantizer(
            self.scale[index : index + 1], self.amax_history[0, index : index + 1], fp8_dtype_for(self.recipe, self.mode)
        )
        quantizer.recipe_slot = (self, index)
        return quantizer

    def resize_history(self, length: int) -> None:
        """Truncate, or zero-pad at the end of dim 0, to ``length`` rows; the op then rebuilds its quantizers."""
        old = self.amax_history
        with torch.inference_mode(False):
            new = torch.zeros(length, old.shape[1], dtype=old.dtype, device=old.device)
        rows = min(length, old.shape[0])
        new[:rows] = old[:rows]
        self.amax_history = new

    def update_scales(self, reduction_group: Any = None) -> None:
        """One delayed-scaling update (``docs/recipes/delayed-scaling.md#the-arithmetic``), in place: the backend's
        ``delayed_scaling_update`` kernel (its docstring in ``refops.kernels.KernelBackend`` states the
        update per slot) with ``amax = a0 = amax_history[0]`` and ``numerator = fmax * 2^-margin``.

        ``a0`` is all-reduced (MAX) over ``reduction_group`` when the recipe's ``reduce_amax`` asks and a
        process group of more than one rank exists; None is the default (world) group, as in TE, so ranks
        of one data-parallel model keep equal scales. "max" skips NaN entries as TE's kernel does
        (``fmaxf``): a NaN amax costs one step's information, not the scale. Callable algorithms (or a
        ``scaling_factor_compute_algo``) take TE's unfused path: always roll, ``amax = algo(history)``.
        """
        recipe: DelayedScaling = self.recipe
        history = self.amax_history
        reduce = recipe.reduce_amax and _group_size(reduction_group) > 1
        unfused = callable(recipe.amax_compute_algo) or recipe.scaling_factor_compute_algo is not None
        # A copy only where history's row 0 may change before a0 is read (the all-reduce, the unfused path's
        # roll); the update kernel reads each slot's a0 before it writes that slot.
        a0 = history[0].clone() if reduce or unfused else history[0]
        if reduce:
            torch.distributed.all_reduce(a0, op=torch.distributed.ReduceOp.MAX, group=reduction_group)
        if unfused:
            self._update_unfused(a0)
            return
        # One kernel of the backend (the reference: the torch code this method ran before; the fast path: one
        # launch instead of ~20 tiny ones), reading a0 before it writes history's row 0.
        algorithm = "max" if recipe.amax_compute_algo == "max" else "most_recent"
        current_backend().delayed_scaling_update(history, self.scale, a0, numerator=self._numerator(),
                                                 algorithm=algorithm)

    def _numerator(self) -> float:
        return self.fmax * 2.0 ** (-self.recipe.margin)

    def _scale_from_amax(self, amax: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        return scale_from_amax(amax, old, self._numerator())

    def _update_unfused(self, a0: torch.Tensor) -> None:
        recipe: DelayedScaling = self.recipe
        history = self.amax_history
        history[0] = a0
        if callable(recipe.amax_compute_algo):
            amax = recipe.amax_compute_algo(history)
        elif recipe.amax_compute_algo == "max":
            amax = _nan_skipping_max(history)
        else:
            amax = history[0]
        if recipe.scaling_factor_compute_algo is not None:
            scale = recipe.scaling_factor_compute_algo(amax, self.scale, self.fmax, recipe)
        else:
            scale = self._scale_from_amax(amax, self.scale)
        history.copy_(torch.roll(history, -1, dims=0))
        history[0].zero_()
        self.scale.copy_(scale)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"scale": self.scale, "amax_history": self.amax_history}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name in ("scale", "amax_history"):
            if name not in state:
                raise ValueError(f"delayed-scaling state is missing {name!r}")
        if state["amax_history"].shape != self.amax_history.shape:
            self.amax_history = torch.zeros_like(state["amax_history"], device=self.device)
        self.scale.copy_(state["scale"])
        self.amax_history.copy_(state["amax_history"])


def _group_size(group: Any) -> int:
    """Ranks in ``group`` (None: the default group); 1 without an initialized process group."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


_nan_skipping_max = nan_skipping_max  # its former name here


class Float8CurrentScalingRecipeState(RecipeState):
    """One current-scaling quantizer per slot; its options come from the slot's tensor type."""

    def make_quantizer(self, index: int) -> Quantizer:
        recipe: Float8CurrentScaling = self.recipe
        kind = self.tensor_type(index)
        if kind == "weight":
            qparams = recipe.fp8_quant_fwd_weight
        elif kind in GRADIENT_TENSOR_TYPES:
            qparams = recipe.fp8_quant_bwd_grad
        else:
            qparams = recipe.fp8_quant_fwd_inp
        return Float8CurrentScalingQuantizer(
            fp8_dtype_for(recipe, self.mode),
            self.device,
            force_pow_2_scales=qparams.power_2_scale,
            amax_epsilon=qparams.amax_epsilon,
        )


class MXFP8BlockScalingRecipeState(RecipeState):
    """2D (32x32) quantization, under ``enable_2d_quantization``, only for forward slots whose *role* says a
    linear's weight (module type "linear" or "grouped_linear"), as in TE; a role-less slot is never 2D."""

    def make_quantizer(self, index: int) -> Quantizer:
        recipe: MXFP8BlockScaling = self.recipe
        role = self.slot_role(index)
        linear_weight = role.module_type in ("linear", "grouped_linear") and role.tensor_type == "weight"
        two_d = recipe.enable_2d_quantization and self.mode == "forward" and linear_weight
        return MXFP8Quantizer(fp8_dtype_for(recipe, self.mode), with_2d_quantization=two_d)


class Float8BlockScalingRecipeState(RecipeState):
    """Per tensor type: weights take the weight options (and E4M3), gradients the gradient options (and the
    backward format), everything else the input options."""

    def make_quantizer(self, index: int) -> Quantizer:
        recipe: Float8BlockScaling = self.recipe
        kind = self.tensor_type(index)
        if kind == "weight":
            dim, qparams, mode = recipe.w_block_scaling_dim, recipe.fp8_quant_fwd_weight, "forward"
        elif kind in GRADIENT_TENSOR_TYPES:
            dim, qparams, mode = recipe.grad_block_scaling_dim, recipe.fp8_quant_bwd_grad, "backward"
        else:
            dim, qparams, mode = recipe.x_block_scaling_dim, recipe.fp8_quant_fwd_inp, "forward"
        return Float8BlockQuantizer(
            fp8_dtype_for(recipe, mode),
            rowwise=True,
            columnwise=True,
            amax_epsilon=qparams.amax_epsilon,
            force_pow_2_scales=qparams.power_2_scale,
            block_scaling_dim=dim,
        )


class NVFP4BlockScalingRecipeState(RecipeState):
    """Per tensor type (``docs/recipes/nvfp4.md#per-role-and-the-random-hadamard-transform``): inputs get
    the RHT on their column-wise copy, weights 16x16 tiles, gradients stochastic rounding (and the RHT
    column-wise); 4over6 applies to the non-gradient types the recipe names; row scaling to forward slots
    that are not weights."""

    def make_quantizer(self, index: int) -> Quantizer:
        recipe: NVFP4BlockScaling = self.recipe
        kind = self.tensor_type(index)
        if kind in GRADIENT_TENSOR_TYPES:
            qparams, scope = recipe.fp4_quant_bwd_grad, None
        elif kind == "weight":
            qparams, scope = recipe.fp4_quant_fwd_weight, "weights"
        else:
            qparams, scope = recipe.fp4_quant_fwd_inp, "activations"
        four_over_six = scope is not None and recipe.nvfp4_4over6 in (scope, "all")
        use_256 = four_over_six and recipe.nvfp4_4over6_e4m3_use_256 in (scope, "all")
        return NVFP4Quantizer(
            with_rht=qparams.random_hadamard_transform,
            with_post_rht_amax=qparams.random_hadamard_transform,
            with_2d_quantization=qparams.fp4_2d_quantization,
            stochastic_rounding=qparams.stochastic_rounding,
            row_scaled_nvfp4=recipe.row_scaled_activation and self.mode == "forward" and kind != "weight",
            nvfp4_use_4over6=four_over_six,
            nvfp4_e4m3_max=256 if use_256 else 448,
            nvfp4_4over6_err_mode=recipe.nvfp4_4over6_err_mode,
        )


_STATE_TYPES: list[tuple[type, type]] = [
    (DelayedScaling, DelayedScalingRecipeState),
    (Float8CurrentScaling, Float8CurrentScalingRecipeState),
    (MXFP8BlockScaling, MXFP8BlockScalingRecipeState),
    (Float8BlockScaling, Float8BlockScalingRecipeState),
    (NVFP4BlockScaling, NVFP4BlockScalingRecipeState),
]
