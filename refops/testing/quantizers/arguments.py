"""The arguments of :func:`refops.testing.check_quantizer`, validated before anything runs.

A check that runs nothing must not pass: an empty ``usages``, ``cases`` or
``dtypes``, or a selection whose cases run in none of the dtypes asked for, is a
``ValueError`` naming the argument, not a report that is "ok" after zero runs.
A wrong type (a string where a list of names is expected, a dtype where a list
of dtypes is, a candidate that cannot be called) is a ``TypeError`` saying what
was expected. Each error is raised once, before the first case is built.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from .cases import CASES, QuantizerCase
from .input_layouts import LAYOUTS, OPTIONAL_LAYOUTS

__all__ = ["OUTPUTS", "DTYPES", "USAGES", "LAYOUTS", "check_candidate", "check_usages", "check_dtypes",
           "check_layouts", "select_cases", "planned_runs"]

#: The output conventions a candidate may declare.
OUTPUTS = ("quantized_tensor", "data_and_scale_inv", "dequantized")
#: The input dtypes the quantizers take.
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: The orientations.
USAGES = ("rowwise", "columnwise")


def _names(dtypes: Sequence[torch.dtype]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_candidate(candidate: Any) -> Callable[..., Any]:
    """The candidate must be callable as ``candidate(x)`` or ``candidate(x, quantizer)``."""
    if not callable(candidate):
        raise TypeError(
            f"check_quantizer: candidate must be callable, candidate(x) or candidate(x, quantizer), "
            f"got {type(candidate).__name__} {candidate!r:.60}"
        )
    return candidate


def _as_list(value: Any, argument: str, item: str, example: str) -> list[Any]:
    if isinstance(value, (str, torch.dtype)) or not isinstance(value, Sequence) and not hasattr(value, "__iter__"):
        raise TypeError(
            f"check_quantizer: {argument} must be a list of {item}, got {type(value).__name__} {value!r} "
            f"(write {argument}=[{example}])"
        )
    return list(value)


def check_usages(usages: Any) -> list[str]:
    """A non-empty list of ``"rowwise"`` / ``"columnwise"`` (repeats dropped, order kept)."""
    given = _as_list(usages, "usages", "orientations", repr(usages) if isinstance(usages, str) else "'rowwise'")
    unknown = [u for u in given if u not in USAGES]
    if unknown:
        raise ValueError(f"check_quantizer: unknown usages {unknown}; usages are {USAGES}")
    if not given:
        raise ValueError(f"check_quantizer: usages is empty, so nothing would be checked; give some of {USAGES}")
    return list(dict.fromkeys(given))


def check_layouts(layouts: Any) -> list[str]:
    """A list of layouts among :data:`LAYOUTS` and ``OPTIONAL_LAYOUTS`` besides contiguous (repeats dropped, order
    kept). Empty is allowed: every case still runs on its contiguous input."""
    given = _as_list(layouts, "layouts", "layout names", repr(layouts) if isinstance(layouts, str) else "'expanded'")
    unknown = [layout for layout in given if layout not in LAYOUTS + OPTIONAL_LAYOUTS]
    if unknown:
        contiguous = " (contiguous runs always; leave it out)" if "contiguous" in unknown else ""
        raise ValueError(f"check_quantizer: unknown layouts {unknown}; layouts are {LAYOUTS + OPTIONAL_LAYOUTS}"
                         f"{contiguous}")
    return list(dict.fromkeys(given))


def check_dtypes(dtypes: Any) -> list[torch.dtype]:
    """A non-empty list of input dtypes among :data:`DTYPES` (repeats dropped, order kept)."""
    example = f"torch.{str(dtypes).removeprefix('torch.')}" if isinstance(dtypes, torch.dtype) else "torch.float32"
    given = _as_list(dtypes, "dtypes", "torch dtypes", example)
    for d in given:
        if not isinstance(d, torch.dtype):
            raise TypeError(f"check_quantizer: dtypes must hold torch dtypes, got {type(d).__name__} {d!r}")
    unsupported = [d for d in given if d not in DTYPES]
    if unsupported:
        raise ValueError(
            f"check_quantizer: dtypes {_names(unsupported)} are not input dtypes the quantizers take; "
            f"expected some of {_names(DTYPES)}"
        )
    if not given:
        raise ValueError(
            f"check_quantizer: dtypes is empty, so nothing would be checked; give some of {_names(DTYPES)}"
        )
    return list(dict.fromkeys(given))


def select_cases(cases: Optional[Any]) -> list[QuantizerCase]:
    """The cases named (None: every case), in matrix order."""
    if cases is None:
        return list(CASES)
    given = _as_list(cases, "cases", "case names", repr(cases) if isinstance(cases, str) else "'ties'")
    if not given:
        raise ValueError(
            "check_quantizer: cases is empty, so nothing would be checked; leave it out (None) to run every case, "
            f"or name some of {[c.name for c in CASES]}"
        )
    unknown = sorted(set(given) - {c.name for c in CASES})
    if unknown:
        raise ValueError(f"check_quantizer: unknown cases {unknown}; the cases are {[c.name for c in CASES]}")
    return [c for c in CASES if c.name in given]


def planned_runs(selected: Sequence[QuantizerCase], dtypes: Sequence[torch.dtype]) -> list[tuple[QuantizerCase, torch.dtype]]:
    """``(case, dtype)`` in matrix order; a ``ValueError`` when the selection holds none."""
    runs = [(case, d) for case in selected for d in (case.dtypes or dtypes) if d in dtypes]
    if not runs:
        only = "; ".join(f"{c.name} runs in {_names(c.dtypes or DTYPES)} only" for c in selected if c.dtypes)
        raise ValueError(
            f"check_quantizer: the selection runs nothing: {only}, and dtypes is [{_names(dtypes)}]"
        )
    return runs
