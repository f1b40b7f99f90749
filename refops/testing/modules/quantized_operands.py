"""The quantized operands of a forward: recorded from the reference, exposed by a candidate, compared byte for byte.

A candidate that returns plain tensors hides its quantization: a wrong byte that
stays within the GEMM tolerance passes :func:`~refops.testing.compare_modules`.
The protocol that lets the oracle see it: the candidate module defines

.. code-block:: python

    def refops_quantized_operands(self) -> dict[str, Any]:
        return {"input": (x_data, x_scale_inv), "weight": (w_data, w_scale_inv)}

returning the operands its last forward fed to its GEMMs, each a refops
``QuantizedTensor`` or ``(data, scale_inv)`` in the row-wise layout. Names are
``"<prefix>.<role>"``: the prefix is the owning module's parameter prefix (the
``"1"`` of ``"1.weight"``; empty for a single op), the role is ``input``,
``weight`` or ``grad_output``. The reference's operands are recorded by
watching every quantizer call during its forward and backward (:func:`recording`)
and named from the quantizers' roles (:func:`reference_operands`); a candidate that
is itself a refops model (another kernel backend) is recorded the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator, Optional

import torch

from ...quantization.quantized_tensor import QuantizedTensor
from ...quantization.quantizer import Quantizer
from ..quantizers import diagnosis, layout
from ..tensor_report import TensorComparison, absent, compare_tensors

__all__ = ["HOOK", "Recorded", "recording", "reference_operands", "operand_sources", "same_source", "compare_operands"]

#: The method a candidate module defines to expose its quantized operands.
HOOK = "refops_quantized_operands"


class Recorded(dict):
    """``{id(quantizer): its last output}``, and in ``sources`` the high-precision tensor it quantized."""

    def __init__(self) -> None:
        super().__init__()
        self.sources: dict[int, Optional[torch.Tensor]] = {}


@contextlib.contextmanager
def recording() -> Iterator[Recorded]:
    """Within the block, every quantizer call's output and input, by quantizer."""
    seen = Recorded()
    original = Quantizer.quantize

    def quantize(self, tensor, *, out=None):
        result = original(self, tensor, out=out)
        seen[id(self)] = result
        plain = isinstance(tensor, torch.Tensor) and not isinstance(tensor, QuantizedTensor)
        seen.sources[id(self)] = tensor.detach().clone() if plain else None
        return result

    original_unrounded = Quantizer.quantize_unrounded

    def quantize_unrounded(self, values, *, dtype):
        result = original_unrounded(self, values, dtype=dtype)
        seen[id(self)] = result
        seen.sources[id(self)] = values.detach().clone()  # the fused path's source: the unrounded fp32 values
        return result

    Quantizer.quantize = quantize
    Quantizer.quantize_unrounded = quantize_unrounded
    # The fused activation routes (``quantize_activation*``) are overridden per scheme and quantize without
    # passing through the two methods above: each definition is wrapped, its source being the activation's
    # inputs (equal inputs, equal unrounded values).
    wrapped = [(cls, name, cls.__dict__[name]) for cls in _quantizer_classes() for name in _FUSED_ROUTES
               if name in cls.__dict__]
    for cls, name, method in wrapped:
        setattr(cls, name, _recording_route(method, seen))
    try:
        yield seen
    finally:
        Quantizer.quantize = original
        Quantizer.quantize_unrounded = original_unrounded
        for cls, name, method in wrapped:
            setattr(cls, name, method)


_FUSED_ROUTES = ("quantize_activation", "quantize_activation_backward", "quantize_activation_backward_dbias")


def _quantizer_classes() -> list[type]:
    classes, pending = [], [Quantizer]
    while pending:
        cls = pending.pop()
        classes.append(cls)
        pending.extend(cls.__subclasses__())
    return classes


def _recording_route(method, seen: "Recorded"):
    def route(self, *tensors, **kwargs):
        result = method(self, *tensors, **kwargs)
        seen[id(self)] = result[0] if isinstance(result, tuple) else result
        inputs = [t for t in tensors if isinstance(t, torch.Tensor)]
        seen.sources[id(self)] = torch.cat([t.detach().reshape(-1).float() for t in inputs])
        return result
    return route


