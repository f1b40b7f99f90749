"""Issue #31: a TE training loop gave an IndexError, then wrong numbers, after unrelated tests, on CUDA only.

What leaked: fusion functions. TE's API registers them for the whole process
(``te.ops.register_forward_fusion`` and siblings; there is no unregister), and TE's
``TestCustomOps`` registers one-shot functions that fuse the first two ops of whatever fuser
calls them next, without looking at their types, and disarm themselves when called. On the
H200, refops refused the first forward of three of those tests before any fusion function ran:
they build ``te.ops.Linear(...)`` without a device and feed CUDA inputs, and refops put the
parameters on the CPU. Their functions stayed armed, and the next fuser in the same pytest-xdist
worker, ``TestTrainingLoops``' ``Linear`` (``BasicLinear`` + ``Bias``), was fused with them: the
forward one-shot function indexed a one-op list (``IndexError``), the joint one computed
``SiLU(x W^T)`` in place of ``x W^T + b`` (wrong outputs). Why only on CUDA: on the CPU those three
tests passed, so each consumed its own function.

The fix is the default device (``refops.ops.placement``, ``tests/refops/ops/test_default_device.py``):
an op built without a device is on the current CUDA device, as under TE, so the three tests run
and consume their functions. ``benchmarks/gpu/te_tests_on_refops.py --isolate-fusion-registry``
also keeps one failing test from arming a fusion for the next (``test_state_leak_harness.py``).

These tests reproduce the sequence deterministically on the CPU (a dtype mismatch stands in for
the device mismatch: both are refused before fusion), and, marked ``gpu``, run TE's sequence on
CUDA with no default device set, which failed before the fix.
"""

from __future__ import annotations

from typing import Callable

import pytest
import torch

import refops as te
from refops.ops.fuser import OperationFuser
from refops.ops.placement import explicit_default_device


@pytest.fixture
def fusion_registries():
    """The process-wide fusion registries, put back as they were after the test."""
    registries = (
        OperationFuser.forward_backward_fusion_functions,
        OperationFuser.forward_fusion_functions,
        OperationFuser.backward_fusion_functions,
    )
    saved = [list(r) for r in registries]
    yield
    for registry, before in zip(registries, saved):
        registry[:] = before


class LinearThenSiLU(te.ops.FusedOperation):
    """What TE's custom-op tests build: the first two ops computed as ``SiLU(x W^T)`` (the second's bias,
    if it has one, is not read: the fusion assumes its second op is a SiLU)."""

    def __init__(self, first: te.ops.FusibleOperation, second: te.ops.FusibleOperation) -> None:
        super().__init__((first, second))

    def fuser_forward(self, basic_op_ctxs, input_, **unused):
        weight = self.basic_ops[0].weight
        y = input_ @ weight.t()
        basic_op_ctxs[0].save_for_backward(input_, weight)
        return torch.nn.functional.silu(y), [(), ()]

    def fuser_backward(self, basic_op_ctxs, grad_output, **unused):
        x, w = basic_op_ctxs[0].saved_tensors
        y = x @ w.t()
        s = torch.sigmoid(y)
        dy = grad_output * s * (1 + y * (1 - s))
        return dy @ w, [(dy.reshape(-1, dy.shape[-1]).t() @ x.reshape(-1, x.shape[-1]),), ()], [(), ()]


def one_shot_fusion() -> tuple[Callable, dict]:
    """TE's pattern: fuse ``ops[0], ops[1]`` on the first call, whatever they are, then never again."""
    armed = {"armed": True, "calls": 0}

    def fuse(ops, **unused):
        armed["calls"] += 1
        if not armed["armed"]:
            return ops
        armed["armed"] = False
        return [LinearThenSiLU(ops[0], ops[1])] + list(ops[2:])

    return fuse, armed


def refused_forward() -> None:
    """A custom-op test's first forward that refops refuses before fusion (on the H200: CUDA input, CPU weights)."""
    model = te.ops.Sequential(te.ops.Linear(11, 11, bias=False, device="cpu"), te.ops.SiLU())
    with pytest.raises(TypeError, match="BasicLinear: input has dtype torch.float16"):
        model(torch.randn(7, 11, dtype=torch.float16))


def training_loop_linear(device: torch.device | str, dtype: torch.dtype = torch.bfloat16) -> te.ops.Linear:
    """TestTrainingLoops' module: ``Linear(32, 32)`` (BasicLinear + Bias) with uniform random parameters."""
    module = te.ops.Linear(32, 32, device=device, dtype=dtype)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.empty_like(param).uniform_())
    return module


def expected_linear(module: te.ops.Linear, x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x.double(), module.weight.double(), module.bias.double())


