"""Quantized parameters in checkpoints: one plain uint8 matrix each (row blocks), bit-exact, never pickled.

``state_dict()`` stores a ``QuantizedTensor`` parameter as its **row blocks**: a ``(blocks, width)`` uint8
matrix whose rows follow the weight's rows and which says what its bytes mean. An FSDP2-sharded one (a
DTensor around a ``QuantizedTensor``) is stored as a DTensor of the same row blocks, sharded as the weight
is. It is the one form of a quantized weight in one process and under FSDP2 alike, so
``torch.distributed.checkpoint`` reshards it like any plain tensor (saved on 2 ranks, loaded in one process,
or the reverse), and ``torch.load(weights_only=True)`` reads it. The form belongs to the sharding layer
(:mod:`refops.sharding.row_blocks`, :mod:`refops.sharding.sharded_checkpoint`), which sits above ops and
installs it here (:func:`install_quantized_parameter_form`) when ``refops`` is imported. Checkpoints of the
legacy single-process form (one 1-D uint8 tensor per weight, :mod:`refops.ops.legacy_checkpoint_form`)
still load. Loading places the rebuilt tensor into the existing parameter object (or assigns it with
``assign=True``).

Nothing changes type silently on load (the functions at the end): a quantized
entry loads only into a weight stored with the same scheme, and then takes the
op's live quantizer; a plain entry loaded into a quantized weight is quantized
with the op's weight quantizer; a truncated entry is an error naming the op and
the parameter. :func:`dequantize_state_dict` is the explicit conversion of a
quantized checkpoint for a plain model.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

import torch

from ..quantization._dispatch import same_encoding
from ..quantization.dtensor import is_dtensor
from ..quantization.quantized_tensor import QuantizedTensor
from .checkpoint_errors import DCP_CHECK
from .extra_state import extra_state_type_error
from .legacy_checkpoint_form import decode_legacy_entry
from .parameter_lifecycle import fill_parameter_in_place

__all__ = [
    "QuantizedParameterForm",
    "install_quantized_parameter_form",
    "quantizer_scheme",
    "expected_weight_quantizer",
    "quantized_entry_error",
    "bind_live_quantizer",
    "dequantize_state_dict",
    "QuantizedCheckpoint",
]


class QuantizedParameterForm(Protocol):
    """The state-dict form of quantized parameters (``refops.sharding.state_dict_form`` implements it)."""

    def encode(self, param: Any, *, what: str) -> torch.Tensor:
        """The entry of a ``QuantizedTensor`` parameter, or of a DTensor around one."""

    def is_entry(self, value: Any) -> bool:
        """Whether ``value`` is a plain (not sharded) entry of this form."""

    def describe(self, value: torch.Tensor, *, what: str) -> str:
        """What entry ``value`` holds, in words."""

    def decode(self, value: torch.Tensor, *, like: Optional[QuantizedTensor], rows: Optional[int],
               what: str) -> QuantizedTensor:
        """The tensor entry ``value`` holds, checked against ``like`` (a tensor stored the way it must be), with
        ``like``'s quantizer; ``ValueError`` naming ``what`` for anything else."""

    def decode_shard(self, param: Any, value: Any, *, what: str, decode_legacy: Any) -> QuantizedTensor:
        """This rank's shard of sharded quantized weight ``param`` from entry ``value``."""


_form: Optional[QuantizedParameterForm] = None


def install_quantized_parameter_form(form: QuantizedParameterForm) -> None:
    """Set the state-dict form of quantized parameters (called by ``refops.sharding`` at import)."""
    global _form
    _form = form


def _the_form() -> QuantizedParameterForm:
    if _form is None:  # only when refops.sharding was never imported (``import refops`` imports it)
        raise RuntimeError("refops: the state-dict form of quantized parameters is installed by refops.sharding; "
                           "import refops")
    return _form




def quantizer_scheme(quantizer: Any) -> dict[str, Any]:
    """What must match for stored quantized bytes to mean the same values: class and options, not usages."""
    config = {k: v for k, v in quantizer._config().items() if k not in ("rowwise", "columnwise")}
    return {"quantizer": type(quantizer).__name__, **config}


