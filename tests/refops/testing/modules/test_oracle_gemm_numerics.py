"""compare_modules with the reference under ``refops.gemm_numerics("hopper")`` (what ``refops conformance
--gemm-numerics hopper`` does): the reference's backward GEMMs run in hopper numerics too, not only its forward."""

from __future__ import annotations

import contextlib

import torch

import refops
from refops.kernels import ReferenceKernels, use_backend
from refops.kernels.gemm_numerics import gemm_role
from refops.testing import compare_modules


from _recording_kernels import RecordingKernels  # noqa: E402


def _linear() -> refops.ops.Sequential:
    torch.manual_seed(0)
    return refops.ops.Sequential(refops.ops.Linear(64, 32))


def test_the_reference_under_hopper_numerics_gets_them_in_its_backward_too():
    kernels = {"candidate": RecordingKernels(), "reference": RecordingKernels()}

    def context(side):
        def enter():
            stack = contextlib.ExitStack()
            stack.enter_context(refops.gemm_numerics("hopper"))
            stack.enter_context(use_backend(kernels[side]))
            return stack
        return enter

    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(1))
    report = compare_modules(_linear(), _linear(), (x,), reference_context=context("reference"),
                             candidate_context=context("candidate"), scenarios=("one step",))
    for side, recorded in kernels.items():
        assert {role for role, _ in recorded.calls} == {"fprop", "dgrad", "wgrad"}, side
        assert {mode for _, mode in recorded.calls} == {"hopper"}, (side, recorded.calls)
    # the same model in the same numerics on both sides: judged equal (TF32 operands in every GEMM of both)
    report.assert_ok()
    assert report["0.weight.grad"].max_abs_error == 0.0
    assert refops.gemm_numerics() == "exact"


def test_each_side_backward_runs_under_the_mode_of_its_own_forward():
    """A reference whose context selects hopper numerics for the forward only (a context that knows nothing of
    the backward) still gets hopper dgrad and wgrad: the mode travels with the forward."""
    kernels = RecordingKernels()
    forwards = []

    @contextlib.contextmanager
    def reference_context():
        with use_backend(kernels):
            if not forwards:  # the first context is the first forward's; later ones (its backward) select nothing
                forwards.append(1)
                with refops.gemm_numerics("hopper"):
                    yield
            else:
                yield

    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(2))
    compare_modules(_linear(), _linear(), (x,), reference_context=reference_context, scenarios=("one step",),
                    tier="tolerance")
    first_backward = [mode for role, mode in kernels.calls[1:3]]
    assert kernels.calls[0] == ("fprop", "hopper")
    assert [role for role, _ in kernels.calls[1:3]] == ["dgrad", "wgrad"] and first_backward == ["hopper", "hopper"]
