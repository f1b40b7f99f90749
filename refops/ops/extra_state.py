"""Extra state (recipe state in checkpoints) as one string of bytes, without pickle.

Layout: ``b"REFOPS\\x01\\x00"`` (8 bytes), the JSON header's length (8 bytes,
little-endian), the UTF-8 JSON header, then the raw bytes of every tensor, in
order. The header mirrors the saved object, with each tensor replaced by
``{"__tensor__": i, "dtype": ..., "shape": [...], "offset": ..., "nbytes": ...}``.
Tensors round-trip bit-exactly; decoding never executes code. An empty state is
encoded too (``{}``), never ``b""``: ``torch.save`` writes empty bytes as a call of ``bytes``,
which ``torch.load(weights_only=True)`` refuses. ``b""``, an empty tensor and ``None`` still decode
as "no state".

An op's ``_extra_state`` is these bytes (:func:`extra_state_bytes`), not a tensor, because
``torch.distributed.checkpoint`` loads a tensor in place and so needs one of the saved size in the
target, while the size of a recipe state is known only once a recipe ran; any other object DCP
stores whole and replaces on load (``docs/distributed.md#extra-state-in-distributed-checkpoints``).
The same bytes as a uint8 tensor (:func:`encode_extra_state`, what refops stored before, and the
container of the legacy quantized-weight form) still decode.
"""

from __future__ import annotations

import io
import json
import sys
from typing import Any

import torch

from .checkpoint_errors import DCP_CHECK, CheckpointMismatchError

__all__ = ["extra_state_bytes", "encode_extra_state", "decode_extra_state", "load_extra_state",
           "extra_state_type_error"]

_MAGIC = b"REFOPS\x01\x00"
_DTYPES = {
    str(dt).removeprefix("torch."): dt
    for dt in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
        torch.uint8,
        torch.int8,
        torch.int32,
        torch.int64,
        torch.bool,
    )
}


def encode_extra_state(state: dict[str, Any]) -> torch.Tensor:
    """:func:`extra_state_bytes` as a 1-D uint8 tensor."""
    return torch.frombuffer(bytearray(extra_state_bytes(state)), dtype=torch.uint8).clone()


