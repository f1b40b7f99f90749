"""``Quantizer``: the builder of quantized tensors, plus ``DType`` and ``QuantizerRole``.

A quantizer holds a scheme's options and turns a high-precision tensor into a
:class:`~refops.quantization.quantized_tensor.QuantizedTensor` with the usages
it is asked for:

* **row-wise** usage: blocked along the last dim (what ``y = x W^T`` reads);
* **column-wise** usage: blocked along the leading dims (what ``dW = dy^T x``
  and ``dx = dy W`` read).

The arithmetic is not here: each scheme calls ``refops.kernels.current_backend()``.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import enum
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, Optional

import torch

from ..kernels import current_backend
from .dtensor import refuse_dtensor_input

if TYPE_CHECKING:
    from .quantized_tensor import QuantizedTensor

__all__ = ["DType", "QuantizerRole", "Quantizer", "canonicalize_fp8_dtype", "torch_fp8_dtype"]


class DType(enum.IntEnum):
    """TE's ``transformer_engine_torch.DType`` (same members and values)."""

    kByte = 0
    kInt16 = 1
    kInt32 = 2
    kInt64 = 3
    kFloat32 = 4
    kFloat16 = 5
    kBFloat16 = 6
    kFloat8E4M3 = 7
    kFloat8E5M2 = 8
    kFloat8E8M0 = 9
    kFloat4E2M1 = 10


_FP8_TORCH_DTYPES = {DType.kFloat8E4M3: torch.float8_e4m3fn, DType.kFloat8E5M2: torch.float8_e5m2}


def canonicalize_fp8_dtype(fp8_dtype: Any) -> DType:
    """``DType.kFloat8E4M3`` / ``kFloat8E5M2`` from a DType or the matching torch dtype."""
    if type(fp8_dtype) is DType and fp8_dtype in _FP8_TORCH_DTYPES:  # the common case, once per cast
        return fp8_dtype
    for te_dtype, torch_dtype in _FP8_TORCH_DTYPES.items():
        if fp8_dtype == te_dtype or fp8_dtype is torch_dtype:
            return te_dtype
    raise ValueError(
        f"fp8_dtype must be DType.kFloat8E4M3 or DType.kFloat8E5M2 (or torch.float8_e4m3fn / "
        f"torch.float8_e5m2), got {fp8_dtype!r}"
    )


def torch_fp8_dtype(fp8_dtype: DType) -> torch.dtype:
    """The torch dtype of an FP8 ``DType`` (what the kernels take)."""
    return _FP8_TORCH_DTYPES[canonicalize_fp8_dtype(fp8_dtype)]


@dataclasses.dataclass(frozen=True)
class QuantizerRole:
    """What a quantizer is for, e.g. ``QuantizerRole("linear", "weight", "fc1")``; empty = unknown."""

    module_type: str = ""
    tensor_type: str = ""
    name: str = ""


_SUPPORTED_INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: Quantizer classes by name, for rebuilding tensors from plain tensors + metadata.
QUANTIZER_CLASSES: dict[str, type["Quantizer"]] = {}


