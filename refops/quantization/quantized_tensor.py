"""``QuantizedTensor``: a torch.Tensor that presents a high-precision shape/dtype and holds quantized data.

The wrapper (``torch.Tensor._make_wrapper_subclass``) has the *nominal* shape,
dtype (fp32/fp16/bf16) and device; it owns no storage of its own. Inside are
plain tensors: row-wise and/or column-wise data and their scale inverses, plus
the quantizer that made them (used to re-quantize in place). Nothing else: no
hidden high-precision copy (:meth:`quantized_nbytes` measures it).

Each scheme subclass declares which attributes hold what:

* ``_ROWWISE`` / ``_COLUMNWISE``: tensors of one usage (dropped with it);
* ``_SHARED``: tensors both usages need (per-tensor FP8's single ``_scale_inv``);
* ``_CTOR_TENSORS`` / ``_CTOR_META``: TE's constructor keyword -> attribute.

Torch operations go through one handler table, :data:`TORCH_DISPATCH`, which the modules owning the
rules fill when they are imported (they import this module, so it cannot import them):
:mod:`refops.quantization._dispatch` (detach, alias, clone, ``copy_`` into it (re-quantize in place),
``.to(device/dtype)`` (stays quantized), ``empty_like``, and the rule for every other op: it runs on the
dequantized values) and :mod:`refops.sharding.cuts` (``split``/``chunk``, ``slice``/``narrow`` and
``new_zeros``: exact pieces, quantized where the scheme allows the cut, which is how FSDP2 shards).
``t.data = value`` takes ``value``'s arrays (or quantizes a plain ``value``). FSDP2's all-gather
extension (``fsdp_pre_all_gather`` / ``fsdp_post_all_gather``) keeps shards quantized; its two
functions are :data:`FSDP2_ALL_GATHER`'s, filled by :mod:`refops.sharding.fsdp2_all_gather`.
"""

from __future__ import annotations

import functools

from typing import Any, Callable, ClassVar, Optional

import torch

from ..kernels.gemm_operand import GemmOperand
from ..layouts import rows_cols
from .quantizer import DType, Quantizer, quantizer_from_plain, quantizer_to_plain

__all__ = ["QuantizedTensor", "TORCH_DISPATCH", "FSDP2_ALL_GATHER", "OTHER_OPS"]

USAGES = ("rowwise", "columnwise")
#: Tensor classes by name, for :meth:`QuantizedTensor.from_plain_tensors`.
TENSOR_CLASSES: dict[str, type["QuantizedTensor"]] = {}

#: The key of :data:`TORCH_DISPATCH`'s rule for the ops without a handler of their own.
OTHER_OPS = "other ops"
#: How torch operations treat a quantized tensor: aten op -> ``handler(*args, **kwargs)``, and under
#: :data:`OTHER_OPS` the rule ``rule(func, args, kwargs)`` for every op without a handler. Filled at import by
#: :mod:`refops.quantization._dispatch` and :mod:`refops.sharding.cuts` (see the module docstring).
TORCH_DISPATCH: dict[Any, Callable[..., Any]] = {}
#: FSDP2's all-gather extension, ``"pre"`` and ``"post"``: filled by :mod:`refops.sharding.fsdp2_all_gather`,
#: which sits above this layer (it needs the row-major form of every scheme).
FSDP2_ALL_GATHER: dict[str, Callable[..., Any]] = {}


def _fsdp2_all_gather(step: str) -> Callable[..., Any]:
    function = FSDP2_ALL_GATHER.get(step)
    if function is None:  # only when refops.sharding was never imported (``import refops`` imports it)
        raise RuntimeError("QuantizedTensor: FSDP2's all-gather extension is installed by refops.sharding; import refops")
    return function


