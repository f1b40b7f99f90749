"""Where an op built without a ``device`` puts its parameters (``refops.ops.placement``).

TE code run as ``import refops as te`` on a GPU machine builds ``te.ops.Linear(16, 8)`` and feeds
it CUDA tensors: the parameters must be on CUDA, as under TE. Without a GPU, and whenever the user
set a default device, refops must stay usable there. The CPU tests replace ``torch.cuda.is_available``
and ``torch.cuda.current_device`` to reach the CUDA branch without a GPU (they never allocate there);
the ``gpu`` tests run the same code on a real GPU.
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

import refops as te
from refops.ops._common import check_tensor
from refops.ops.placement import canonicalize_device, default_parameter_device, explicit_default_device

pytest_plugins = ["pytester"]


@pytest.fixture
def no_default_device():
    """torch's default device unset for the test (the suite pins the CPU), then restored exactly."""
    saved = explicit_default_device()
    torch.set_default_device(None)
    try:
        yield
    finally:
        torch.set_default_device(saved)


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch reports CUDA, current device 1: enough for the placement rule, which only asks."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


class AllocationsToMeta(TorchFunctionMode):
    """Records the device of every ``torch.empty`` and allocates on meta instead: where an op *would*
    put its parameters, on a machine without that device."""

    def __init__(self) -> None:
        super().__init__()
        self.devices: list[torch.device] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.empty and kwargs.get("device") is not None:
            self.devices.append(torch.device(kwargs["device"]))
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


# ------------------------------------------------------------------ the rule's branches
def test_unset_default_and_no_cuda_gives_the_cpu(no_default_device, no_cuda):
    assert explicit_default_device() is None
    assert default_parameter_device() == torch.device("cpu")
    assert te.ops.Linear(4, 3).weight.device == torch.device("cpu")


def test_unset_default_with_cuda_gives_the_current_cuda_device_as_te_does(no_default_device, fake_cuda):
    assert default_parameter_device() == torch.device("cuda", 1)
    assert canonicalize_device(None) == torch.device("cuda", 1)
    assert canonicalize_device("cuda") == torch.device("cuda", 1)  # an index-less cuda: the current device


@pytest.mark.parametrize(
    "build",
    [
        lambda: te.ops.Linear(4, 3),
        lambda: te.ops.basic.BasicLinear(4, 3),
        lambda: te.ops.Bias(3),
        lambda: te.ops.LayerNorm(4),
        lambda: te.ops.RMSNorm(4),
        lambda: te.ops.GroupedLinear(2, 4, 3),
    ],
    ids=["Linear", "BasicLinear", "Bias", "LayerNorm", "RMSNorm", "GroupedLinear"],
)
def test_ops_built_without_a_device_allocate_on_the_current_cuda_device(no_default_device, fake_cuda, build):
    with AllocationsToMeta() as allocations:
        build()
    assert allocations.devices and set(allocations.devices) == {torch.device("cuda", 1)}


def test_a_default_set_to_the_cpu_wins_over_cuda(no_default_device, fake_cuda):
    torch.set_default_device("cpu")
    assert explicit_default_device() == torch.device("cpu")
    assert default_parameter_device() == torch.device("cpu")
    op = te.ops.Linear(4, 3)
    assert op.weight.device == torch.device("cpu") and op.bias.device == torch.device("cpu")


def test_a_with_torch_device_block_wins_and_ends_with_the_block(no_default_device, fake_cuda):
    with torch.device("cpu"):
        assert default_parameter_device() == torch.device("cpu")
        op = te.ops.basic.BasicLinear(4, 3)
    assert op.weight.device == torch.device("cpu")
    assert default_parameter_device() == torch.device("cuda", 1)  # the block ended: unset again


def test_an_index_less_cuda_default_gets_the_current_device(no_default_device, fake_cuda):
    torch.set_default_device("cuda")  # only recorded; nothing is allocated on it here
    try:
        assert explicit_default_device() == torch.device("cuda")
        assert default_parameter_device() == torch.device("cuda", 1)
    finally:
        torch.set_default_device(None)


