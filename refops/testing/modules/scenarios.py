"""The training script ``compare_modules`` runs on every side: where real bugs live is in training, not in one
fresh step.

Every side (the candidate, the reference, the reference's twins) runs the same script, step by step, each
step from the same random-generator state (so a Dropout draws the same mask on every side), each run from
cleared ``.grad``\\ s. The scenarios, in the order they run (:data:`SCENARIOS`):

* ``"one step"``: one forward and backward of the inputs, with the given (or the seeded unit) output grad.
  Its tensors keep their plain names (``"output"``, ``"input[0].grad"``, ``"1.weight.grad"``);
* ``"grad scales"``: output grads of realistic magnitudes, far from unit scale (2^-24 and 2^8; 2^-12 and
  2^4 for fp16 outputs): a grad cast with a stale or unit scale underflows or saturates;
* ``"input layouts"``: the same values non-contiguous (a transposed-back view) and starting partway into
  their storage, the inputs first, then the output grad: a kernel that reads its input's (or its backward's
  output grad's) memory as contiguous, or from the storage's start, shows;
* ``"row-spread input"``: the inputs' rows scaled by powers of two from 2^-8 to 2^8, so that a row-wise and
  a column-wise quantization of them differ (a GEMM that reads the wrong copy shows);
* ``"microbatches"``: forward 1, forward 2 (other values, another amax), backward 1, backward 2, the
  parameter grads accumulated: a backward that reads state the second forward overwrote shows;
* ``"training"``: three optimizer steps (SGD, each parameter's step a quarter of its rms, the rates taken
  from the reference's first grads and used on every side), with an eval forward under ``no_grad`` between
  the first and the second: caches of the weights (a transpose, a column-wise copy) must follow every update.

A tensor's record is keyed ``(scenario, step, tensor)``.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, ContextManager, Iterable, Optional, Sequence

import torch

from .sides import Side, values_of

__all__ = ["SCENARIOS", "DEFAULT_GRAD_SEED", "Key", "default_grad", "run_script", "second_microbatch"]

#: The scenarios ``compare_modules`` runs by default, in order.
SCENARIOS = ("one step", "grad scales", "input layouts", "row-spread input", "microbatches", "training")

#: The seed of the default output grad: zero-mean standard normal, the same on every call.
DEFAULT_GRAD_SEED = 20251205

#: The SGD step of each parameter, as a share of its rms.
STEP_SHARE = 0.25
TRAINING_STEPS = 3

Key = tuple[str, str, str]


def default_grad(shape: Sequence[int], dtype: torch.dtype, device: Any, *, seed: int = DEFAULT_GRAD_SEED,
                 magnitude: float = 1.0) -> torch.Tensor:
    """A seeded zero-mean normal output grad of ``magnitude``, rounded to the output's dtype once."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    values = torch.randn(tuple(shape), generator=generator, dtype=torch.float32) * magnitude
    return values.to(dtype=dtype).to(device)


def grad_magnitudes(dtype: torch.dtype) -> tuple[float, float]:
    """The output-grad magnitudes of the "grad scales" scenario: far below and above unit scale, in range."""
    return (2.0 ** -12, 2.0 ** 4) if dtype == torch.float16 else (2.0 ** -24, 2.0 ** 8)


def second_microbatch(inputs: Sequence[Any]) -> list[Any]:
    """Other values of the same shapes: the rows in reverse order, twice as large (another amax)."""
    return [x.flip(0) * 2 if _floating(x) and x.dim() > 0 else x for x in inputs]


def row_spread(inputs: Sequence[Any]) -> list[Any]:
    """The inputs with row ``i`` scaled by ``2^(5i mod 17 - 8)``: exact, and far apart across rows."""
    out = []
    for x in inputs:
        if _floating(x) and x.dim() >= 2:
            rows = x.reshape(-1, x.shape[-1]).shape[0]
            powers = torch.tensor([float(2.0 ** ((5 * i) % 17 - 8)) for i in range(rows)], dtype=x.dtype,
                                  device=x.device)
            x = (x.reshape(rows, -1) * powers[:, None]).reshape(x.shape)
        out.append(x)
    return out


def non_contiguous(x: Any) -> Any:
    """The same values in a non-contiguous layout (the last dim strided), where the tensor has two or more dims."""
    if _floating(x) and x.dim() >= 2:
        return x.transpose(0, -1).contiguous().transpose(0, -1)
    return x


