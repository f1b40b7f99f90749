"""Lifecycle properties of checkpoints: what ``state_dict()`` saves brings a fresh module back exactly.

An untrained module proves little: its extra state (delayed scaling's amax history and
scales, a quantized weight's ``scale_inv``) is still what any fresh module starts with,
so a checkpoint that drops it loads "exactly". The round trip after training runs a few
steps first, so that state has moved, and compares the next step of the reloaded module
with the original's.
"""

from __future__ import annotations

import io

import torch

from .evidence import bit_equal, compare_tensors, describe_exception, grads, named_tensors, plural
from .probe import NotApplicable, Subject, Violation
from .steps import TRAINING_STEPS, run_step, train

__all__ = ["checkpoint_round_trip", "checkpoint_round_trip_after_training"]


def _save_and_load(s: Subject, source: torch.nn.Module) -> torch.nn.Module:
    """``source.state_dict()`` through ``torch.save`` and ``torch.load(weights_only=True)`` into a module built
    under another seed (so that a load that silently does nothing shows)."""
    buffer = io.BytesIO()
    try:
        torch.save(source.state_dict(), buffer)
        buffer.seek(0)
        state = torch.load(buffer, weights_only=True)
        target = s.eager(seed_offset=2)
        target.load_state_dict(state)
    except Exception as error:  # noqa: BLE001
        raise Violation(f"saving and loading raised {describe_exception(error)}") from error
    return target


def _tensor_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict's tensors, and its bytes (a refops op's extra state) as uint8 tensors, so they compare too."""
    return {k: _as_uint8(v) if isinstance(v, bytes) else v
            for k, v in module.state_dict().items() if isinstance(v, (torch.Tensor, bytes))}


def _as_uint8(data: bytes) -> torch.Tensor:
    return torch.tensor(list(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


def checkpoint_round_trip(s: Subject) -> str:
    """``state_dict`` through ``torch.save`` and ``torch.load(weights_only=True)`` into a fresh module is exact."""
    source = s.eager()
    if not source.state_dict():
        raise NotApplicable("the module's state_dict is empty")
    with torch.no_grad():
        for p in source.parameters():
            if p.is_floating_point():
                p.add_(torch.randn_like(p))  # values no initializer produces, so a silent no-op load shows
    target = _save_and_load(s, source)
    expected = _tensor_state(source)
    problems = compare_tensors(_tensor_state(target), expected, what="state")
    problems += compare_tensors(named_tensors(target), named_tensors(source), what="tensor")
    ran = ""
    if s.inputs is not None:
        outputs = run_step(s, target, "of the loaded module", backward=False)
        reference = run_step(s, source, "of the source", backward=False)
        problems += compare_tensors(outputs, reference, what="output")
        ran = " and outputs"
    if problems:
        raise Violation("; ".join(problems))
    entries = plural(len(expected), "state entry", "state entries")
    return f"{entries}, parameters{ran} bit-identical after the round trip"


def checkpoint_round_trip_after_training(s: Subject) -> str:
    """After a few training steps, a fresh module that loads the ``state_dict`` computes the next step exactly.

    The steps (forward, backward, an SGD step; the module runs as it is called, under any recipe its
    factory wraps around it) move the parameters and any state the forward keeps: delayed scaling's amax
    history and scales, a quantized weight's scale. ``state_dict()`` goes through ``torch.save`` and
    ``torch.load(weights_only=True)`` into a module built under another seed; then both run one more
    step, and its outputs and grads must be bit-identical. So must those of a second hop: the loaded module's
    own ``state_dict()``, saved before it runs a forward, loaded into a third module (state that a module
    writes only after its own forward is lost there). A checkpoint that leaves out extra state is caught here
    even when the untrained round trip is exact.
    """
    source = s.eager()
    if not source.state_dict():
        raise NotApplicable("the module's state_dict is empty")
    s.fresh_inputs()  # not checked without inputs
    initial = {k: v.detach().clone() for k, v in _tensor_state(source).items()}
    train(s, source)
    moved = sorted(k for k, v in _tensor_state(source).items() if k not in initial or not bit_equal(v, initial[k]))
    # The state entries themselves are not compared: how a module encodes its state may differ between a
    # module that trained and one that loaded (a quantized weight re-quantized with the loading module's own
    # quantizer), so long as the next step does not. The untrained round trip compares them.
    target = _save_and_load(s, source)
    # A resumed job may checkpoint again before its first step (a conversion script, an early save): what the
    # loaded module saves must be the whole state too, not only what its own forwards have produced.
    resaved = _save_and_load(s, target)
    outputs = run_step(s, target, "of the loaded module")
    outputs_resaved = run_step(s, resaved, "of the module loaded from the loaded module's checkpoint")
    reference = run_step(s, source, "of the trained source")
    step = TRAINING_STEPS + 1
    problems = compare_tensors(outputs, reference, what=f"output of step {step}")
    problems += compare_tensors(grads(target), grads(source), what=f"grad at step {step} of")
    problems += [f"re-saved before its first forward: {p}" for p in
                 compare_tensors(outputs_resaved, reference, what=f"output of step {step}")
                 + compare_tensors(grads(resaved), grads(source), what=f"grad at step {step} of")]
    trained = (f"{TRAINING_STEPS} training steps (forward, backward, SGD step) moved "
               f"{plural(len(moved), 'state entry', 'state entries')}{' (' + ', '.join(moved) + ')' if moved else ''}")
    if problems:
        raise Violation(f"{trained}; after the round trip: " + "; ".join(problems))
    return (f"{trained}; a fresh module loaded from the checkpoint, and one loaded from that module's own checkpoint "
            f"saved before its first forward, compute step {step} like the original: "
            f"{plural(len(outputs), 'output')} and {plural(len(grads(source)), 'grad')} bit-identical")
