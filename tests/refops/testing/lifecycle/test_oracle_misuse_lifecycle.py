"""check_lifecycle misused: one clear error naming the argument and what was expected, instead of a table of
ten lifecycle violations that are really one mistake in the call."""

from __future__ import annotations

import pytest
import torch

import refops as te
from refops.testing import check_lifecycle


def linear(device):
    return te.ops.Linear(16, 8, device=device)


def x(device):
    return (torch.randn(4, 16, device=device),)


def test_inputs_given_as_a_tuple_instead_of_a_callable():
    # Before: "'tuple' object is not callable", raised from inside the check.
    with pytest.raises(TypeError, match=r"^check_lifecycle: inputs must be a callable, inputs\(device\) -> tuple of "
                                        r"forward arguments; got tuple \(write inputs=lambda device: "):
        check_lifecycle(linear, inputs=(torch.randn(4, 16),))


def test_inputs_that_return_a_tensor_instead_of_a_tuple():
    # Before: tuple(tensor) silently split the batch into rows, one "argument" each.
    with pytest.raises(TypeError, match=r"inputs\(device\) must return a tuple of forward arguments, got Tensor "
                                        r"\(a single input is a tuple of one"):
        check_lifecycle(linear, inputs=lambda device: torch.randn(4, 16, device=device))


def test_a_module_instead_of_a_factory():
    # Before: ten properties "violated", each with "raised TypeError: ... forward() ...".
    with pytest.raises(TypeError, match=r"^check_lifecycle: factory must be a function, factory\(device\) -> "
                                        r"torch.nn.Module, not a module"):
        check_lifecycle(te.ops.Linear(16, 8), inputs=x)


@pytest.mark.parametrize(
    "factory, shown",
    [(lambda: te.ops.Linear(16, 8), r"<lambda>\(\)"), (torch.nn.Linear, r"Linear\(in_features")],
    ids=["no-arguments", "class-with-more-arguments"],
)
def test_a_factory_that_cannot_be_called_with_the_device(factory, shown):
    with pytest.raises(TypeError, match=r"^check_lifecycle: factory must take the device as its one positional "
                                        rf"argument, factory\(device\) -> torch.nn.Module; {shown}"):
        check_lifecycle(factory, inputs=x)


def test_a_factory_that_does_not_pass_its_device_on():
    with pytest.raises(TypeError, match=r"factory\(torch.device\('meta'\)\) built Linear with every parameter and "
                                        r"buffer on cpu: the factory must build on the device it is given"):
        check_lifecycle(lambda device: te.ops.Linear(16, 8), device="cpu", inputs=x)


def test_a_factory_that_returns_something_else_than_a_module():
    with pytest.raises(TypeError, match=r"factory\(device\) must return a torch.nn.Module, got Tensor"):
        check_lifecycle(lambda device: torch.zeros(3, device=device))


def test_a_factory_that_raises_on_meta_is_still_evidence_not_an_argument_error():
    def refuses_meta(device):
        if device.type == "meta":
            raise RuntimeError("this module cannot be built on meta")
        return torch.nn.Linear(4, 4, device=device)

    report = check_lifecycle(refuses_meta)
    assert "RuntimeError: this module cannot be built on meta" in report["zero_allocation_on_meta"].evidence


def test_lazy_and_device_must_be_what_they_say():
    with pytest.raises(TypeError, match=r"check_lifecycle: lazy must be True, False or None, got str 'yes'"):
        check_lifecycle(linear, lazy="yes")
    with pytest.raises(ValueError, match=r"check_lifecycle: device must be a torch device or its name, got 'gpu'"):
        check_lifecycle(linear, device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"device cuda was asked for, but torch reports no CUDA device"):
            check_lifecycle(linear, device="cuda")


def test_the_claims_and_strict_must_be_bools():
    with pytest.raises(TypeError, match=r"^check_lifecycle: strict must be True or False, got str 'yes'$"):
        check_lifecycle(linear, strict="yes")
    with pytest.raises(TypeError, match=r"^check_lifecycle: materializes_at_first_forward must be True or False, "
                                        r"got NoneType None$"):
        check_lifecycle(linear, materializes_at_first_forward=None)
    with pytest.raises(TypeError, match=r"^check_lifecycle: materializes_through_reset_parameters must be True, "
                                        r"False or None, got int 1$"):
        check_lifecycle(linear, materializes_through_reset_parameters=1)


def test_lazy_is_not_given_together_with_the_claims_it_stands_for():
    with pytest.raises(TypeError, match=r"^check_lifecycle: lazy is the deprecated spelling of "
                                        r"materializes_through_reset_parameters and materializes_at_first_forward"):
        check_lifecycle(linear, lazy=True, materializes_at_first_forward=True)


def test_convert_must_be_a_function_of_the_module():
    with pytest.raises(TypeError, match=r"^check_lifecycle: convert must be a function, convert\(module\) -> the "
                                        r"converted module \(or None, in place\), not a module: it is called on the "
                                        r"module the check builds"):
        check_lifecycle(linear, convert=torch.nn.Identity())
    with pytest.raises(TypeError, match=r"^check_lifecycle: convert must be a callable, .* got str"):
        check_lifecycle(linear, convert="swap_linears")
    with pytest.raises(TypeError, match=r"^check_lifecycle: convert must take the module as its one positional "
                                        r"argument"):
        check_lifecycle(linear, convert=lambda module, config: module)


def test_a_convert_that_returns_no_module_is_an_error_naming_convert():
    with pytest.raises(TypeError, match=r"^check_lifecycle: convert\(module\) must return the converted "
                                        r"torch.nn.Module \(or None after converting in place\), got dict"):
        check_lifecycle(linear, inputs=x, convert=lambda module: {"module": module})