def expected_weight_quantizer(op: Any, name: str) -> Any:
    """The quantizer parameter ``name`` of ``op`` is stored with, or None if it is stored plain.

    A materialized quantized weight answers for itself; a meta one built under
    ``quantized_model_init`` answers with the op's weight quantizer.
    """
    param = op._parameters[name]
    if isinstance(param, QuantizedTensor):
        return param.quantizer
    slot_of = getattr(op, "_weight_quantizer_slot", None)
    if not getattr(op, "_with_quantized_weight", False) or slot_of is None or slot_of(name) is None:
        return None
    try:
        return op._weight_quantizer(slot_of(name))
    except RuntimeError:
        return None


def quantized_entry_error(op: Any, name: str, value: QuantizedTensor, where: str) -> Optional[str]:
    """Why quantized checkpoint entry ``value`` cannot load into ``op``'s parameter ``name`` (None: it can)."""
    param = op._parameters[name]
    expected = expected_weight_quantizer(op, name)
    saved = type(value).__name__
    if value.quantizer is not None:
        saved += f" made by {type(value.quantizer).__name__}"
    if expected is None and not isinstance(param, QuantizedTensor):
        return (
            f"{where} is a plain parameter but the checkpoint holds a quantized {saved} (saved under "
            "quantized_model_init); build the model under quantized_model_init with the same recipe, or convert "
            "the checkpoint with refops.ops.quantized_checkpoint.dequantize_state_dict(state_dict)"
        )
    if expected is None or value.quantizer is None:
        return None
    if expected.tensor_class is not type(value) or quantizer_scheme(expected) != quantizer_scheme(value.quantizer):
        return (
            f"{where} is stored as {expected.tensor_class.__name__} ({quantizer_scheme(expected)}) but the checkpoint holds "
            f"{saved} ({quantizer_scheme(value.quantizer)}): it was saved with another recipe. Build the model under "
            "quantized_model_init with that recipe, or load dequantize_state_dict(state_dict) to re-quantize"
        )
    return None


def bind_live_quantizer(op: Any, name: str, value: QuantizedTensor) -> None:
    """Give a loaded weight the op's live weight quantizer (same scheme, checked before).

    The rebuilt quantizer holds *copies* of the saved scale and amax; a delayed-
    scaling weight re-quantized by the optimizer must use the recipe state's live
    scale and record its amax there, as the uninterrupted model's weight does.
    """
    slot_of = getattr(op, "_weight_quantizer_slot", None)
    slot = slot_of(name) if slot_of is not None else None
    live = op.get_quantizer("forward", slot) if slot is not None else None
    if live is None or value.quantizer is None or quantizer_scheme(live) != quantizer_scheme(value.quantizer):
        return
    quantizer = live.copy()
    quantizer.set_usage(rowwise=value.has_usage("rowwise"), columnwise=value.has_usage("columnwise"))
    quantizer.internal = False
    value._quantizer = quantizer


