"""The fuser's cache is never stale: every way of replacing a parameter is seen before the next forward.

Each test builds a model, runs a first forward (so the fuser has cached its
parameters), replaces a parameter by one path, then checks that the next
backward puts the grad on the *new* parameter (the one ``named_parameters()``
reports) and none on the old one, and that ``Linear``'s aliases follow.
"""

from __future__ import annotations

import copy

import pytest
import torch

import refops as te
from refops.ops.basic.basic_linear import BasicLinear

from _cases import aliases_in_sync


def _model(device, meta: bool = True) -> te.ops.Sequential:
    return te.ops.Sequential(te.ops.Linear(4, 3, device="meta" if meta else device))


def _first_forward(model, device) -> torch.Tensor:
    x = torch.randn(2, 4, device=device)
    with torch.no_grad():
        model(x)
    return x


def _check_grads_on_current(model, x, old_params):
    model(x).sum().backward()
    assert aliases_in_sync(model)
    current = dict(model.named_parameters())
    for name, p in current.items():
        assert p.grad is not None, f"{name}: the current parameter got no grad"
    for old in old_params:
        if all(old is not p for p in current.values()):
            assert old.grad is None, "a replaced parameter received a grad"
    assert len(list(model.parameters())) == len({id(p) for p in model.parameters()})


def test_register_parameter_on_basic_op(device):
    model = _model(device)
    x = _first_forward(model, device)
    linear = model[0]
    old = linear.weight
    new = torch.nn.Parameter(torch.randn(3, 4, device=device))
    linear.basic_ops[0].register_parameter("weight", new)
    assert linear.weight is new
    _check_grads_on_current(model, x, [old])
    dy = torch.ones(2, 3, device=device)
    assert torch.allclose(new.grad, dy.t() @ x)


def test_attribute_assignment_on_basic_op(device):
    model = _model(device)
    x = _first_forward(model, device)
    old = model[0].bias
    model[0].basic_ops[1].bias = torch.nn.Parameter(torch.ones(3, device=device))
    assert model[0].bias is model[0].basic_ops[1].bias
    _check_grads_on_current(model, x, [old])


def test_attribute_assignment_on_linear_container(device):
    model = _model(device)
    x = _first_forward(model, device)
    old = model[0].weight
    new = torch.nn.Parameter(torch.randn(3, 4, device=device))
    model[0].weight = new
    assert model[0].basic_ops[0].weight is new
    _check_grads_on_current(model, x, [old])


def test_direct_write_to_parameters_dict_is_caught_by_the_identity_check(device):
    model = _model(device)
    x = _first_forward(model, device)
    op = model[0].basic_ops[0]
    old = op.weight
    op._parameters["weight"] = torch.nn.Parameter(torch.randn(3, 4, device=device))  # bypasses every hook
    _check_grads_on_current(model, x, [old])


def test_load_state_dict_assign(device):
    model = _model(device)
    x = _first_forward(model, device)
    old = list(model.parameters())
    source = _model(device, meta=False)
    model.load_state_dict(source.state_dict(), assign=True)
    for p, q in zip(model.parameters(), source.parameters()):
        assert torch.equal(p, q)
    _check_grads_on_current(model, x, old)


def test_load_state_dict_assign_into_meta_model(device):
    source = _model(device, meta=False)
    model = _model(device)
    model.load_state_dict(source.state_dict(), assign=True)
    assert aliases_in_sync(model)
    x = torch.randn(2, 4, device=device)
    assert torch.equal(model(x), source(x))
    _check_grads_on_current(model, x, [])


def test_to_empty_after_first_forward(device):
    model = _model(device)
    x = _first_forward(model, device)
    old = list(model.parameters())
    model.to_empty(device=device)
    model.reset_parameters()
    _check_grads_on_current(model, x, old)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_to_dtype_after_first_forward(dtype, device):
    model = _model(device)
    x = _first_forward(model, device)
    model.to(dtype)
    assert all(p.dtype == dtype for p in model.parameters())
    _check_grads_on_current(model, x.to(dtype), [])


def test_swap_module_params_on_conversion(device):
    previous = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model = _model(device)
        x = _first_forward(model, device)
        ids = [id(p) for p in model.parameters()]
        model.to(torch.float16)
        assert [id(p) for p in model.parameters()] == ids
        _check_grads_on_current(model, x.half(), [])
    finally:
        torch.__future__.set_swap_module_params_on_conversion(previous)


def test_deepcopy_keeps_aliases_and_shares_nothing(device):
    model = _model(device)
    x = _first_forward(model, device)
    clone = copy.deepcopy(model)
    assert aliases_in_sync(clone)
    assert not ({id(p) for p in clone.parameters()} & {id(p) for p in model.parameters()})
    clone(x).sum().backward()
    assert all(p.grad is not None for p in clone.parameters())
    assert all(p.grad is None for p in model.parameters())


def test_deepcopy_of_meta_model_materializes_independently(device):
    model = _model(device)
    clone = copy.deepcopy(model)
    _first_forward(clone, device)
    assert all(p.is_meta for p in model.parameters())
    assert all(p.device == device for p in clone.parameters())


def test_parameters_yields_each_parameter_once(device):
    linear = te.ops.Linear(4, 3, device=device)
    names = [n for n, _ in linear.named_parameters()]
    assert names == ["weight", "bias"]
    assert len(list(te.ops.Sequential(linear).parameters())) == 2


def test_param_version_counts_replacements(device):
    op = BasicLinear(4, 3, device=device)
    v = op.param_version
    op.weight = torch.nn.Parameter(torch.randn(3, 4, device=device))
    assert op.param_version == v + 1
    op.reset_parameters()  # fills in place: no replacement
    assert op.param_version == v + 1


def test_replacement_changes_requires_grad_selection(device):
    model = te.ops.Sequential(BasicLinear(4, 4, device=device), BasicLinear(4, 4, device=device))
    x = torch.randn(2, 4, device=device)
    model(x)
    fuser = model._module_groups[0]
    assert fuser.first_op_requiring_backward == 0
    model[0].weight = torch.nn.Parameter(model[0].weight.detach().clone(), requires_grad=False)
    model(x).sum().backward()
    assert fuser.first_op_requiring_backward == 1
    assert model[0].weight.grad is None and model[1].weight.grad is not None
