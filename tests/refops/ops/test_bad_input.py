"""Bad input (``docs/lifecycle.md#bad-input-is-a-clear-error``): a clear error naming the op and what was
expected, and a usable model after."""

from __future__ import annotations

import pytest
import torch

import refops as te
from refops.ops.basic.basic_linear import BasicLinear
from refops.ops.basic.bias import Bias


def test_meta_input_to_meta_built_op_is_refused_before_materializing():
    model = te.ops.Sequential(te.ops.Linear(4, 3, device="meta"))
    with pytest.raises(ValueError, match="BasicLinear: the input is on the meta device"):
        model(torch.randn(2, 4, device="meta"))
    assert all(p.is_meta for p in model.parameters()), "nothing may be half-materialized"
    y = model(torch.randn(2, 4))
    assert y.shape == (2, 3)


def test_wrong_in_features_names_op_and_expectation(device):
    model = te.ops.Sequential(te.ops.Linear(4, 3, device="meta"))
    with pytest.raises(ValueError, match=r"BasicLinear: expected input with last dim in_features=4, got shape \(2, 5\)"):
        model(torch.randn(2, 5, device=device))
    assert all(p.is_meta for p in model.parameters()), "the first op's input is checked before materializing"
    model(torch.randn(2, 4, device=device)).sum().backward()
    assert model[0].weight.grad is not None


def test_wrong_bias_size(device):
    with pytest.raises(ValueError, match=r"Bias: expected input with last dim size=3"):
        Bias(3, device=device)(torch.randn(2, 4, device=device))


def test_wrong_normalized_shape_before_materializing(device):
    model = te.ops.Sequential(te.ops.LayerNorm(8, device="meta"), te.ops.Linear(8, 4, device="meta"))
    with pytest.raises(ValueError, match=r"LayerNorm: input of shape \(2, 6\) does not end with normalized_shape"):
        model(torch.randn(2, 6, device=device))
    assert all(p.is_meta for p in model.parameters())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dtype_mismatch_is_not_cast_silently(dtype, device):
    op = BasicLinear(4, 3, device=device)
    with pytest.raises(TypeError, match=f"BasicLinear: input has dtype {dtype} but the op computes in torch.float32"):
        op(torch.randn(2, 4, device=device, dtype=dtype))
    assert op(torch.randn(2, 4, device=device)).dtype == torch.float32


def test_torch_autocast_is_the_documented_cast(device):
    op = te.ops.Linear(4, 3, device=device)
    x = torch.randn(2, 4, device=device, requires_grad=True)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        y = op(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and op.weight.grad.dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a device mismatch needs a second device (CUDA)")
def test_device_mismatch():
    op = BasicLinear(4, 3, device="cpu")
    with pytest.raises(ValueError, match="BasicLinear: input is on cuda:0 but the parameters are on cpu"):
        op(torch.randn(2, 4, device="cuda"))


def test_unsupported_dtype_at_construction():
    with pytest.raises(ValueError, match=r"BasicLinear: supported dtypes are float32, float16, bfloat16 \(got torch.float64\)"):
        BasicLinear(4, 3, dtype=torch.float64)


def test_wrong_number_of_extra_inputs(device):
    op = Bias(4, device=device)
    with pytest.raises(ValueError, match="Expected 0 extra inputs but got 1"):
        op(torch.randn(2, 4, device=device), torch.randn(2, 4, device=device))


def test_non_tensor_input():
    with pytest.raises(TypeError, match="BasicLinear: expected the input to be a torch.Tensor, got list"):
        BasicLinear(2, 2)([1.0, 2.0])


def test_surplus_extra_inputs_to_sequential_are_not_dropped(device):
    model = te.ops.Sequential(Bias(4, device=device))
    with pytest.raises(ValueError, match="received 1 extra inputs but its ops consume 0"):
        model(torch.randn(2, 4, device=device), torch.randn(2, 4, device=device))


def test_unknown_forward_kwargs(device):
    model = te.ops.Sequential(BasicLinear(4, 3, device=device))
    with pytest.raises(TypeError, match=r"BasicLinear: unexpected forward kwargs \['alpha'\]"):
        model(torch.randn(2, 4, device=device), op_kwargs={0: {"alpha": 2.0}})


def test_unknown_forward_kwargs_are_refused_before_anything_is_materialized(device):
    model = te.ops.Sequential(BasicLinear(4, 3, device="meta"), Bias(3, device="meta"))
    with pytest.raises(TypeError, match=r"Bias: unexpected forward kwargs \['scale'\] \(it accepts none\)"):
        model(torch.randn(2, 4, device=device), op_kwargs={1: {"scale": 2.0}})
    assert all(p.is_meta for p in model.parameters())  # the error came first
    assert model(torch.randn(2, 4, device=device)).shape == (2, 3)  # and the model is still usable


def test_op_kwargs_must_target_a_basic_op_of_the_sequential(device):
    linear = te.ops.Linear(4, 3, device=device)
    model = te.ops.Sequential(linear)
    with pytest.raises(ValueError, match="only allows providing forward kwargs to a BasicOperation"):
        model(torch.randn(2, 4, device=device), op_kwargs={linear: {}})
    with pytest.raises(ValueError, match="not in this Sequential"):
        model(torch.randn(2, 4, device=device), op_kwargs={BasicLinear(4, 3, device=device): {}})


def test_linear_without_bias_refuses_a_bias(device):
    op = te.ops.Linear(4, 3, bias=False, device=device)
    with pytest.raises(ValueError, match="does not have bias enabled"):
        op.bias = torch.nn.Parameter(torch.zeros(3, device=device))
    assert op.bias is None


def test_tensor_parallelism_without_a_process_group_is_the_single_process_op():
    """TE's canonicalization: a TP group of one rank (here: no process group) turns TP and SP off."""
    linear = te.ops.Linear(8, 6, tensor_parallel_mode="column", sequence_parallel=True, device="cpu")
    assert linear.tensor_parallel_mode is None and not linear.sequence_parallel
    assert linear.weight.shape == (6, 8) and linear.bias.shape == (6,)
    assert [type(op).__name__ for op in linear.basic_ops] == ["BasicLinear", "Bias"]
    assert Bias(6, tensor_parallel=True, device="cpu").local_size == 6


def test_unknown_tensor_parallel_mode_and_userbuffers_are_refused():
    with pytest.raises(ValueError, match="BasicLinear: tensor_parallel_mode must be None, 'column' or 'row'"):
        BasicLinear(4, 4, tensor_parallel_mode="diagonal", device="cpu")
    with pytest.raises(NotImplementedError, match="BasicLinear: userbuffers communication overlap is not implemented"):
        BasicLinear(4, 4, userbuffers_options={"comm_name": "qkv"}, device="cpu")
