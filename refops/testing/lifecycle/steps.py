"""Running the module under test: one forward and backward, and a few training steps.

Every run reseeds torch's RNG first, so two modules that hold the same state compute
the same step bit for bit (dropout included), and any failure is a violation that
says which run failed.
"""

from __future__ import annotations

import torch

from .evidence import describe_exception
from .probe import NotApplicable, Subject, Violation

__all__ = ["TRAINING_STEPS", "run_step", "trainable", "train"]

#: How many training steps run before a checkpoint is taken: enough for delayed scaling's amax history to
#: hold several different amaxes, so the scales it derives are no longer the initial ones.
TRAINING_STEPS = 3

#: The learning rate of those steps: large enough that every weight, quantized ones included, changes.
LEARNING_RATE = 0.1


def trainable(module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The module's parameters; not applicable when it has none, or none that requires grad."""
    params = dict(module.named_parameters())
    if not params:
        raise NotApplicable("the module has no parameters")
    if not any(p.requires_grad for p in params.values()):
        raise NotApplicable("no parameter requires grad")
    return params


def run_step(s: Subject, module: torch.nn.Module, what: str, *, backward: bool = True,
             scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Forward (and backward) under a fixed seed, on the inputs times ``scale``; a failure is a violation
    naming ``what``.

    Returns the outputs as ``{"#0": y0, ...}``.
    """
    args = s.fresh_inputs(scale=scale)
    torch.manual_seed(s.seed + 1)
    try:
        with torch.set_grad_enabled(backward):
            outputs = s.forward_backward(module, args)
    except Exception as error:  # noqa: BLE001  (any failure is evidence)
        step = "forward/backward" if backward else "forward"
        raise Violation(f"{step} {what} raised {describe_exception(error)}") from error
    return {f"#{i}": y for i, y in enumerate(outputs)}


def train(s: Subject, module: torch.nn.Module, steps: int = TRAINING_STEPS) -> None:
    """``steps`` training steps: forward, backward and an SGD step, the inputs scaled by 1, 2, 3... so that
    state that follows the data (an amax history) moves. The module runs as it is called, so a recipe the
    factory wrapped around its forward applies. Leaves no grads behind."""
    optimizer = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=LEARNING_RATE)
    for step in range(steps):
        run_step(s, module, f"at training step {step + 1}", scale=float(step + 1))
        try:
            optimizer.step()
        except Exception as error:  # noqa: BLE001  (any failure is evidence)
            raise Violation(f"the optimizer step at training step {step + 1} raised "
                            f"{describe_exception(error)}") from error
        optimizer.zero_grad(set_to_none=True)