def dequantize_state_dict(state_dict: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``state_dict`` with every quantized weight (row blocks, or the legacy form) replaced by its
    dequantized values.

    The explicit conversion for loading a quantized checkpoint into a plain model
    (or into one quantized with another recipe, which re-quantizes on load).
    """
    form = _the_form()
    out = {}
    for key, value in state_dict.items():
        where = f"state_dict[{key!r}]"
        if form.is_entry(value):
            out[key] = form.decode(value, like=None, rows=None, what=where).dequantize().detach()
            continue
        decoded = decode_legacy_entry(value, where=where, device=torch.device("cpu"))
        out[key] = value if decoded is None else decoded.dequantize().detach()
    return out


def _sharded_quantized(param: Any) -> bool:
    """An FSDP2-sharded quantized weight (a DTensor around a QuantizedTensor); cheap when DTensor was never loaded."""
    return is_dtensor(param) and isinstance(param._local_tensor, QuantizedTensor)


class QuantizedCheckpoint(torch.nn.Module):
    """Mixin for :class:`~refops.ops.op.BasicOperation`: quantized parameters in ``state_dict`` and the
    all-or-nothing, type-preserving ``load_state_dict`` (see the module docstring)."""

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        """Quantized parameters are saved as their row blocks (bit-exact); FSDP2-sharded ones as a DTensor of the
        same row blocks, sharded as the weight is (see the module docstring)."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if keep_vars:
            return
        for name, param in self._parameters.items():
            if isinstance(param, QuantizedTensor) or _sharded_quantized(param):
                destination[prefix + name] = _the_form().encode(param, what=self._where(prefix, name))

    def _where(self, prefix: str, name: str) -> str:
        return f"{type(self).__name__} ({prefix or 'top level'}): parameter '{name}'"

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        """Atomic per op: every own entry is checked first, and any problem loads nothing.

        Checked: shapes, corrupt encoded entries, and quantized entries that do not
        match how the weight is stored (never a silent type change; see
        :mod:`refops.ops.quantized_checkpoint`). Extra state is applied before
        parameters (a loaded quantized weight takes the op's live quantizer, with
        the loaded scales). A meta parameter receiving a real tensor without
        ``assign=True`` is materialized from the checkpoint (quantized if the op
        stores its weights quantized) instead of silently staying on meta.
        """
        own = {n: p for n, p in self._parameters.items() if p is not None and prefix + n in state_dict}
        sharded = {n: p for n, p in own.items() if _sharded_quantized(p)}
        own = {n: p for n, p in own.items() if n not in sharded}

        def where(n: str) -> str:
            return self._where(prefix, n)

        extra_key = prefix + torch.nn.modules.module._EXTRA_STATE_KEY_SUFFIX
        problem = extra_state_type_error(state_dict[extra_key]) if extra_key in state_dict else None
        if problem is not None:  # never dropped without a word
            error_msgs.append(f"{type(self).__name__} ({prefix or 'top level'}): '{extra_key}': {problem}; nothing "
                              "of this op was loaded")
            return

        try:
            decoded = {
                n: self._decode_entry(n, p, state_dict[prefix + n], where(n)) for n, p in own.items()
            }
            shards = {n: self._decode_sharded_entry(n, p, state_dict[prefix + n], where(n)) for n, p in sharded.items()}
        except ValueError as error:
            error_msgs.append(f"{error}; nothing of this op was loaded ({DCP_CHECK})")
            return
        quantized = {n: q for n, q in decoded.items() if q is not None}
        shapes = {n: tuple(quantized[n].shape if n in quantized else state_dict[prefix + n].shape) for n in own}
        problems = [
            f"{where(n)} expects shape {tuple(own[n].shape)} but the checkpoint has {shapes[n]}"
            for n in own if shapes[n] != tuple(own[n].shape)
        ]
        problems += [msg for n, q in quantized.items() if (msg := quantized_entry_error(self, n, q, where(n)))]
        if problems:
            error_msgs.extend(f"{msg}; nothing of this op was loaded ({DCP_CHECK})" for msg in problems)
            return
        if extra_key in state_dict:
            self.set_extra_state(state_dict[extra_key])
        with torch.no_grad():
            for name, shard in shards.items():  # bytes and scales into the same local tensor, in place
                self._parameters[name]._local_tensor.copy_(shard)
                del state_dict[prefix + name]
        assign = local_metadata.get("assign_to_params_buffers", False)
        plain_into_quantized = {
            n: state_dict[prefix + n] for n in own
            if n not in quantized and (assign or own[n].is_meta) and not state_dict[prefix + n].is_meta
            and expected_weight_quantizer(self, n) is not None
        }
        for name, source in plain_into_quantized.items():
            quantized[name] = self._quantize_checkpoint_value(name, source)
        for name, value in quantized.items():
            bind_live_quantizer(self, name, value)
            self._load_quantized_parameter(name, value, assign=assign)
            del state_dict[prefix + name]
        if not assign:
            self._materialize_from_checkpoint(
                {n: state_dict[prefix + n] for n, p in own.items()
                 if n not in quantized and p.is_meta and not state_dict[prefix + n].is_meta}
            )
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        for name in (*quantized, *shards):
            if prefix + name in missing_keys:
                missing_keys.remove(prefix + name)

    def _decode_entry(self, name: str, param: torch.Tensor, value: Any, where: str) -> Optional[QuantizedTensor]:
        """The quantized tensor checkpoint entry ``value`` holds for plain-or-quantized parameter ``name`` (None:
        a plain entry): row blocks, decoded as the parameter is stored (a meta parameter: as its weight quantizer
        stores it), or the legacy form."""
        device = self._checkpoint_target_device(param)
        form = _the_form()
        if not form.is_entry(value):
            return decode_legacy_entry(value, where=where, device=device)
        like = param if isinstance(param, QuantizedTensor) else None
        expected = expected_weight_quantizer(self, name)
        if like is None and expected is not None:
            like = expected.make_empty(param.shape, dtype=param.dtype, device=device)
        if like is None:
            raise ValueError(
                f"{where} is a plain parameter but the checkpoint holds a quantized {form.describe(value, what=where)} "
                "(saved under quantized_model_init); build the model under quantized_model_init with the same recipe, "
                "or convert the checkpoint with refops.ops.quantized_checkpoint.dequantize_state_dict(state_dict)"
            )
        return form.decode(value.to(device), like=like, rows=param.shape[0] if param.dim() else None, what=where)

    def _decode_sharded_entry(self, name: str, param: Any, value: Any, where: str) -> QuantizedTensor:
        """This rank's shard of FSDP2-sharded quantized weight ``name`` from ``value``, stored exactly as the local
        shard is (checked: bytes are copied, never re-quantized)."""

        def decode_legacy(full: torch.Tensor) -> Optional[QuantizedTensor]:
            whole = decode_legacy_entry(full, where=where, device=param._local_tensor.device)
            problem = None if whole is None else quantized_entry_error(self, name, whole, where)
            if problem is not None:
                raise ValueError(problem)
            return whole

        shard = _the_form().decode_shard(param, value, what=where, decode_legacy=decode_legacy)
        if not same_encoding(param._local_tensor, shard):
            raise ValueError(
                f"{where}: the checkpoint's {type(shard).__name__} shard of shape {tuple(shard.shape)} is not stored as "
                f"this rank's {type(param._local_tensor).__name__} shard of shape {tuple(param._local_tensor.shape)} "
                "(usages or format differ); its bytes cannot be copied, and re-quantizing would change them"
            )
        return shard

    def _checkpoint_target_device(self, param: torch.Tensor) -> torch.device:
        return self.materialization_device() if param.is_meta else param.device

    def _quantize_checkpoint_value(self, name: str, source: torch.Tensor) -> torch.Tensor:
        """A plain checkpoint value for a weight stored quantized: quantized with the op's weight quantizer,
        exactly as an eager-built weight re-quantizes a value copied into it."""
        param = self._parameters[name]
        with torch.inference_mode(False), torch.no_grad():
            value = torch.empty(param.shape, dtype=param.dtype, device=self._checkpoint_target_device(param))
            value.copy_(source)
            return self._finalize_parameter_value(name, value, inference=False)

    def _load_quantized_parameter(self, name: str, value: QuantizedTensor, *, assign: bool) -> None:
        param = self._parameters[name]
        if assign:
            setattr(self, name, torch.nn.Parameter(value, requires_grad=param.requires_grad))
        elif not fill_parameter_in_place(param, value):
            self._place_parameter_value(name, value)

    def _materialize_from_checkpoint(self, values: dict[str, torch.Tensor]) -> None:
        if not values:
            return
        device = self.materialization_device()
        with torch.no_grad():
            for name, source in values.items():
                param = self._parameters[name]
                value = torch.empty(param.shape, dtype=param.dtype, device=device)
                value.copy_(source)
                self._place_parameter_value(name, value)