def _named_quantizers(module: torch.nn.Module, seen: Recorded, deterministic_only: bool) -> Iterator[tuple[str, int]]:
    """``("<parameter prefix>.<role>", id(quantizer))`` for every quantizer of ``module`` that ``seen`` recorded."""
    first_name = {}
    for name, p in module.named_parameters():
        first_name.setdefault(id(p), name)
    for path, sub in module.named_modules():
        quantizers = getattr(sub, "_quantizers", None) or {}
        weight = getattr(sub, "weight", None)
        prefix = first_name[id(weight)].rpartition(".")[0] if id(weight) in first_name else path
        for mode, slots in quantizers.items():
            roles = sub.get_quantizer_roles(mode) if hasattr(sub, "get_quantizer_roles") else None
            for index, quantizer in enumerate(slots):
                if id(quantizer) not in seen:
                    continue
                if deterministic_only and getattr(quantizer, "stochastic_rounding", False):
                    continue
                role = roles[index].tensor_type if roles and roles[index].tensor_type else f"{mode}{index}"
                yield (f"{prefix}.{role}" if prefix else role), id(quantizer)


def reference_operands(
    module: torch.nn.Module, seen: Recorded, *, deterministic_only: bool = False
) -> dict[str, QuantizedTensor]:
    """The recorded outputs of ``module``'s quantizers, named ``"<parameter prefix>.<role>"``.

    ``deterministic_only`` leaves out quantizers that round stochastically: two runs draw
    different random bits, so their bytes are not comparable.
    """
    return {name: seen[key] for name, key in _named_quantizers(module, seen, deterministic_only)}


def operand_sources(module: torch.nn.Module, seen: Recorded) -> dict[str, Optional[torch.Tensor]]:
    """The high-precision tensor each named operand was quantized from (None when it was already quantized)."""
    return {name: seen.sources.get(key) for name, key in _named_quantizers(module, seen, False)}


def same_source(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> bool:
    """Whether two operands were quantized from bit-identical tensors (only then must their bytes agree)."""
    if a is None or b is None or a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(layout.as_bits(a.cpu()), layout.as_bits(b.cpu()))


def compare_operands(candidate: dict[str, Any], reference: dict[str, QuantizedTensor],
                     sources: Optional[dict[str, Optional[torch.Tensor]]] = None) -> list[TensorComparison]:
    """Every operand the candidate exposes against the reference's of the same name, bit for bit.

    Where the bytes of a usage differ, the failing lines say what the candidate's operand is when it is a known
    mix-up (:func:`~refops.testing.format_diagnosis.diagnose_mismatch`: the other FP8 format, a scale off by a
    power of two, the other orientation); ``sources`` (the reference's high-precision tensor of each operand,
    :func:`operand_sources`) sharpens that diagnosis."""
    sources = sources or {}
    out = []
    for name in sorted(candidate):
        label = f"operand {name}"
        if name not in reference:
            known = ", ".join(sorted(reference)) or "none"
            out.append(_missing(f"{label} (the reference quantized no such operand; it has: {known})"))
            continue
        ref = reference[name]
        given = candidate[name]
        for usage in ("rowwise", "columnwise"):
            if not ref.has_usage(usage):
                continue
            expected = layout.usage_fields(ref, usage)
            if isinstance(given, QuantizedTensor):
                if not given.has_usage(usage):
                    continue
                got = layout.usage_fields(given, usage)
            elif usage == "rowwise":
                data, scale_inv = given[0], given[1]
                got = {"data": data, "scale_inv": layout.valid_scale(ref, usage, torch.as_tensor(scale_inv))}
            else:
                continue  # a (data, scale_inv) pair is the row-wise operand only
            fields = [_compare_field(f"{label}[{usage} {field}]", got[field], expected[field])
                      for field in ("data", "scale_inv")]
            if not all(c.passed for c in fields):
                why = diagnosis.diagnose_run(ref, usage, expected, got, _source_of(sources.get(name), ref))
                fields = [dataclasses.replace(c, why=f"why: {why}") if why and not c.passed else c for c in fields]
            out += fields
    return out


def _compare_field(name: str, got: torch.Tensor, expected: torch.Tensor) -> TensorComparison:
    a, e = got.detach().cpu(), expected.detach().cpu()
    if a.element_size() == 1:
        a = a.view(torch.uint8)
    if e.element_size() == 1:
        e = e.view(torch.uint8)
    return compare_tensors(name, a.reshape(e.shape) if a.numel() == e.numel() else a, e, tier="exact")


def _source_of(source: Optional[torch.Tensor], ref: QuantizedTensor) -> Optional[torch.Tensor]:
    """The reference's high-precision source of an operand, when it has the operand's elements."""
    return source if source is not None and source.numel() == ref.numel() else None


def _missing(name: str) -> TensorComparison:
    return absent(name, "the candidate exposes an operand under a name the reference has none of")