#: How far into its storage the "storage offset" layout starts a tensor: 512 bytes, the CUDA allocator's block
#: alignment, so the slice is as aligned as a fresh tensor and a kernel that needs aligned pointers is held only
#: to honouring the offset (``docs/oracle.md#compare_modules-a-candidate-against-the-reference``).
STORAGE_OFFSET_BYTES = 512


def with_storage_offset(x: Any) -> Any:
    """The same values starting 512 bytes into their storage (as aligned as a fresh allocation)."""
    if _floating(x) and x.numel():
        offset = STORAGE_OFFSET_BYTES // x.element_size()
        backing = torch.zeros(x.numel() + offset, dtype=x.dtype, device=x.device)
        return backing[offset:].view(x.shape).copy_(x)
    return x


def _floating(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


class _Script:
    """Runs each step on every side from the same generator state and records what it produced."""

    def __init__(self, sides: Sequence[Side], inputs: Sequence[Any], grad_output: Optional[torch.Tensor],
                 seed: int, observe: Callable[[Side], ContextManager[Any]]) -> None:
        self.sides, self.inputs, self.seed, self.observe = list(sides), list(inputs), seed, observe
        self.grad_output = grad_output
        self.records: dict[str, dict[Key, torch.Tensor]] = {s.name: {} for s in self.sides}
        self._steps = 0
        self._output_like: Optional[torch.Tensor] = None

    def each(self, run: Callable[[Side], None], label: str, *, observed: bool = False) -> None:
        """``run(side)`` on every side still in the script, each from the step's generator state. A twin or the
        candidate that raises leaves the script (``side.failure`` says where and what); the reference raises."""
        self._steps += 1
        for side in list(self.sides):
            torch.manual_seed(self.seed + self._steps)
            try:
                with self.observe(side) if observed else contextlib.nullcontext():
                    run(side)
            except Exception as error:  # noqa: BLE001 - a twin's or the candidate's failure is reported
                if side.name == "reference":
                    raise
                side.failure = f"at {label}: {type(error).__name__}: {error}"
                side.done()
                self.sides.remove(side)

    def grad(self, y: torch.Tensor, *, magnitude: float = 1.0, index: int = 0) -> torch.Tensor:
        """The output grad of the current step, the same tensor on every side (shaped like the first side's y)."""
        if self._output_like is None:
            self._output_like = y.detach()
        if self.grad_output is not None and index == 0:
            base = self.grad_output
            return base if magnitude == 1.0 else (base.double() * magnitude).to(base.dtype)
        like = self._output_like
        seed = DEFAULT_GRAD_SEED if self._steps == 1 else DEFAULT_GRAD_SEED + 7919 * self._steps + index
        return default_grad(like.shape, like.dtype, like.device, seed=seed, magnitude=magnitude)

    def record(self, side: Side, scenario: str, step: str, y: torch.Tensor,
               input_grads: Iterable[Optional[torch.Tensor]], *, parameters: bool = True) -> None:
        out = self.records[side.name]
        out[(scenario, step, "output")] = y.detach().clone()
        for i, g in enumerate(input_grads):
            if g is not None:
                out[(scenario, step, f"input[{i}].grad")] = g.detach().clone()
        if parameters:
            for name, g in side.parameter_grads().items():
                if g is not None:
                    label = name if name.endswith(".main_grad") else f"{name}.grad"
                    out[(scenario, step, label)] = g.detach().clone()

    def forward_backward_on(self, side: Side, scenario: str, step: str, inputs: Sequence[Any], *,
                            magnitude: float = 1.0, grad_layout: Callable[[Any], Any] = lambda g: g) -> None:
        """One forward and backward of ``side`` from cleared grads, recorded under ``(scenario, step)``; the
        output grad's values as always, laid out by ``grad_layout``."""
        side.clear_grads()
        y, _ = side.forward(inputs)
        grads = side.backward(grad_layout(self.grad(y, magnitude=magnitude)))
        side.done()
        self.record(side, scenario, step, y, grads)

    def forward_backward(self, scenario: str, step: str, inputs: Sequence[Any], *, magnitude: float = 1.0,
                         observed: bool = False, grad_layout: Callable[[Any], Any] = lambda g: g) -> None:
        self.each(lambda side: self.forward_backward_on(side, scenario, step, inputs, magnitude=magnitude,
                                                        grad_layout=grad_layout),
                  f"{scenario}, {step}" if step else scenario, observed=observed)


def _one_step(script: _Script) -> None:
    script.forward_backward("one step", "", script.inputs, observed=True)


def _grad_scales(script: _Script) -> None:
    dtype = script._output_like.dtype if script._output_like is not None else torch.float32
    for magnitude in grad_magnitudes(dtype):
        script.forward_backward("grad scales", f"dy x 2^{round(math.log2(magnitude))}", script.inputs,
                                magnitude=magnitude)


def _input_layouts(script: _Script) -> None:
    if any(non_contiguous(x) is not x for x in script.inputs):
        script.forward_backward("input layouts", "non-contiguous", [non_contiguous(x) for x in script.inputs])
    script.forward_backward("input layouts", "storage offset", [with_storage_offset(x) for x in script.inputs])
    # The output grad arrives as the op downstream produced it: a transpose's backward hands a strided one.
    if script._output_like is not None and script._output_like.dim() >= 2:
        script.forward_backward("input layouts", "output grad non-contiguous", script.inputs,
                                grad_layout=non_contiguous)
    script.forward_backward("input layouts", "output grad storage offset", script.inputs,
                            grad_layout=with_storage_offset)


def _row_spread(script: _Script) -> None:
    script.forward_backward("row-spread input", "", row_spread(script.inputs))


def _microbatches(script: _Script) -> None:
    second = second_microbatch(script.inputs)

    def run(side: Side) -> None:
        side.clear_grads()
        y1, _ = side.forward(script.inputs)
        y2, _ = side.forward(second)
        g1 = side.backward(script.grad(y1, index=1), 0)
        g2 = side.backward(script.grad(y2, index=2), 1)
        side.done()
        script.record(side, "microbatches", "microbatch 1", y1, g1, parameters=False)
        script.record(side, "microbatches", "microbatch 2", y2, g2, parameters=False)
        script.record(side, "microbatches", "accumulated", y2, [], parameters=True)
        del script.records[side.name][("microbatches", "accumulated", "output")]

    script.each(run, "microbatches")


def _training(script: _Script) -> None:
    rates: dict[str, float] = {}
    for step in range(1, TRAINING_STEPS + 1):
        inputs = [torch.roll(x, step, 0) if _floating(x) and x.dim() > 0 else x for x in script.inputs]
        if step == 2:
            # The eval forward and the next training step run on one side before the next side starts: amaxes
            # recorded under no_grad wait for the next grad-enabled autocast exit, which updates every state
            # waiting (TE's global state does the same), so another side's forward in between would run it.
            def evaluate_then_train(side: Side) -> None:
                script.records[side.name][("training", "eval forward after step 1", "output")] = \
                    side.eval_forward(previous).clone()
                script.forward_backward_on(side, "training", f"step {step}", inputs)

            script.each(evaluate_then_train, f"training, eval forward after step 1 and step {step}")
        else:
            script.forward_backward("training", f"step {step}", inputs)
        if not rates:
            rates = _rates(next(s for s in script.sides if s.name == "reference"))  # the reference never leaves
        if step < TRAINING_STEPS:
            script.each(lambda side: side.sgd_step(rates), f"training, the optimizer step after step {step}")
        previous = inputs


def _rates(reference: Side) -> dict[str, float]:
    """Each parameter's SGD rate: a step of a quarter of its rms (none where the grad is zero)."""
    rates = {}
    for name, p in reference.module.named_parameters():
        if p.grad is None:
            continue
        grad_rms = float(values_of(p.grad).detach().double().square().mean().sqrt())
        value_rms = float(values_of(p).detach().double().square().mean().sqrt())
        if grad_rms > 0 and math.isfinite(grad_rms):
            rates[name] = STEP_SHARE * (value_rms if value_rms > 0 else 1.0) / grad_rms
    return rates


_RUNNERS = {"one step": _one_step, "grad scales": _grad_scales, "input layouts": _input_layouts,
            "row-spread input": _row_spread,
            "microbatches": _microbatches, "training": _training}


def run_script(sides: Sequence[Side], inputs: Sequence[Any], grad_output: Optional[torch.Tensor], *,
               scenarios: Sequence[str] = SCENARIOS, seed: int = 0,
               observe: Callable[[Side], ContextManager[Any]] = lambda side: contextlib.nullcontext(),
               after_first_step: Callable[[], None] = lambda: None) -> dict[str, dict[Key, torch.Tensor]]:
    """Every side through ``scenarios`` ("one step" always first); ``{side name: {(scenario, step, tensor): t}}``.

    ``observe(side)`` wraps each side's run of "one step" (the oracle records the quantizer calls there);
    ``after_first_step()`` runs once every side has done it (the oracle snapshots the recipe states).
    """
    script = _Script(sides, inputs, grad_output, seed, observe)
    _one_step(script)
    after_first_step()
    for name in scenarios:
        if name != "one step":
            _RUNNERS[name](script)
    return script.records
