"""Evidence for the lifecycle checks: what a module holds, how two modules differ, in words.

Comparisons are bit-exact (the first tier of ``docs/oracle.md#three-tiers-of-comparison``):
a deferred-initialized module must hold the very bytes the
eagerly built one holds, so a difference is reported with its maximum absolute
value rather than tolerated.
"""

from __future__ import annotations

import enum
from typing import Any, Optional

import torch

__all__ = [
    "alias_changes",
    "alias_structure",
    "bit_equal",
    "compare_tensors",
    "describe_aliases",
    "describe_kind",
    "describe_exception",
    "grads",
    "max_difference",
    "named_tensors",
    "output_tensors",
    "plural",
    "quantization_differences",
    "quantization_state",
    "storage_keys",
    "weighted_sum",
]


def plural(count: int, noun: str, nouns: Optional[str] = None) -> str:
    """``"1 tensor"``, ``"2 tensors"``."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"


def describe_exception(error: BaseException) -> str:
    """``Type: first line of the message``, short enough for a table cell."""
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    if len(message) > 160:
        message = message[:157] + "..."
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def output_tensors(output: Any) -> list[torch.Tensor]:
    """The floating-point tensors of a forward's output (a tensor, or nested tuples and lists)."""
    if isinstance(output, torch.Tensor):
        return [output] if output.is_floating_point() else []
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in output_tensors(item)]
    return []


def weighted_sum(outputs: list[torch.Tensor]) -> Optional[torch.Tensor]:
    """``sum_i w_i y_i`` with a fixed ramp ``w`` in [-1, 1], or None when nothing requires grad.

    A ramp rather than a plain sum, so that no grad vanishes by symmetry (the grads
    of a normalization's affine terms under a plain sum, for example).
    """
    terms = []
    for y in outputs:
        if y.requires_grad:
            ramp = torch.linspace(-1.0, 1.0, y.numel(), device=y.device, dtype=torch.float32).reshape(y.shape)
            terms.append((y.float() * ramp).sum())
    return torch.stack(terms).sum() if terms else None


