"""Where an op's parameters go when its constructor is given no ``device``.

TransformerEngine answers "on CUDA": its ``canonicalize_device(None)`` takes torch's
default device when that is a CUDA device and the current CUDA device otherwise, so
``te.ops.Linear(16, 8)`` holds CUDA parameters even where torch's default is the CPU.
TE code run as ``import refops as te`` on a GPU machine must get the same placement, or
its CUDA inputs meet CPU parameters. refops also runs where there is no GPU, and there an
explicit choice of device must be honoured. The rule (:func:`default_parameter_device`):

1. a device the user *set* wins, whatever its type: ``torch.set_default_device(d)`` or
   an enclosing ``with torch.device(d):`` block (``cpu`` included, where TE would still
   pick CUDA: TE cannot compute on the CPU, refops can);
2. otherwise the current CUDA device when CUDA is available (TE's answer);
3. otherwise the CPU.

The same rule decides where a meta-built op materializes (``parameter_lifecycle``). A
default device of ``meta`` counts as set: an op built under it is built on meta.

Telling "set to cpu" from "never set" reads what ``torch.get_default_device()`` reads:
the ``DeviceContext`` that ``torch.set_default_device`` and ``with torch.device(...)``
install (``torch.utils._device``). Should a torch release move that, a CPU default
counts as unset (TE's rule).
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["explicit_default_device", "default_parameter_device", "canonicalize_device"]


def explicit_default_device() -> Optional[torch.device]:
    """torch's default device if the user set one (``set_default_device``, ``with torch.device``), else None.

    The device is returned as it was set: ``cuda`` may come without an index. Passing the
    value back to ``torch.set_default_device`` restores the exact state (None unsets),
    where saving ``torch.get_default_device()`` would turn "unset" into "set to cpu".
    """
    try:
        from torch.overrides import _get_current_function_mode_stack
        from torch.utils._device import DeviceContext
    except ImportError:  # this torch does not say: a CPU default counts as unset (TE's reading)
        default = torch.get_default_device()
        return None if default.type == "cpu" else default
    # What torch.get_default_device() reads, without its probe allocation: the innermost
    # DeviceContext (``with torch.device`` pushes one), else the one set_default_device keeps.
    for mode in reversed(_get_current_function_mode_stack()):
        if isinstance(mode, DeviceContext):
            return mode.device
    context = getattr(getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None), "device_context", None)
    return None if context is None else context.device


def default_parameter_device() -> torch.device:
    """Where parameters go when no ``device`` is given: the set default, else the current CUDA device, else CPU.

    See the module docstring for why; a CUDA device always carries its index.
    """
    explicit = explicit_default_device()
    if explicit is not None:
        device = explicit
    elif torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def canonicalize_device(device: torch.device | str | int | None) -> torch.device:
    """``None`` means :func:`default_parameter_device`; an index-less ``cuda`` means the current CUDA device."""
    device = default_parameter_device() if device is None else torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device