def run_training_stages(module: te.ops.Linear, stages: tuple[str, ...], device: torch.device | str) -> None:
    """TE's train / infer stages: new weights under no_grad, then forward (and backward) against float64."""
    dtype = module.weight.dtype
    for stage in stages:
        for _ in range(3):
            x = torch.rand(32, 32, device=device).to(dtype)
            if stage == "train":
                with torch.no_grad():
                    module.weight.copy_(torch.empty_like(module.weight).uniform_())
                    module.bias.copy_(torch.empty_like(module.bias).uniform_())
                x.requires_grad_(True)
                y = module(x)
                y.float().sum().backward()
                assert x.grad is not None and module.weight.grad is not None
                module.weight.grad = module.bias.grad = None
            else:
                with torch.inference_mode():
                    y = module(x)
            torch.testing.assert_close(y.double(), expected_linear(module, x.detach()), rtol=0.016, atol=0.05)


# ---------------------------------------------------------------------- the contract refops keeps
def test_a_refused_forward_calls_no_fusion_function(fusion_registries):
    """The input is checked before anything runs, fusion functions included (documented in te-differences)."""
    fuse, state = one_shot_fusion()
    te.ops.register_forward_fusion(fuse)
    refused_forward()
    assert state["calls"] == 0 and state["armed"]


# ------------------------------------------------------------ the leaking sequence, reproduced on the CPU
def test_an_armed_forward_fusion_left_by_a_refused_test_breaks_the_next_linear(fusion_registries):
    """TrainingLoops' stages0 on the H200: ``IndexError: list index out of range``."""
    fuse, state = one_shot_fusion()
    te.ops.register_forward_fusion(fuse)  # appended: it sees [ForwardLinearBiasActivation], one op
    refused_forward()
    module = training_loop_linear("cpu")
    with pytest.raises(IndexError, match="list index out of range"):
        module(torch.rand(32, 32).to(torch.bfloat16))
    assert state["calls"] == 1 and not state["armed"]


def test_an_armed_joint_fusion_left_by_a_refused_test_gives_wrong_numbers(fusion_registries):
    """TrainingLoops' stages1 on the H200: most outputs wrong (SiLU(x W^T) for x W^T + b)."""
    fuse, state = one_shot_fusion()
    te.ops.register_forward_backward_fusion(fuse)  # sees [BasicLinear, Bias] and fuses them
    refused_forward()
    module = training_loop_linear("cpu")
    x = torch.rand(32, 32).to(torch.bfloat16)
    with torch.inference_mode():
        y = module(x)
    assert not state["armed"]
    wrong = ~torch.isclose(y.double(), expected_linear(module, x), rtol=0.016, atol=0.05)
    assert wrong.float().mean() > 0.5  # the fused op ignored the bias and applied a SiLU
    torch.testing.assert_close(y.double(), torch.nn.functional.silu(x.double() @ module.weight.double().t()),
                               rtol=0.016, atol=0.05)


def run_custom_op_test(device: torch.device | str) -> dict:
    """TE's custom-op test in short: a one-shot joint fusion, a model built without a device, inputs on ``device``.

    Returns the fusion's state: consumed (disarmed) when the forward ran.
    """
    fuse, state = one_shot_fusion()
    te.ops.register_forward_backward_fusion(fuse)
    custom = te.ops.Sequential(te.ops.Linear(11, 11, bias=False), te.ops.SiLU())
    x = torch.randn(7, 11, device=device, requires_grad=True)
    y = custom(x)
    y.sum().backward()
    assert isinstance(custom._module_groups[0]._forward_ops[0][0], LinearThenSiLU)
    torch.testing.assert_close(y, torch.nn.functional.silu(x.detach() @ custom[0].weight.detach().t()))
    assert x.grad is not None and custom[0].weight.grad is not None
    return state


def test_a_consumed_one_shot_fusion_leaves_the_training_loop_right(fusion_registries):
    """When the custom-op test runs, its function fires there and disarms: the loop is right afterwards."""
    state = run_custom_op_test("cpu")
    assert state["calls"] >= 1 and not state["armed"]
    run_training_stages(training_loop_linear("cpu"), ("train", "infer", "train", "infer"), "cpu")
    run_training_stages(training_loop_linear("cpu"), ("infer", "train", "infer", "train"), "cpu")


# ------------------------------------------------------------------------------- on a GPU, for real
@pytest.fixture
def no_default_device():
    saved = explicit_default_device()
    torch.set_default_device(None)
    try:
        yield
    finally:
        torch.set_default_device(saved)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: TE's sequence with CUDA inputs")
def test_te_sequence_on_cuda_without_a_default_device(fusion_registries, no_default_device):
    """TE's custom-op tests build their Linear without a device and feed CUDA inputs; before the default-device
    fix refops refused them ("input is on cuda:0 but the parameters are on cpu") and left their fusions armed."""
    state = run_custom_op_test("cuda")
    assert not state["armed"]
    for stages in (("train", "infer", "train", "infer"), ("infer", "train", "infer", "train")):
        run_training_stages(training_loop_linear("cuda"), stages, "cuda")