def named_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers by their first name (each object once)."""
    tensors = dict(module.named_parameters())
    tensors.update(dict(module.named_buffers()))
    return tensors


def alias_structure(module: torch.nn.Module) -> list[tuple[str, ...]]:
    """Which names share a tensor: every name of every parameter and buffer, grouped by object.

    Two modules with equal structures agree on every alias (``a is b``) and on every
    non-alias (``a is not b``).
    """
    groups: dict[int, list[str]] = {}
    named = list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False))
    for name, tensor in named:
        groups.setdefault(id(tensor), []).append(name)
    return sorted(tuple(sorted(names)) for names in groups.values())


def shared_aliases(structure: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    return [group for group in structure if len(group) > 1]


def max_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    try:
        return f"{(a.detach().double() - b.detach().double()).abs().max().item():.3g}"
    except Exception:  # noqa: BLE001  (quantized or empty tensors)
        return "n/a"


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes (NaNs with equal bits compare equal)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    try:
        return torch.equal(a.detach().contiguous().view(torch.uint8), b.detach().contiguous().view(torch.uint8))
    except (RuntimeError, TypeError):
        return bool(torch.equal(a.detach(), b.detach()))


def _is_subclass(t: torch.Tensor) -> bool:
    """A tensor subclass (a quantized tensor), rather than a plain tensor or ``Parameter``."""
    return type(t) not in (torch.Tensor, torch.nn.Parameter, torch.nn.Buffer)


def _simple(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str, enum.Enum, torch.dtype, type))


def quantization_state(t: torch.Tensor) -> tuple[str, dict[str, Optional[torch.Tensor]], dict[str, Any], set[str]]:
    """``(kind, inner tensors, settings, stale)`` of ``t``.

    ``kind`` is ``"plain"`` for a plain tensor or ``Parameter``, else the subclass's
    name (``"MXFP8Tensor"``). For a subclass that flattens itself (refops' and TE's
    quantized tensors do, through ``__tensor_flatten__``), the inner tensors present
    (data and scales of each usage) and the settings that are plain values (the FP8
    dtype...; quantizer objects and ``requires_grad`` are not part of the state).
    ``stale`` names inner tensors the tensor itself marks out of date (see :func:`_drop_caches`).
    """
    if not _is_subclass(t):
        return "plain", {}, {}, set()
    inner: dict[str, Optional[torch.Tensor]] = {}
    settings: dict[str, Any] = {}
    stale: set[str] = set()
    flatten = getattr(t, "__tensor_flatten__", None)
    if callable(flatten):
        try:
            names, context = flatten()
        except Exception:  # noqa: BLE001  (a subclass that cannot flatten: compared by kind only)
            names, context = [], {}
        inner = {name: getattr(t, name, None) for name in names}
        items = dict(context) if isinstance(context, dict) else {}
        nested = items.pop("nontensor_kwargs", None)  # TE keeps its settings one level down
        if isinstance(nested, dict):
            items.update(nested)
        settings = {k: v for k, v in items.items() if _simple(v) and k not in ("requires_grad", "cls", "is_tensor")}
        stale = _drop_caches(inner, settings)
    return type(t).__name__, inner, settings, stale


def _drop_caches(inner: dict[str, Optional[torch.Tensor]], settings: dict[str, Any]) -> set[str]:
    """Leave out what is cache, not quantization state; return the inner tensors marked stale.

    TE keeps a transposed copy that an in-place update marks stale (``transpose_invalid=True``: its
    bytes are old, and it is rebuilt when needed), and a flag saying whether the scales are already in
    the GEMM's swizzled layout: the same weight may differ in both depending on what ran last.
    """
    stale: set[str] = set()
    for key in [k for k in settings if "invalid" in k.lower()]:
        stem = key.lower().removeprefix("_").removesuffix("_invalid")
        if settings.pop(key) is True:
            stale |= {n for n in inner if stem in n.lower()}
    for key in [k for k in settings if "swizzle" in k.lower()]:
        settings.pop(key)
    return stale


def describe_kind(t: torch.Tensor) -> str:
    """``"a plain float32 tensor"`` or ``"MXFP8Tensor (_rowwise_data, _rowwise_scale_inv, ...)"``."""
    kind, inner, _, _ = quantization_state(t)
    if kind == "plain":
        return f"a plain {str(t.dtype).removeprefix('torch.')} tensor"
    present = [name for name, value in inner.items() if value is not None]
    return f"{kind} ({', '.join(present)})" if present else kind


def quantization_differences(actual: torch.Tensor, expected: torch.Tensor) -> list[str]:
    """How the quantization state of ``actual`` differs from ``expected``'s (empty: the same).

    The kind, the inner tensors present (which usages), their dtypes and shapes, the settings,
    and the bytes of every inner tensor but the scales. Scale bytes are left to the value
    comparison: with equal codes, a scale can differ without changing a value only in padding
    (unspecified: ``docs/recipes/index.md#stored-layouts``) or in a block whose codes are all zero.
    """
    kind_a, inner_a, settings_a, stale_a = quantization_state(actual)
    kind_e, inner_e, settings_e, stale_e = quantization_state(expected)
    if kind_a != kind_e:
        return [f"is {describe_kind(actual)}, expected {describe_kind(expected)}"]
    problems = []
    stale = stale_a | stale_e  # out of date on either side: neither its presence nor its bytes say anything
    present_a = sorted(n for n, v in inner_a.items() if v is not None and n not in stale)
    present_e = sorted(n for n, v in inner_e.items() if v is not None and n not in stale)
    if present_a != present_e:
        problems.append(f"holds {', '.join(present_a) or 'no inner tensors'}, expected {', '.join(present_e)}")
    for name in sorted(set(present_a) & set(present_e)):
        a, e = inner_a[name], inner_e[name]
        if a.dtype != e.dtype or a.shape != e.shape:
            problems.append(f"{name} is {a.dtype}{list(a.shape)}, expected {e.dtype}{list(e.shape)}")
        elif "scale" not in name and not bit_equal(a, e):
            problems.append(f"{name} differs in {int((_bytes(a) != _bytes(e)).sum())} bytes")
    changed = sorted(k for k in settings_a.keys() | settings_e.keys() if settings_a.get(k) != settings_e.get(k))
    problems += [f"{k} is {settings_a.get(k)!r}, expected {settings_e.get(k)!r}" for k in changed]
    return problems


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.uint8).reshape(-1)


def storage_keys(t: torch.Tensor) -> set[tuple]:
    """Where ``t``'s bytes live: ``(device, data pointer)`` of each storage that holds some.

    A quantized tensor (a wrapper subclass) holds no bytes itself: TE's report an
    empty storage (data pointer 0) for every one of them, which must not read as two
    tensors sharing memory. Its bytes are in its inner tensors, whose storages count.
    """
    keys: set[tuple] = set()
    if _is_subclass(t):
        for inner in quantization_state(t)[1].values():
            if isinstance(inner, torch.Tensor):
                keys |= storage_keys(inner)
        if keys:
            return keys
    if t.is_meta or t.numel() == 0:
        return keys
    try:
        storage = t.untyped_storage()
        pointer, size = storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):
        return keys
    if pointer and size:
        keys.add((t.device, pointer))
    return keys


def compare_tensors(
    actual: dict[str, Optional[torch.Tensor]],
    expected: dict[str, Optional[torch.Tensor]],
    *,
    what: str = "",
    device: Optional[torch.device] = None,
) -> list[str]:
    """The differences between two ``{name: tensor}`` maps, one sentence each (empty: bit-identical).

    A tensor must also be of the same kind as its counterpart: quantized alike (the same
    class, usages and format, :func:`quantization_differences`) or plain alike. A quantized
    weight that came back as a plain tensor holding its dequantized values is a difference.

    Args:
        actual: the tensors observed (``None`` for a missing grad).
        expected: the tensors they must equal.
        what: how the sentences name the tensors, for example ``"grad of"``.
        device: where every actual tensor must be (not checked when ``None``).
    """
    problems = []
    if actual.keys() != expected.keys():
        problems.append(f"{what} names differ: {sorted(actual)} vs {sorted(expected)}".lstrip())
    for name in sorted(actual.keys() & expected.keys()):
        a, e, label = actual[name], expected[name], f"{what} {name}".lstrip()
        if a is None or e is None:
            if (a is None) != (e is None):
                problems.append(f"{label} is {'missing' if a is None else 'present but not expected'}")
        elif device is not None and a.device != device:
            problems.append(f"{label} is on {a.device}, expected {device}")
        elif quantization_differences(a, e):
            problems.append(f"{label} " + "; ".join(quantization_differences(a, e)))
        elif a.dtype != e.dtype or a.shape != e.shape:
            problems.append(f"{label} is {a.dtype}{list(a.shape)}, expected {e.dtype}{list(e.shape)}")
        elif not bit_equal(a, e):
            problems.append(f"{label} differs (max |diff| {max_difference(a, e)})")
    return problems


def grads(module: torch.nn.Module) -> dict[str, Optional[torch.Tensor]]:
    """``{name: parameter.grad}``, each parameter once."""
    return {name: p.grad for name, p in module.named_parameters()}


def alias_changes(before: list[tuple[str, ...]], after: list[tuple[str, ...]]) -> list[str]:
    """How the alias structure changed: names that came apart, and names that became one object."""
    changes = []
    for group in shared_aliases(before):
        if not any(set(group) <= set(other) for other in after):
            changes.append(f"{' = '.join(group)} came apart")
    for group in shared_aliases(after):
        if not any(set(group) <= set(other) for other in before):
            changes.append(f"{' = '.join(group)} became one object")
    return changes


def describe_aliases(structure: list[tuple[str, ...]]) -> str:
    shared = shared_aliases(structure)
    if not shared:
        return "no two names share a tensor"
    return "aliases " + ", ".join(" = ".join(group) for group in shared)
