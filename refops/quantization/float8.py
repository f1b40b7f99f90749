"""Per-tensor FP8: ``Float8Tensor`` and its two quantizers.

* :class:`Float8Quantizer` (delayed scaling, ``docs/recipes/delayed-scaling.md``): casts with the fp32 ``scale`` it is
  given (a view of the recipe state), writes ``scale_inv = RN(1/scale)`` into the
  tensor, and max-accumulates the pre-scale amax into ``amax`` at every cast.
* :class:`Float8CurrentScalingQuantizer` (``docs/recipes/current-scaling.md``): ``A = amax(x)``
  (optionally all-reduced), ``s = compute_scale_from_amax(A, fmax, pow2, eps, value_for_inf=FLT_MAX)``,
  then the same cast.

``q = Q_F(RN(x * s))``. The column-wise copy is the transpose of the same bytes
(Hopper layout, shape ``(K, *lead)``) and shares the one ``scale_inv``.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch

from ..formats import FLT_MAX
from ..kernels import current_backend
from ..kernels.reference.activations import is_gated
from ..layouts import columnwise_layout, columnwise_shape, rowwise_layout
from .quantized_tensor import QuantizedTensor
from .quantizer import DType, Quantizer, canonicalize_fp8_dtype, torch_fp8_dtype

__all__ = ["Float8Tensor", "Float8Quantizer", "Float8CurrentScalingQuantizer"]

_FMAX = {DType.kFloat8E4M3: 448.0, DType.kFloat8E5M2: 57344.0}


class Float8Tensor(QuantizedTensor):
    """FP8 data with one fp32 ``scale_inv`` for the whole tensor.

    TE's constructor: ``Float8Tensor(shape, dtype, *, data, fp8_scale_inv, fp8_dtype,
    data_transpose=None, quantizer=None, requires_grad=False)``; ``_data`` (row-wise
    uint8, nominal shape), ``_transpose`` (column-wise uint8, ``(K, *lead)``),
    ``_scale_inv`` (fp32, (1,)).
    """

    _ROWWISE = ("_data",)
    _COLUMNWISE = ("_transpose",)
    _SHARED = ("_scale_inv",)
    _CTOR_TENSORS = {"data": "_data", "data_transpose": "_transpose", "fp8_scale_inv": "_scale_inv"}
    _CTOR_META = {"fp8_dtype": ("_fp8_dtype", DType.kFloat8E4M3)}
    _GEMM_FORMAT = "float8"

    def _gemm_arrays(self, usage: str, rows: int, last: int) -> dict[str, Any]:
        # The bytes with the contracted dim last: row-wise (rows, last) or the transposed copy (last, rows).
        if usage == "rowwise":
            data = self._data.reshape(rows, last)
        else:
            data = self._transpose.reshape(last, rows)
        return {"data": data, "scale_inv": self._scale_inv, "fp8_dtype": torch_fp8_dtype(self._fp8_dtype)}

    def _validate(self) -> None:
        self._fp8_dtype = canonicalize_fp8_dtype(self._fp8_dtype)
        if self._scale_inv is None:
            raise ValueError("Float8Tensor needs fp8_scale_inv")

    def _dequantize_usage(self, usage: str, dtype: torch.dtype) -> torch.Tensor:
        data = self._data if usage == "rowwise" else self._transpose
        values = current_backend().dequantize_float8(
            data, self._scale_inv, fp8_dtype=torch_fp8_dtype(self._fp8_dtype), out_dtype=dtype
        )
        if usage == "columnwise" and self.dim() > 0:
            return rowwise_layout(values, self.shape)
        return values.reshape(self.shape).contiguous()  # a 0-D tensor dequantizes to shape (), as in TE

    def _derive_usage(self, usage: str) -> None:
        # Both copies hold the same bytes: deriving one is a transpose, not a quantization.
        if usage == "columnwise":
            self._transpose = columnwise_layout(self._data)
        else:
            self._data = rowwise_layout(self._transpose, self.shape)


class _PerTensorQuantizer(Quantizer):
    """What both per-tensor quantizers share: the FP8 dtype and the cast into a Float8Tensor."""

    tensor_class = Float8Tensor

    def __init__(self, fp8_dtype: Any, *, rowwise: bool, columnwise: bool) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.dtype = canonicalize_fp8_dtype(fp8_dtype)

    @property
    def fmax(self) -> float:
        """Largest finite value of the FP8 format."""
        return _FMAX[self.dtype]

    def _tensor_meta(self) -> dict[str, Any]:
        return {"fp8_dtype": self.dtype}

    def _cast(self, tensor: torch.Tensor, scale: torch.Tensor, *, rowwise: bool, columnwise: bool,
              amax_accumulator: Optional[torch.Tensor] = None) -> dict[str, Any]:
        data, scale_inv, transpose, _ = current_backend().quantize_float8(
            tensor,
            scale if scale.device == tensor.device else scale.to(tensor.device),
            fp8_dtype=torch_fp8_dtype(self.dtype),
            rowwise=rowwise,
            columnwise=columnwise,
            amax_accumulator=amax_accumulator,
        )
        return self._cast_arrays(data, scale_inv, transpose, tensor.dim())

    def _cast_arrays(self, data: Optional[torch.Tensor], scale_inv: torch.Tensor, transpose: Optional[torch.Tensor],
                     dim: int) -> dict[str, Any]:
        """Float8Tensor constructor arguments from a cast kernel's arrays, for a tensor of ``dim`` dims."""
        if dim == 0:  # the kernel works on (1,); a 0-D tensor's bytes keep its shape (), as TE's do
            data = None if data is None else data.reshape(())
            transpose = None if transpose is None else transpose.reshape(())
        return {"data": data, "data_transpose": transpose, "fp8_scale_inv": scale_inv, "fp8_dtype": self.dtype}

    def _fused_inputs(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The plain compute-dtype inputs of a fused activation + quantize kernel (checked as a cast's input)."""
        self._check_some_usage()
        return tuple(self._high_precision_input(t).detach().contiguous() for t in tensors)

    def make_empty(
        self,
        shape: Iterable[int],
        *,
        dtype: torch.dtype = torch.float32,
        device: Optional[torch.device | str] = None,
        requires_grad: bool = False,
    ) -> Float8Tensor:
        shape = torch.Size(shape)
        device = torch.device("cpu") if device is None else torch.device(device)
        data = torch.empty(shape, dtype=torch.uint8, device=device) if self.rowwise_usage else None
        transpose = None
        if self.columnwise_usage:
            transpose = torch.empty(columnwise_shape(shape), dtype=torch.uint8, device=device)
        return Float8Tensor(
            shape, dtype, device=device, requires_grad=requires_grad, quantizer=self, data=data,
            data_transpose=transpose, fp8_scale_inv=torch.ones(1, dtype=torch.float32, device=device),
            fp8_dtype=self.dtype,
        )

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "fp8_dtype": int(self.dtype)}


class Float8Quantizer(_PerTensorQuantizer):
    """Delayed scaling: cast with the given ``scale``; record ``amax`` (TE's signature)."""

    def __init__(self, scale: torch.Tensor, amax: torch.Tensor, fp8_dtype: Any, *,
                 rowwise: bool = True, columnwise: bool = True) -> None:
        super().__init__(fp8_dtype, rowwise=rowwise, columnwise=columnwise)
        self.scale = scale
        self.amax = amax

    #: ``(recipe state, slot)`` when ``scale`` and ``amax`` are that delayed-scaling state's views (set by
    #: ``DelayedScalingRecipeState.make_quantizer``); None for a quantizer that owns its tensors.
    recipe_slot: Optional[tuple[Any, int]] = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickled, deep-copied or ``torch.save``-d while linked to its recipe state: the link, not the views.

        Plain pickle writes each view as a tensor of its own, so the copy's quantizer would record amaxes the
        copy's state never sees and keep a scale its updates never write; ``__setstate__`` takes the views of
        the copied state again (``docs/api/refops.md#copies-and-pickling``).
        """
        state = self.__dict__.copy()
        if self._linked_views() is not None:
            del state["scale"], state["amax"]
        else:
            state.pop("recipe_slot", None)  # stale (the state's tensors were replaced): a quantizer of its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if "scale" not in state:
            self.scale, self.amax = self._slot_views()

    def _slot_views(self) -> tuple[torch.Tensor, torch.Tensor]:
        recipe_state, index = self.recipe_slot
        return recipe_state.scale[index : index + 1], recipe_state.amax_history[0, index : index + 1]

    def _linked_views(self) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """The state's views when ``scale`` and ``amax`` are still them (same storage, same place), else None."""
        if self.recipe_slot is None:
            return None
        views = self._slot_views()
        for mine, theirs in zip((self.scale, self.amax), views):
            if mine.untyped_storage().data_ptr() != theirs.untyped_storage().data_ptr() or (
                    mine.storage_offset(), mine.shape, mine.stride()) != (
                    theirs.storage_offset(), theirs.shape, theirs.stride()):
                return None
        return views

    dbias_from_unrounded = True

    def _quantize_arrays(self, tensor: torch.Tensor, *, rowwise: bool, columnwise: bool) -> dict[str, Any]:
        return self._cast(tensor, self.scale, rowwise=rowwise, columnwise=columnwise, amax_accumulator=self.amax)

    def _quantize_unrounded(self, values: torch.Tensor, *, dtype: torch.dtype) -> Float8Tensor:
        """Delayed scaling fuses fully: ``values`` go from fp32 to FP8 in one rounding, and the amax recorded
        for the next scale update is the fp32 values' (TE's ``FULLY_FUSED`` activation path)."""
        return self._quantize_new(self._high_precision_input(values).detach(), nominal_dtype=dtype)

    # The fused kernels of the seam: v (the activation's fp32 result) cast to FP8 in one rounding, its amax
    # recorded, in one pass; the seam's reference is quantize_unrounded(v) as above, bit for bit.
    def _fused_cast_args(self, x: torch.Tensor) -> dict[str, Any]:
        return {"scale": self.scale if self.scale.device == x.device else self.scale.to(x.device),
                "fp8_dtype": torch_fp8_dtype(self.dtype), "rowwise": self.rowwise_usage,
                "columnwise": self.columnwise_usage, "amax_accumulator": self.amax}

    def _fused_tensor(self, cast: tuple, shape: torch.Size, dtype: torch.dtype, device: torch.device) -> Float8Tensor:
        data, scale_inv, transpose = cast[0], cast[1], cast[2]
        return Float8Tensor(shape, dtype, device=device, quantizer=self,
                            **self._cast_arrays(data, scale_inv, transpose, len(shape)))

    def quantize_activation(self, x: torch.Tensor, activation: str, *, dtype: torch.dtype,
                            **params: Any) -> Float8Tensor:
        """One pass (``activation_cast_float8``): ``act(x)`` in fp32, its amax recorded, one rounding to FP8."""
        (x,) = self._fused_inputs(x)
        cast = current_backend().activation_cast_float8(x, activation, **self._fused_cast_args(x), **params)
        shape = (*x.shape[:-1], x.shape[-1] // 2) if is_gated(activation) else x.shape
        return self._fused_tensor(cast, torch.Size(shape), dtype, x.device)

    def quantize_activation_backward(self, grad_output: torch.Tensor, x: torch.Tensor, activation: str, *,
                                     dtype: torch.dtype, **params: Any) -> Float8Tensor:
        """One pass (``activation_backward_cast_float8``): ``dy * act'(x)`` in fp32 cast to FP8 once."""
        dy, x = self._fused_inputs(grad_output, x)
        cast = current_backend().activation_backward_cast_float8(dy, x, activation, **self._fused_cast_args(x),
                                                                 **params)
        return self._fused_tensor(cast, x.shape, dtype, x.device)

    def quantize_activation_backward_dbias(self, grad_output: torch.Tensor, x: torch.Tensor, activation: str, *,
                                           dtype: torch.dtype, **params: Any) -> tuple[Float8Tensor, torch.Tensor]:
        """One pass (``activation_backward_dbias_cast_float8``): the cast above and the bias grad summed from the
        unrounded fp32 values (``dbias_from_unrounded``)."""
        dy, x = self._fused_inputs(grad_output, x)
        cast = current_backend().activation_backward_dbias_cast_float8(
            dy, x, activation, out_dtype=dtype, **self._fused_cast_args(x), **params)
        return self._fused_tensor(cast, x.shape, dtype, x.device), cast[4]

    def calibrate(self, tensor: torch.Tensor) -> None:
        """Record ``amax(tensor)`` as a cast would, without casting."""
        self.amax.copy_(torch.fmax(self.amax, current_backend().amax(tensor).to(self.amax.device)))

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        return {"scale": self.scale, "amax": self.amax}

    @classmethod
    def _from_config(cls, config: dict[str, Any], tensors: dict[str, torch.Tensor], device: torch.device):
        return cls(tensors["scale"].to(device), tensors["amax"].to(device), DType(config.pop("fp8_dtype")), **config)


class Float8CurrentScalingQuantizer(_PerTensorQuantizer):
    """Current scaling: the scale comes from the tensor's own amax at every cast (TE's signature).

    ``scale`` and ``amax`` hold the last cast's values: each cast binds them to new (1,) fp32 tensors,
    the ones it computed, so a tensor taken from them earlier keeps the values it had.
    With ``with_amax_reduction`` the amax is all-reduced (MAX) over
    ``amax_reduction_group`` before the scale is computed.
    """

    def __init__(
        self,
        fp8_dtype: Any,
        device: Optional[torch.device | str] = None,
        *,
        rowwise: bool = True,
        columnwise: bool = True,
        with_amax_reduction: bool = False,
        amax_reduction_group: Any = None,
        force_pow_2_scales: bool = False,
        amax_epsilon: float = 0.0,
    ) -> None:
        super().__init__(fp8_dtype, rowwise=rowwise, columnwise=columnwise)
        device = torch.device("cpu") if device is None else torch.device(device)
        self.scale = torch.ones(1, dtype=torch.float32, device=device)
        self.amax = torch.zeros(1, dtype=torch.float32, device=device)
        self.with_amax_reduction = with_amax_reduction
        self.amax_reduction_group = amax_reduction_group
        self.force_pow_2_scales = bool(force_pow_2_scales)
        self.amax_epsilon = float(amax_epsilon)

    def _quantize_arrays(self, tensor: torch.Tensor, *, rowwise: bool, columnwise: bool,
                         amax: Optional[torch.Tensor] = None) -> dict[str, Any]:
        """``amax``: the amax to scale by, taken elsewhere (default: ``tensor``'s own)."""
        backend = current_backend()
        amax = backend.amax(tensor) if amax is None else amax
        if self.with_amax_reduction and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(amax, op=torch.distributed.ReduceOp.MAX, group=self.amax_reduction_group)
        scale = backend.compute_scale_from_amax(
            amax,
            fmax=self.fmax,
            force_pow_2_scales=self.force_pow_2_scales,
            amax_epsilon=self.amax_epsilon,
            value_for_inf=FLT_MAX,
        )
        # Rebound, not copied into: two kernels fewer per cast. Nothing holds the old buffers expecting this
        # cast's values (TE's quantizer has no such buffers at all; a shallow copy() shares them only until
        # its first cast, as a copy on another device always did).
        self.amax, self.scale = amax, scale
        return self._cast(tensor, scale, rowwise=rowwise, columnwise=columnwise)

    def _quantize_unrounded(self, values: torch.Tensor, *, dtype: torch.dtype) -> Float8Tensor:
        """Current scaling takes the amax of the fp32 ``values`` and casts the values rounded to ``dtype``
        with the scale from it (TE's ``FUSED_ACTIVATION_AMAX_FP8``: the activation kernel writes the rounded
        buffer and the unrounded amax in one pass, then the buffer is quantized)."""
        values = self._high_precision_input(values).detach()
        return self._quantize_new(values.to(dtype), amax=current_backend().amax(values))

    # The seam's first pass: the rounded output and the amax of the unrounded values together (TE writes both from
    # its activation kernel); the cast with the scale from that amax is the ordinary one.
    def quantize_activation(self, x: torch.Tensor, activation: str, *, dtype: torch.dtype,
                            **params: Any) -> Float8Tensor:
        """``activation_amax``: ``RN_dtype(act(x))`` and the fp32 amax in one pass, then the cast."""
        (x,) = self._fused_inputs(x)
        y, amax = current_backend().activation_amax(x, activation, out_dtype=dtype, **params)
        return self._quantize_new(y, amax=amax)

    def quantize_activation_backward(self, grad_output: torch.Tensor, x: torch.Tensor, activation: str, *,
                                     dtype: torch.dtype, **params: Any) -> Float8Tensor:
        """``activation_backward_amax``, then the cast."""
        dy, x = self._fused_inputs(grad_output, x)
        dx, amax = current_backend().activation_backward_amax(dy, x, activation, out_dtype=dtype, **params)
        return self._quantize_new(dx, amax=amax)

    def quantize_activation_backward_dbias(self, grad_output: torch.Tensor, x: torch.Tensor, activation: str, *,
                                           dtype: torch.dtype, **params: Any) -> tuple[Float8Tensor, torch.Tensor]:
        """``activation_backward_dbias_amax`` (the bias grad from the rounded values), then the cast."""
        dy, x = self._fused_inputs(grad_output, x)
        dx, amax, dbias = current_backend().activation_backward_dbias_amax(dy, x, activation, out_dtype=dtype,
                                                                           **params)
        return self._quantize_new(dx, amax=amax), dbias

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "force_pow_2_scales": self.force_pow_2_scales, "amax_epsilon": self.amax_epsilon}

    @classmethod
    def _from_config(cls, config: dict[str, Any], tensors: dict[str, torch.Tensor], device: torch.device):
        return cls(DType(config.pop("fp8_dtype")), device, **config)