def test_a_meta_default_builds_on_meta_and_defers_the_target(no_default_device, no_cuda):
    with torch.device("meta"):
        op = te.ops.basic.BasicLinear(4, 3)
    assert op.weight.is_meta  # TE would allocate on CUDA here; refops honours the meta default
    assert op.materialization_device() == torch.device("cpu")  # decided now: the rule, with meta gone


def test_explicit_device_argument_is_untouched_by_the_rule(no_default_device, fake_cuda):
    assert canonicalize_device("cpu") == torch.device("cpu")
    assert te.ops.Linear(4, 3, device="cpu").weight.device == torch.device("cpu")


# ----------------------------------------------------------- the materialization target
def test_meta_built_op_materializes_where_the_rule_says_at_construction(no_default_device, fake_cuda):
    op = te.ops.Linear(4, 3, device="meta")
    assert op.weight.is_meta
    # No GPU here: ask where it would go, without allocating.
    assert op.basic_ops[0].materialization_device() == torch.device("cuda", 1)
    assert op.basic_ops[1].materialization_device() == torch.device("cuda", 1)


def test_meta_built_op_under_a_cpu_default_materializes_on_the_cpu(no_default_device, fake_cuda):
    torch.set_default_device("cpu")
    op = te.ops.Linear(4, 3, device="meta")
    torch.set_default_device(None)  # the target was remembered at construction
    op(torch.randn(2, 4))
    assert op.weight.device == torch.device("cpu") and not op.bias.is_meta


# ------------------------------------------------------------------- restoring exactly
def test_the_device_fixture_restores_an_unset_default(pytester):
    """The plugin's ``device`` fixture must not leave "set to cpu" behind where nothing was set."""
    pytester.makeconftest('pytest_plugins = ["refops.testing.pytest_plugin"]\n')
    pytester.makepyfile(
        test_restore="""
import torch
from refops.ops.placement import explicit_default_device

def test_a(device):
    assert explicit_default_device() == device

def test_b():
    assert explicit_default_device() is None
"""
    )
    saved = explicit_default_device()
    torch.set_default_device(None)
    try:
        pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)
    finally:
        torch.set_default_device(saved)


def test_device_mismatch_error_states_the_placement_rule():
    with pytest.raises(ValueError) as info:
        check_tensor("BasicLinear", "input", torch.randn(2, 4), dtype=torch.float32, device=torch.device("cuda", 0))
    message = str(info.value)
    assert "BasicLinear: input is on cpu but the parameters are on cuda:0" in message
    assert "torch.set_default_device" in message and "current CUDA device" in message


# ------------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the rule's CUDA branch for real")
def test_te_code_without_a_device_gets_cuda_parameters_on_a_gpu(no_default_device):
    """TE's test_custom_forward_fused_op2 builds ``te.ops.Linear(11, 11, bias=False)`` and feeds CUDA inputs."""
    current = torch.device("cuda", torch.cuda.current_device())
    model = te.ops.Sequential(te.ops.Linear(11, 11, bias=False), te.ops.SiLU())
    assert model[0].weight.device == current
    x = torch.randn(7, 11, device="cuda", requires_grad=True)
    y = model(x)
    y.sum().backward()
    expected = torch.nn.functional.silu(x.detach() @ model[0].weight.detach().t())
    torch.testing.assert_close(y, expected)
    assert x.grad is not None and model[0].weight.grad.device == current

    lazy = te.ops.Linear(11, 11, device="meta")
    lazy(torch.randn(3, 11, device="cuda"))
    assert lazy.weight.device == current and lazy.bias.device == current


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: a set CPU default on a GPU machine")
def test_a_cpu_default_still_wins_on_a_gpu(no_default_device):
    torch.set_default_device("cpu")
    assert te.ops.Linear(4, 3).weight.device == torch.device("cpu")