class Quantizer(abc.ABC):
    """Builder of quantized tensors (TE's ``Quantizer`` interface).

    ``rowwise_usage`` / ``columnwise_usage`` say which copies to produce;
    ``internal`` only means "do not record autograd" here (TE returns lighter
    storage objects instead).
    """

    #: The QuantizedTensor subclass this quantizer makes.
    tensor_class: ClassVar[type]
    #: Whether TE's fused ``dact + dbias + quantize`` kernel, quantizing through this scheme, sums the bias
    #: grad from the unrounded fp32 values (delayed scaling, MXFP8) instead of from the values rounded to the
    #: compute dtype (``docs/recipes/fused-activations.md``).
    dbias_from_unrounded: ClassVar[bool] = False
    #: What it quantizes, e.g. ``"BasicLinear (forward quantizer 1: weight)"``; set by the op that owns
    #: it so that a refusal (block size, dtype) names the op and the tensor. None: unnamed.
    label: Optional[str] = None

    def __init__(self, *, rowwise: bool, columnwise: bool) -> None:
        self.rowwise_usage = bool(rowwise)
        self.columnwise_usage = bool(columnwise)
        self.internal = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        QUANTIZER_CLASSES[cls.__name__] = cls

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(rowwise_usage={self.rowwise_usage}, "
            f"columnwise_usage={self.columnwise_usage}, internal={self.internal})"
        )

    # ---------------------------------------------------------------- usage
    def set_usage(self, *, rowwise: Optional[bool] = None, columnwise: Optional[bool] = None) -> None:
        """Change the usages future quantizations produce (None keeps the current one)."""
        if rowwise is not None:
            self.rowwise_usage = bool(rowwise)
        if columnwise is not None:
            self.columnwise_usage = bool(columnwise)

    def copy(self) -> "Quantizer":
        """Shallow copy: state tensors (delayed scaling's scale/amax) stay shared."""
        return copy.copy(self)

    def is_quantizable(self, inp: torch.Tensor) -> bool:
        """Whether ``inp`` supports a quantized all-gather (TE's name and meaning); schemes with shape
        requirements (MXFP8, NVFP4) answer for themselves."""
        return True

    def calibrate(self, tensor: torch.Tensor) -> None:
        """Update quantizer state as a cast would, without casting (stateless schemes: nothing)."""

    # ------------------------------------------------------------- quantize
    def __call__(self, tensor: torch.Tensor) -> "QuantizedTensor":
        return self.quantize(tensor)

    def quantize(self, tensor: torch.Tensor, *, out: Optional["QuantizedTensor"] = None) -> "QuantizedTensor":
        """A new quantized tensor (or ``out`` updated in place).

        Autograd sees a straight-through identity: the gradient w.r.t. ``tensor``
        is the gradient w.r.t. the quantized tensor, in high precision.
        """
        if out is not None:
            return self.update_quantized(tensor, out)
        tensor = self._high_precision_input(tensor)
        if not self.internal and torch.is_grad_enabled() and tensor.requires_grad:
            return _QuantizeFunc.apply(tensor, self)
        return self._quantize_new(tensor.detach())

    def update_quantized(
        self,
        src: torch.Tensor,
        dst: "QuantizedTensor",
        *,
        noop_flag: Optional[torch.Tensor] = None,
    ) -> "QuantizedTensor":
        """Re-quantize ``src`` into ``dst`` in place (same object, same buffers, ``dst``'s usages).

        ``src`` is broadcast to ``dst``'s shape and moved to its device. A nonzero
        ``noop_flag`` skips the update.
        """
        if not isinstance(dst, self.tensor_class):
            raise TypeError(f"{type(self).__name__} can only update {self.tensor_class.__name__}, got {type(dst).__name__}")
        if noop_flag is not None and bool(noop_flag.reshape(-1)[0].item()):
            return dst
        src = self._high_precision_input(src).detach().to(device=dst.device).expand(dst.shape)
        fresh = self._quantize_arrays_named(
            src.contiguous(), rowwise=dst.has_usage("rowwise"), columnwise=dst.has_usage("columnwise")
        )
        dst._overwrite_arrays(fresh)
        return dst

    def _high_precision_input(self, tensor: torch.Tensor) -> torch.Tensor:
        refuse_dtensor_input(self, tensor)  # refops quantizes plain tensors (docs/distributed.md)
        if _is_quantized_tensor(tensor):
            tensor = tensor.dequantize()
        if not isinstance(tensor, torch.Tensor) or tensor.dtype not in _SUPPORTED_INPUT_DTYPES:
            got = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise TypeError(f"{type(self).__name__}: can only quantize fp32, fp16 or bf16 tensors, got {got}")
        return tensor

    def _quantize_new(self, tensor: torch.Tensor, *, nominal_dtype: Optional[torch.dtype] = None,
                      **options: Any) -> "QuantizedTensor":
        """A quantized tensor of ``tensor``; its nominal dtype is ``nominal_dtype`` (default: ``tensor``'s).
        ``options`` go to the scheme's :meth:`_quantize_arrays` (an amax computed elsewhere, for instance)."""
        self._check_some_usage()
        arrays = self._quantize_arrays_named(
            tensor.contiguous(), rowwise=self.rowwise_usage, columnwise=self.columnwise_usage, **options
        )
        kwargs = {**self._tensor_meta(), **arrays}
        dtype = tensor.dtype if nominal_dtype is None else nominal_dtype
        return self.tensor_class(tensor.shape, dtype, device=tensor.device, quantizer=self, **kwargs)

    def _check_some_usage(self) -> None:
        if not (self.rowwise_usage or self.columnwise_usage):
            raise ValueError(f"{type(self).__name__}: neither row-wise nor column-wise usage is enabled")

    def quantize_unrounded(self, values: torch.Tensor, *, dtype: torch.dtype) -> "QuantizedTensor":
        """Quantize the fp32 result of an element-wise kernel that has not rounded it yet, as TransformerEngine's
        fused activation + quantize kernels do for this scheme (``docs/recipes/fused-activations.md``).

        ``values`` are an activation's output (or its backward's ``dy * act'(x)``) in fp32, before any rounding
        to the compute dtype ``dtype``, which becomes the result's nominal dtype. This default is TE's unfused
        path (FP8 block scaling, MXFP8, whose fused kernel rounds to ``dtype`` before it takes any amax): round
        to ``dtype``, then quantize, exactly ``self(values.to(dtype))``. Schemes whose fused kernel sees the
        fp32 values (delayed and current scaling, NVFP4's global amax) override :meth:`_quantize_unrounded`.
        """
        return self._quantize_unrounded(values, dtype=dtype)

    def _quantize_unrounded(self, values: torch.Tensor, *, dtype: torch.dtype) -> "QuantizedTensor":
        """The scheme's rule of :meth:`quantize_unrounded` (one public entry, so that a recorder of quantizer
        calls, such as the oracle's, sees every call)."""
        return self.quantize(values.to(dtype))

    # ------------------------------------------------ fused activation + quantize
    # What an activation op calls when this quantizer waits for its output (or input grad): TE's activation
    # kernels take the quantizer (``tex.gelu(x, quantizer)``), so the scheme decides what one pass computes.
    # The defaults are the composition every scheme's rule is stated as, the activation's fp32 result handed to
    # :meth:`quantize_unrounded`; the per-tensor FP8 quantizers override them with the fused kernels of the seam
    # (``refops.kernels.fused_activation_interface``), whose reference is that same composition, bit for bit.
    def quantize_activation(self, x: torch.Tensor, activation: str, *, dtype: torch.dtype,
                            **params: Any) -> "QuantizedTensor":
        """``act(x)`` (a kernel activation name and its ``params``) computed in fp32 from ``x`` and quantized by
        this scheme's fused rule: exactly ``self.quantize_unrounded(act_fp32(x), dtype=dtype)``."""
        values = current_backend().activation_forward(x.float(), activation, **params)
        return self.quantize_unrounded(values, dtype=dtype)

    def quantize_activation_backward(self, grad_output: torch.Tensor, x: torch.Tensor, activation: str, *,
                                     dtype: torch.dtype, **params: Any) -> "QuantizedTensor":
        """``dy * act'(x)`` in fp32 from the compute-dtype ``grad_output`` and ``x``, quantized by the fused rule:
        exactly ``self.quantize_unrounded(dact_fp32(dy, x), dtype=dtype)``."""
        values = current_backend().activation_backward(grad_output.float(), x.float(), activation, **params)
        return self.quantize_unrounded(values, dtype=dtype)

    def quantize_activation_backward_dbias(self, grad_output: torch.Tensor, x: torch.Tensor, activation: str, *,
                                           dtype: torch.dtype, **params: Any) -> tuple["QuantizedTensor", torch.Tensor]:
        """:meth:`quantize_activation_backward` and the bias grad of the same pass, rounded to ``dtype``: the fp32
        sum over the leading dims of the unrounded values where :attr:`dbias_from_unrounded`, of the values
        rounded to ``dtype`` otherwise."""
        backend = current_backend()
        values = backend.activation_backward(grad_output.float(), x.float(), activation, **params)
        summed = values if self.dbias_from_unrounded else values.to(dtype)
        dbias = backend.dbias(summed).to(dtype)
        return self.quantize_unrounded(values, dtype=dtype), dbias

    def _quantize_arrays_named(self, tensor: torch.Tensor, *, rowwise: bool, columnwise: bool,
                               **options: Any) -> dict[str, Any]:
        """:meth:`_quantize_arrays`, whose refusals (a shape off the block size, a dtype the scheme
        cannot take) are prefixed with :attr:`label`: the op and the tensor."""
        try:
            return self._quantize_arrays(tensor, rowwise=rowwise, columnwise=columnwise, **options)
        except (ValueError, TypeError) as error:
            if self.label is None:
                raise
            raise type(error)(f"{self.label}: {error}") from error

    # ---------------------------------------------------------- per scheme
    @abc.abstractmethod
    def _quantize_arrays(self, tensor: torch.Tensor, *, rowwise: bool, columnwise: bool) -> dict[str, Any]:
        """Constructor keyword arguments (data and scales) of ``tensor_class`` for these usages."""

    def _tensor_meta(self) -> dict[str, Any]:
        """Non-tensor constructor arguments of ``tensor_class`` (e.g. ``fp8_dtype``)."""
        return {}

    @abc.abstractmethod
    def make_empty(
        self,
        shape: Iterable[int],
        *,
        dtype: torch.dtype = torch.float32,
        device: Optional[torch.device | str] = None,
        requires_grad: bool = False,
    ) -> "QuantizedTensor":
        """A quantized tensor of nominal ``shape``/``dtype`` with uninitialized data."""

    # -------------------------------------------------------- serialization
    def _config(self) -> dict[str, Any]:
        """JSON-compatible constructor options (no tensors)."""
        return {"rowwise": self.rowwise_usage, "columnwise": self.columnwise_usage}

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        """Tensors a rebuilt quantizer needs (delayed scaling: scale and amax)."""
        return {}

    @classmethod
    def _from_config(cls, config: dict[str, Any], tensors: dict[str, torch.Tensor], device: torch.device) -> "Quantizer":
        quantizer = cls(**config)  # type: ignore[call-arg]
        return quantizer