@functools.lru_cache(maxsize=256)
def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of ``shape`` (cached: every quantized tensor built asks, mostly for a few shapes)."""
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


class QuantizedTensor(torch.Tensor):
    """Base class of quantized tensors (see the module docstring)."""

    _ROWWISE: ClassVar[tuple[str, ...]] = ()
    _COLUMNWISE: ClassVar[tuple[str, ...]] = ()
    _SHARED: ClassVar[tuple[str, ...]] = ()
    _CTOR_TENSORS: ClassVar[dict[str, str]] = {}
    _CTOR_META: ClassVar[dict[str, tuple[str, Any]]] = {}
    #: The ``GemmOperand.format`` this scheme's GEMM operands carry.
    _GEMM_FORMAT: ClassVar[str] = ""

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        TENSOR_CLASSES[cls.__name__] = cls

    def __new__(
        cls,
        shape: Any,
        dtype: torch.dtype,
        *,
        requires_grad: bool = False,
        device: Optional[torch.device | str] = None,
        quantizer: Optional[Quantizer] = None,
        **kwargs: Any,
    ) -> "QuantizedTensor":
        arrays = {attr: kwargs.pop(kw, None) for kw, attr in cls._CTOR_TENSORS.items()}
        meta = {attr: kwargs.pop(kw, default) for kw, (attr, default) in cls._CTOR_META.items()}
        if kwargs:
            raise TypeError(f"{cls.__name__}() got unexpected arguments {sorted(kwargs)}")
        present = [t for t in arrays.values() if t is not None]
        if device is None:
            device = present[0].device if present else torch.device("cpu")
        shape = torch.Size(shape)
        instance = torch.Tensor._make_wrapper_subclass(
            cls, shape, strides=_contiguous_strides(shape), storage_offset=0, dtype=dtype,
            device=torch.device(device), requires_grad=requires_grad,
        )
        instance.__dict__.update(arrays)
        instance.__dict__.update(meta)
        instance._quantizer = quantizer
        instance._validate()
        return instance

    def _validate(self) -> None:
        """Scheme-specific checks of the arrays (shapes, dtypes)."""

    # ------------------------------------------------------------- metadata
    @property
    def quantizer(self) -> Optional[Quantizer]:
        """The quantizer that made this tensor (re-quantizes it in place)."""
        return self._quantizer

    def _get_quantizer(self) -> Quantizer:
        if self._quantizer is None:
            raise RuntimeError(f"{type(self).__name__} has no quantizer, so it cannot be updated in place")
        return self._quantizer

    @classmethod
    def _array_names(cls) -> tuple[str, ...]:
        return cls._ROWWISE + cls._COLUMNWISE + cls._SHARED

    def has_usage(self, usage: str) -> bool:
        """Whether the ``"rowwise"`` or ``"columnwise"`` data (and its scales) is present."""
        names = {"rowwise": self._ROWWISE, "columnwise": self._COLUMNWISE}[usage] + self._SHARED
        return all(getattr(self, n) is not None for n in names)

    def get_metadata(self) -> dict[str, Any]:
        """Constructor keyword arguments that rebuild this tensor on the same arrays (TE's name)."""
        out: dict[str, Any] = {kw: getattr(self, attr) for kw, attr in self._CTOR_TENSORS.items()}
        out.update({kw: getattr(self, attr) for kw, (attr, _) in self._CTOR_META.items()})
        out["quantizer"] = self._quantizer
        return out

    @classmethod
    def make_like(
        cls,
        tensor: "QuantizedTensor",
        *,
        shape: Any = None,
        dtype: Optional[torch.dtype] = None,
        device: Optional[torch.device] = None,
        requires_grad: bool = False,
        **overrides: Any,
    ) -> "QuantizedTensor":
        """A new tensor of ``tensor``'s class sharing its arrays, unless ``overrides`` replaces some."""
        kwargs = tensor.get_metadata()
        kwargs.update(overrides)
        return type(tensor)(
            tensor.shape if shape is None else shape,
            tensor.dtype if dtype is None else dtype,
            device=tensor.device if device is None else device,
            requires_grad=requires_grad,
            **kwargs,
        )

    def _map_arrays(self, fn: Any, **kwargs: Any) -> "QuantizedTensor":
        """A tensor of the same class whose arrays are ``fn(array)`` (one call per distinct array)."""
        mapped: dict[int, torch.Tensor] = {}
        overrides = {}
        for kw, attr in self._CTOR_TENSORS.items():
            t = getattr(self, attr)
            if t is not None and id(t) not in mapped:
                mapped[id(t)] = fn(t)
            overrides[kw] = None if t is None else mapped[id(t)]
        return type(self).make_like(self, **overrides, **kwargs)

    def quantized_nbytes(self) -> int:
        """Bytes of every distinct array this tensor holds (its whole memory footprint)."""
        seen = {id(t): t for t in (getattr(self, n) for n in self._array_names()) if t is not None}
        return sum(t.numel() * t.element_size() for t in seen.values())

    # ----------------------------------------------------------- dequantize
    def dequantize(self, *, dtype: Optional[torch.dtype] = None, usage: Optional[str] = None) -> torch.Tensor:
        """Plain tensor of the exactly dequantized values (nominal dtype unless ``dtype``).

        ``usage`` picks the copy to read (default: row-wise if present). Autograd:
        the gradient passes through unchanged.
        """
        dtype = self.dtype if dtype is None else dtype
        if torch.is_grad_enabled() and self.requires_grad:
            return _DequantizeFunc.apply(self, dtype, usage)
        return self._dequantize_impl(dtype, usage)

    def _dequantize_impl(self, dtype: torch.dtype, usage: Optional[str]) -> torch.Tensor:
        if usage is None:
            usage = "rowwise" if self.has_usage("rowwise") else "columnwise"
        if usage not in USAGES:
            raise ValueError(f"usage must be 'rowwise' or 'columnwise', got {usage!r}")
        if not self.has_usage(usage):
            raise RuntimeError(f"{type(self).__name__} holds no {usage} data to dequantize")
        return self._dequantize_usage(usage, dtype)

    def _dequantize_usage(self, usage: str, dtype: torch.dtype) -> torch.Tensor:
        """Per scheme: the values of the ``usage`` copy, nominal shape, rounded once to ``dtype``."""
        raise NotImplementedError

    # ----------------------------------------------------------------- GEMM
    def gemm_operand(self, usage: str, *, values: bool = True, name: str = "operand") -> GemmOperand:
        """What a GEMM reads of this tensor in ``usage``, as plain arrays (``refops.kernels.GemmOperand``).

        ``values``: include the exact fp32 dequantization, flattened to ``(rows, last dim)``.
        ``name`` names the operand in the error raised when ``usage`` is missing.
        """
        if not self.has_usage(usage):
            dim = "last" if usage == "rowwise" else "first"
            raise ValueError(
                f"gemm: operand {name} is a {type(self).__name__} without {usage} data, which this GEMM reads "
                f"(it contracts {name}'s {dim} dim); quantize it with that usage enabled"
            )
        exact = None
        if values:
            dequantized = self.dequantize(dtype=torch.float32, usage=usage)
            exact = dequantized.reshape(-1, dequantized.shape[-1])  # leading dims flatten into rows
        rows, last = rows_cols(self.shape)
        return GemmOperand(format=self._GEMM_FORMAT, usage=usage, shape=(rows, last), values=exact,
                           **self._gemm_arrays(usage, rows, last))

    def _gemm_arrays(self, usage: str, rows: int, last: int) -> dict[str, Any]:
        """Per scheme: the raw arrays and layout names of ``GemmOperand`` for ``usage`` (``data``, ``scale_inv``,
        ``fp8_dtype``, ...), ``data`` as the 2-D view ``GemmOperand`` documents; none (values only) by default."""
        return {}

    # --------------------------------------------------------------- update
    def quantize_(self, tensor: torch.Tensor, *, noop_flag: Optional[torch.Tensor] = None) -> "QuantizedTensor":
        """Re-quantize ``tensor`` into this tensor's arrays, in place, with its own quantizer."""
        return self._get_quantizer().update_quantized(tensor, self, noop_flag=noop_flag)

    def _overwrite_arrays(self, fresh: dict[str, Optional[torch.Tensor]]) -> None:
        """Copy freshly quantized arrays (constructor keywords) into the existing ones, in place."""
        for kw, attr in self._CTOR_TENSORS.items():
            current, new = getattr(self, attr), fresh.get(kw)
            if current is None:
                continue
            if new is None or new.shape != current.shape:
                raise RuntimeError(f"{type(self).__name__}: cannot update {attr} in place from {kw}")
            current.copy_(new)
        for kw, (attr, _) in self._CTOR_META.items():
            if kw in fresh:
                setattr(self, attr, fresh[kw])

    def update_usage(self, rowwise_usage: Optional[bool] = None, columnwise_usage: Optional[bool] = None) -> None:
        """Keep or drop each usage (None: unchanged).

        Dropping frees that copy. Adding a usage this tensor lacks works only where
        it follows exactly from the other (per-tensor FP8, FP8-block 2D); otherwise
        it raises. At least one usage must remain.
        """
        want = {
            "rowwise": self.has_usage("rowwise") if rowwise_usage is None else bool(rowwise_usage),
            "columnwise": self.has_usage("columnwise") if columnwise_usage is None else bool(columnwise_usage),
        }
        if not any(want.values()):
            raise ValueError(f"{type(self).__name__}.update_usage: at least one usage must remain")
        for usage in USAGES:
            if want[usage] and not self.has_usage(usage):
                self._derive_usage(usage)
        for usage, names in (("rowwise", self._ROWWISE), ("columnwise", self._COLUMNWISE)):
            if not want[usage]:
                for name in names:
                    setattr(self, name, None)

    # ----------------------------------------------------------------- .data
    def _get_data(self) -> "QuantizedTensor":
        return super().data  # a detached alias of the same class (dispatched to ``detach``)

    @torch.no_grad()
    def _set_data(self, tensor: torch.Tensor) -> None:
        """``t.data = value`` (TE's semantics): ``t`` stays this object and takes ``value``'s size, dtype and device.

        A tensor of the same class lends its arrays (shared, not copied) and a copy of its quantizer; a
        plain tensor is quantized with this tensor's quantizer (its usages). Either way the bytes,
        scales and ``dequantize()`` are ``value``'s afterwards, never the old ones under a new size.
        A tensor of another scheme is refused: quantize its ``dequantize()`` instead.
        """
        name = type(self).__name__
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name}.data: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device.type == "cpu" and self.device.type != "cpu":  # TE keeps an accelerator tensor there
            tensor = tensor.to(device=self.device)
        if isinstance(tensor, QuantizedTensor):
            if type(tensor) is not type(self):
                raise TypeError(
                    f"{name}.data: cannot take the arrays of a {type(tensor).__name__} (another scheme); assign "
                    f"its dequantize() to re-quantize the values with this tensor's quantizer"
                )
            source = tensor
            quantizer = None if tensor._quantizer is None else tensor._quantizer.copy()
        else:
            quantizer = self._get_quantizer()
            source = quantizer._quantize_new(quantizer._high_precision_input(tensor).detach())
        if (source.shape, source.dtype, source.device) != (self.shape, self.dtype, self.device):
            # The wrapper's own size/dtype/device (torch's ``set_data`` on an empty wrapper of the new layout).
            wrapper = torch.Tensor._make_wrapper_subclass(
                type(self), source.shape, strides=_contiguous_strides(source.shape), storage_offset=0,
                dtype=source.dtype, device=source.device, requires_grad=self.requires_grad,
            )
            super(QuantizedTensor, type(self)).data.__set__(self, wrapper)
        for attr in self._array_names():
            setattr(self, attr, getattr(source, attr))
        for _, (attr, _) in self._CTOR_META.items():
            setattr(self, attr, getattr(source, attr))
        self._quantizer = quantizer

    data = property(_get_data, _set_data)

    def _derive_usage(self, usage: str) -> None:
        raise RuntimeError(
            f"{type(self).__name__} has no {usage} data and it cannot be derived from the other usage; "
            f"re-quantize the high-precision tensor with {usage} usage enabled"
        )

    # -------------------------------------------------------- serialization
    def to_plain_tensors(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """``(tensors, metadata)``: plain tensors and JSON-compatible metadata, no pickle.

        :meth:`from_plain_tensors` rebuilds the tensor bit for bit (and its quantizer,
        with copies of the quantizer's state tensors under ``"quantizer."`` keys).
        """
        tensors = {kw: getattr(self, attr) for kw, attr in self._CTOR_TENSORS.items() if getattr(self, attr) is not None}
        q_tensors, q_meta = quantizer_to_plain(self._quantizer)
        tensors.update({f"quantizer.{k}": v for k, v in q_tensors.items()})
        meta = {kw: _plain_value(getattr(self, attr)) for kw, (attr, _) in self._CTOR_META.items()}
        metadata = {
            "class": type(self).__name__,
            "shape": list(self.shape),
            "dtype": str(self.dtype).removeprefix("torch."),
            "meta": meta,
            "quantizer": q_meta,
        }
        return tensors, metadata

    @classmethod
    def from_plain_tensors(
        cls,
        tensors: dict[str, torch.Tensor],
        metadata: dict[str, Any],
        *,
        quantizer: Optional[Quantizer] = None,
        device: Optional[torch.device | str] = None,
    ) -> "QuantizedTensor":
        """Inverse of :meth:`to_plain_tensors`; ``quantizer`` replaces the rebuilt one if given."""
        tensor_cls = TENSOR_CLASSES.get(metadata["class"])
        if tensor_cls is None or not issubclass(tensor_cls, cls):
            raise ValueError(f"metadata describes a {metadata['class']!r}, not a {cls.__name__}")
        arrays = {k: v for k, v in tensors.items() if not k.startswith("quantizer.")}
        if device is not None:
            arrays = {k: v.to(device) for k, v in arrays.items()}
        target = torch.device(device) if device is not None else next(iter(arrays.values())).device
        if quantizer is None:
            q_tensors = {k.removeprefix("quantizer."): v for k, v in tensors.items() if k.startswith("quantizer.")}
            quantizer = quantizer_from_plain(metadata["quantizer"], q_tensors, target)
        meta = {kw: _from_plain_value(kw, v) for kw, v in metadata["meta"].items()}
        return tensor_cls(
            metadata["shape"], getattr(torch, metadata["dtype"]), device=target, quantizer=quantizer, **arrays, **meta
        )

    # ---------------------------------------------------------------- FSDP2
    def fsdp_pre_all_gather(self, mesh: Any, orig_size: torch.Size, contiguous_orig_stride: Any, module: Any,
                            mp_policy: Any) -> tuple[tuple[torch.Tensor, ...], Any]:
        """FSDP2's all-gather extension: this shard's data and scales, in row-major layout (never dequantized).

        See :mod:`refops.sharding.fsdp2_all_gather`; raises for a shard that cannot stay quantized.
        """
        return _fsdp2_all_gather("pre")(self, mesh, orig_size, module, mp_policy)

    def fsdp_post_all_gather(self, all_gather_outputs: tuple[torch.Tensor, ...], metadata: Any,
                             param_dtype: torch.dtype, *, out: Optional["QuantizedTensor"] = None) -> Any:
        """FSDP2's all-gather extension: the unsharded quantized tensor rebuilt from the gathered arrays."""
        return _fsdp2_all_gather("post")(self, all_gather_outputs, metadata, param_dtype, out=out)

    def untyped_storage(self) -> torch.UntypedStorage:
        """The storage of the first array this tensor holds (the wrapper itself owns none).

        FSDP2 compares storages to tell whether a shard was replaced; without this, asking a
        wrapper for its storage fails.
        """
        for name in self._array_names():
            array = getattr(self, name)
            if array is not None:
                return array.untyped_storage()
        return torch.empty(0, dtype=torch.uint8, device=self.device).untyped_storage()

    # ----------------------------------------------------------- torch glue
    def __tensor_flatten__(self) -> tuple[list[str], dict[str, Any]]:
        names = [attr for attr in self._array_names() if getattr(self, attr) is not None]
        ctx = {attr: getattr(self, attr) for _, (attr, _) in self._CTOR_META.items()}
        ctx["_quantizer"] = self._quantizer
        ctx["_nominal_dtype"] = self.dtype
        return names, ctx

    @classmethod
    def __tensor_unflatten__(
        cls, inner: dict[str, torch.Tensor], ctx: dict[str, Any], outer_size: Any, outer_stride: Any
    ) -> "QuantizedTensor":
        arrays = {kw: inner.get(attr) for kw, attr in cls._CTOR_TENSORS.items()}
        meta = {kw: ctx[attr] for kw, (attr, _) in cls._CTOR_META.items()}
        return cls(outer_size, ctx["_nominal_dtype"], quantizer=ctx["_quantizer"], **arrays, **meta)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        handler = TORCH_DISPATCH.get(func)
        if handler is not None:
            return handler(*args, **(kwargs or {}))
        return TORCH_DISPATCH[OTHER_OPS](func, args, kwargs or {})

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        usages = [u for u in USAGES if self.has_usage(u)]
        values = self._dequantize_impl(self.dtype, None) if usages else "<no data>"
        return f"{type(self).__name__}(dtype={self.dtype}, usages={usages}, data={values})"

    def __reduce_ex__(self, protocol: int) -> Any:
        # Refused rather than pickled: checkpoints of quantized weights are pickle-free row blocks
        # (``docs/api/refops.md#copies-and-pickling``), and a pickled wrapper would be a second form.
        raise TypeError(
            f"{type(self).__name__} is not picklable (pickle, torch.save of a whole model, multiprocessing): "
            "copy a model with copy.deepcopy, save and load its state_dict(), or convert one tensor with "
            "to_plain_tensors() / from_plain_tensors()"
        )

    def __copy__(self) -> "QuantizedTensor":
        """``copy.copy``: a new tensor on the same arrays and quantizer, as ``copy.copy`` of a torch tensor
        shares its storage."""
        return type(self)(self.shape, self.dtype, requires_grad=self.requires_grad, device=self.device,
                          **self.get_metadata())


def _plain_value(value: Any) -> Any:
    return int(value) if isinstance(value, DType) else value


def _from_plain_value(kw: str, value: Any) -> Any:
    return DType(value) if kw in ("fp8_dtype", "fp4_dtype") else value


class _DequantizeFunc(torch.autograd.Function):
    """Dequantize in forward; pass the gradient through (cast to the nominal dtype)."""

    @staticmethod
    def forward(ctx: Any, tensor: QuantizedTensor, dtype: torch.dtype, usage: Optional[str]) -> torch.Tensor:
        ctx.input_dtype = tensor.dtype
        return tensor._dequantize_impl(dtype, usage)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad.to(ctx.input_dtype), None, None