def extra_state_bytes(state: dict[str, Any]) -> bytes:
    """Serialize a tree of dicts, lists, scalars, strings, None and tensors into bytes."""
    blobs: list[bytes] = []
    offset = 0

    def encode(obj: Any) -> Any:
        nonlocal offset
        if isinstance(obj, torch.Tensor):
            flat = obj.detach().to("cpu").contiguous().reshape(-1)
            raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
            entry = {
                "__tensor__": len(blobs),
                "dtype": str(obj.dtype).removeprefix("torch."),
                "shape": list(obj.shape),
                "offset": offset,
                "nbytes": len(raw),
            }
            if entry["dtype"] not in _DTYPES:
                raise TypeError(f"extra state: unsupported tensor dtype {obj.dtype}")
            blobs.append(raw)
            offset += len(raw)
            return entry
        if isinstance(obj, dict):
            if not all(isinstance(k, str) for k in obj):
                raise TypeError("extra state: dict keys must be strings")
            return {k: encode(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [encode(v) for v in obj]
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        raise TypeError(f"extra state: cannot serialize {type(obj).__name__} without pickle")

    header = json.dumps(encode(state)).encode("utf-8")
    return _MAGIC + len(header).to_bytes(8, "little") + header + b"".join(blobs)


def _is_dcp_placeholder(data: Any) -> bool:
    """Whether ``data`` is the object ``set_model_state_dict`` passes for an ``_extra_state`` key missing from
    the loaded dict (``torch.distributed.checkpoint.state_dict._EXTRA_STATE``; only looked up if loaded)."""
    module = sys.modules.get("torch.distributed.checkpoint.state_dict")
    placeholder = getattr(module, "_EXTRA_STATE", None) if module is not None else None
    return placeholder is not None and isinstance(data, placeholder)


def extra_state_type_error(data: Any) -> str | None:
    """Why ``data`` cannot be an op's extra state at all (None: it can, or it means "no state")."""
    if data is None or _is_dcp_placeholder(data) or isinstance(data, (bytes, bytearray, torch.Tensor)):
        return None
    hint = " (TE's older pickled format, which refops refuses: loading it would run code)" if isinstance(
        data, io.BytesIO) else ""
    return (f"extra state must be bytes written by refops (or the uint8 tensor of an older refops checkpoint, "
            f"or None for no state), got a {type(data).__module__}.{type(data).__qualname__}{hint}")


def decode_extra_state(data: Any, *, owner: str = "extra state") -> dict[str, Any]:
    """Inverse of :func:`encode_extra_state`.

    "No state" (``{}``) is ``b""``, an empty tensor, ``None``, or the placeholder object that
    ``torch.distributed.checkpoint``'s ``set_model_state_dict`` passes for an ``_extra_state`` key
    missing from the loaded dict. Anything else that is not a tensor (an ``io.BytesIO`` of TE's
    pickled format, a dict) is a ``TypeError`` naming ``owner``: dropping it would lose the state
    without a word. A tensor that is not refops extra state (wrong dtype, bad magic, a truncated or
    corrupted payload) is an error naming ``owner``.
    """
    problem = extra_state_type_error(data)
    if problem is not None:
        raise TypeError(f"{owner}: {problem}")
    if data is None or _is_dcp_placeholder(data):
        return {}
    if (data.numel() if isinstance(data, torch.Tensor) else len(data)) == 0:
        return {}
    if isinstance(data, torch.Tensor) and data.dtype != torch.uint8:
        raise TypeError(f"{owner}: extra state must be bytes or a uint8 tensor written by refops, got a tensor of "
                        f"dtype {data.dtype}")
    raw = bytes(data) if not isinstance(data, torch.Tensor) else data.detach().to("cpu").reshape(-1).numpy().tobytes()
    if raw[:8] != _MAGIC:
        raise ValueError(f"{owner}: extra state was not written by refops (bad magic); pickled TE extra state is refused")
    try:
        return _decode_payload(raw)
    except (ValueError, KeyError, TypeError, IndexError, RuntimeError, UnicodeDecodeError) as error:
        raise ValueError(f"{owner}: the extra state is corrupted or truncated ({type(error).__name__}: {error})") from error


def _decode_payload(raw: bytes) -> dict[str, Any]:
    """The JSON header and tensor bytes after the magic; raises on any inconsistency."""
    header_len = int.from_bytes(raw[8:16], "little")
    if len(raw) < 16 + header_len:
        raise ValueError(f"the header needs {header_len} bytes but only {len(raw) - 16} follow")
    body = raw[16 + header_len :]
    header = json.loads(raw[16 : 16 + header_len].decode("utf-8"))

    def decode(obj: Any) -> Any:
        if isinstance(obj, dict) and "__tensor__" in obj:
            if obj["offset"] + obj["nbytes"] > len(body):
                raise ValueError(f"tensor {obj['__tensor__']} runs past the end of the payload")
            chunk = body[obj["offset"] : obj["offset"] + obj["nbytes"]]
            dtype = _DTYPES[obj["dtype"]]
            if not chunk:
                return torch.empty(obj["shape"], dtype=dtype)
            flat = torch.frombuffer(bytearray(chunk), dtype=torch.uint8).view(dtype)
            return flat.reshape(obj["shape"]).clone()
        if isinstance(obj, dict):
            return {k: decode(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [decode(v) for v in obj]
        return obj

    decoded = decode(header)
    if not isinstance(decoded, dict):
        raise ValueError(f"the payload holds a {type(decoded).__name__}, not a dict")
    return decoded


def load_extra_state(op: Any, data: Any) -> None:
    """``op.set_extra_state(data)``, all or nothing: a failure leaves ``op``'s recipe state as it was.

    Invariant: either the whole saved state is applied, or ``op`` keeps its previous recipe
    state (objects and values) and a :class:`~refops.ops.checkpoint_errors.CheckpointMismatchError` (a
    ``ValueError``) names the op and what did not fit (extra state saved by a different op, or a different
    recipe configuration), and the refops load that checks a distributed checkpoint before writing anything.
    """
    owner = type(op).__name__
    state = decode_extra_state(data, owner=owner)
    if not state:
        return
    saved_objects = (op._recipe_states, op._quantizers)
    saved_values = decode_extra_state(encode_extra_state(op._extra_state_dict()))  # a copy, not the live tensors
    try:
        op._load_extra_state_dict(state)
    except Exception as error:  # noqa: BLE001 - restored, then reported with the op's name
        op._recipe_states, op._quantizers = saved_objects
        if saved_values:
            op._load_extra_state_dict(saved_values)
        raise CheckpointMismatchError(
            f"{owner}: the extra state does not fit this op (saved by another op or another recipe "
            f"configuration?); the op's recipe state is unchanged ({type(error).__name__}: {error}); {DCP_CHECK}"
        ) from error