def quantizer_to_plain(quantizer: Optional[Quantizer]) -> tuple[dict[str, torch.Tensor], Optional[dict[str, Any]]]:
    """``(state tensors, metadata)`` of a quantizer (None gives no metadata)."""
    if quantizer is None:
        return {}, None
    meta = {"class": type(quantizer).__name__, "config": quantizer._config(), "internal": quantizer.internal}
    return {k: v.detach().clone() for k, v in quantizer._state_tensors().items()}, meta


def quantizer_from_plain(
    meta: Optional[dict[str, Any]], tensors: dict[str, torch.Tensor], device: torch.device
) -> Optional[Quantizer]:
    """Inverse of :func:`quantizer_to_plain`."""
    if meta is None:
        return None
    cls = QUANTIZER_CLASSES.get(meta["class"])
    if cls is None:
        raise ValueError(f"unknown quantizer class {meta['class']!r} in quantized tensor metadata")
    quantizer = cls._from_config(dict(meta["config"]), tensors, device)
    quantizer.internal = bool(meta.get("internal", False))
    return quantizer


def _is_quantized_tensor(tensor: Any) -> bool:
    """Whether ``tensor`` is a refops ``QuantizedTensor``, told by the method every one has: the tensor class's
    module imports this one, so this one does not import it."""
    return isinstance(tensor, torch.Tensor) and callable(getattr(type(tensor), "_dequantize_impl", None))


class _QuantizeFunc(torch.autograd.Function):
    """Quantize in forward; pass the gradient through unchanged in backward."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, quantizer: Quantizer) -> "QuantizedTensor":
        return quantizer._quantize_new(tensor.detach())

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None
