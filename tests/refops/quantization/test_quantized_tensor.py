"""QuantizedTensor as a torch.Tensor and as a Parameter, for every scheme."""

from __future__ import annotations

import copy
import json
from typing import Callable

import pytest
import torch

from refops.quantization import (
    DType,
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    Float8Tensor,
    MXFP8Quantizer,
    NVFP4Quantizer,
    QuantizedTensor,
    Quantizer,
    QuantizerRole,
)

SHAPE = (64, 96)


def _delayed(device: torch.device) -> Quantizer:
    return Float8Quantizer(torch.full((1,), 4.0, device=device), torch.zeros(1, device=device), DType.kFloat8E4M3)


SCHEMES: dict[str, Callable[[torch.device], Quantizer]] = {
    "delayed": _delayed,
    "current": lambda device: Float8CurrentScalingQuantizer(DType.kFloat8E4M3, device),
    "mxfp8": lambda device: MXFP8Quantizer(DType.kFloat8E4M3),
    "mxfp8_2d": lambda device: MXFP8Quantizer(DType.kFloat8E4M3, with_2d_quantization=True),
    "block1d": lambda device: Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True,
                                                    block_scaling_dim=1),
    "block2d": lambda device: Float8BlockQuantizer(DType.kFloat8E5M2, rowwise=True, columnwise=True),
    "nvfp4": lambda device: NVFP4Quantizer(),
    "nvfp4_2d": lambda device: NVFP4Quantizer(with_2d_quantization=True),
}
scheme = pytest.mark.parametrize("name", list(SCHEMES))


def _arrays(q: QuantizedTensor) -> dict[str, torch.Tensor]:
    return {a: getattr(q, a) for a in q._array_names() if getattr(q, a) is not None}


def _same_bytes(a: QuantizedTensor, b: QuantizedTensor) -> bool:
    x, y = _arrays(a), _arrays(b)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def _make(name: str, device: torch.device, dtype: torch.dtype = torch.float32) -> tuple[Quantizer, QuantizedTensor]:
    quantizer = SCHEMES[name](device)
    return quantizer, quantizer(torch.randn(SHAPE, device=device, dtype=dtype))


@scheme
def test_parameter_wrapping(device: torch.device, name: str) -> None:
    quantizer, q = _make(name, device)
    p = torch.nn.Parameter(q)
    assert isinstance(p, QuantizedTensor) and isinstance(p, torch.nn.Parameter) and type(p) is type(q)
    assert p.requires_grad and p.shape == SHAPE and p.dtype == torch.float32 and p.device == q.device
    assert p.quantizer is quantizer and _same_bytes(p, q)


@scheme
def test_deepcopy_is_independent_and_bit_equal(device: torch.device, name: str) -> None:
    _, q = _make(name, device)
    p = torch.nn.Parameter(q)
    c = copy.deepcopy(p)
    assert type(c) is type(p) and isinstance(c, torch.nn.Parameter) and c.requires_grad
    assert _same_bytes(c, p) and c.quantizer is not p.quantizer
    first = next(iter(_arrays(p)))
    assert getattr(c, first).data_ptr() != getattr(p, first).data_ptr()


class _LinearWithQuantizedWeight(torch.autograd.Function):
    """y = x @ W^T with W dequantized; backward returns a plain high-precision grad for W."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: QuantizedTensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x @ weight.dequantize().t()

    returned: list[torch.Tensor] = []

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        grad_weight = grad.t() @ x
        _LinearWithQuantizedWeight.returned.append(grad_weight)
        return None, grad_weight


@scheme
def test_plain_grad_from_custom_function_lands_in_grad(device: torch.device, name: str) -> None:
    _, q = _make(name, device)
    p = torch.nn.Parameter(q)
    x = torch.randn(8, SHAPE[1], device=device)
    _LinearWithQuantizedWeight.returned.clear()
    _LinearWithQuantizedWeight.apply(x, p).sum().backward()
    assert type(p.grad) is torch.Tensor and p.grad.shape == SHAPE and p.grad.dtype == torch.float32
    assert torch.equal(p.grad, _LinearWithQuantizedWeight.returned[0])
    torch.testing.assert_close(p.grad, x.sum(0).expand(SHAPE))


@scheme
def test_swap_tensors_with_a_plain_parameter(device: torch.device, name: str) -> None:
    _, q = _make(name, device)
    plain = torch.nn.Parameter(torch.randn(SHAPE, device=device))
    quantized = torch.nn.Parameter(q)
    plain_values, quantized_values = plain.detach().clone(), quantized.dequantize().detach().clone()
    plain_id = id(plain)
    torch.utils.swap_tensors(plain, quantized)
    assert id(plain) == plain_id and isinstance(plain, QuantizedTensor) and isinstance(plain, torch.nn.Parameter)
    assert type(quantized) is torch.nn.Parameter
    assert torch.equal(plain.dequantize(), quantized_values) and torch.equal(quantized, plain_values)


@scheme
def test_sgd_step_requantizes_in_place(device: torch.device, name: str) -> None:
    quantizer, q = _make(name, device)
    p = torch.nn.Parameter(q)
    p.grad = torch.randn(SHAPE, device=device)
    arrays_before = {k: (id(v), v.data_ptr()) for k, v in _arrays(p).items()}
    expected = quantizer(p.dequantize().detach() - 0.5 * p.grad)
    torch.optim.SGD([p], lr=0.5).step()
    assert isinstance(p, QuantizedTensor) and {k: (id(v), v.data_ptr()) for k, v in _arrays(p).items()} == arrays_before
    assert _same_bytes(p, expected)


@scheme
def test_copy_into_requantizes_in_place(device: torch.device, name: str) -> None:
    quantizer, q = _make(name, device)
    src = torch.randn(SHAPE, device=device)
    buffers = {k: id(v) for k, v in _arrays(q).items()}
    with torch.no_grad():
        out = q.copy_(src)
    assert out is q and {k: id(v) for k, v in _arrays(q).items()} == buffers
    assert _same_bytes(q, quantizer(src))
    # copying a tensor quantized the same way copies its bytes exactly
    other = quantizer(torch.randn(SHAPE, device=device))
    q.copy_(other)
    assert _same_bytes(q, other)
    # into a plain tensor: the dequantized values
    plain = torch.empty(SHAPE, device=device)
    plain.copy_(q)
    assert torch.equal(plain, q.dequantize())


@scheme
def test_detach_alias_clone(device: torch.device, name: str) -> None:
    _, q = _make(name, device)
    d, c = q.detach(), q.clone()
    assert type(d) is type(q) is type(c)
    first = next(iter(_arrays(q)))
    assert getattr(d, first) is getattr(q, first)  # detach aliases the arrays
    assert getattr(c, first) is not getattr(q, first) and _same_bytes(c, q)
    assert type(torch.ops.aten.alias.default(q)) is type(q)


@scheme
@pytest.mark.parametrize("method, dtype", [("half", torch.float16), ("bfloat16", torch.bfloat16), ("float", None)])
def test_dtype_conversions_stay_quantized(device: torch.device, name: str, method: str, dtype) -> None:
    _, q = _make(name, device, dtype=torch.bfloat16 if method == "float" else torch.float32)
    target = torch.float32 if dtype is None else dtype
    out = getattr(q, method)()
    assert type(out) is type(q) and out.dtype == target and _same_bytes(out, q)
    assert torch.equal(out.dequantize(), q.dequantize(dtype=torch.float32).to(target))
    assert q.to(target).dtype == target and type(q.to(target)) is type(q)
    # a non-floating dtype leaves the quantized world
    assert type(q.to(torch.float64)) is torch.Tensor


@scheme
def test_to_device_moves_every_array(device: torch.device, name: str) -> None:
    _, q = _make(name, device)
    moved = q.to("meta")
    assert type(moved) is type(q) and moved.device.type == "meta"
    assert all(t.device.type == "meta" for t in _arrays(moved).values())
    assert q.to(device) is q or _same_bytes(q.to(device), q)


@scheme
def test_empty_like_and_fallback_ops(device: torch.device, name: str) -> None:
    _, q = _make(name, device)
    e = torch.empty_like(q)
    assert type(e) is type(q) and e.shape == q.shape and _arrays(e).keys() == _arrays(q).keys()
    y = q * 2 + 1
    assert type(y) is torch.Tensor and torch.equal(y, q.dequantize() * 2 + 1)
    assert torch.equal(q.t(), q.dequantize().t())
    assert type(torch.nn.functional.linear(torch.ones(2, SHAPE[1], device=device), q)) is torch.Tensor


@scheme
def test_inplace_op_requantizes(device: torch.device, name: str) -> None:
    quantizer, q = _make(name, device)
    expected = quantizer(q.dequantize() * 0.5)
    with torch.no_grad():
        out = q.mul_(0.5)
    assert out is q and _same_bytes(q, expected)


@scheme
def test_update_usage(device: torch.device, name: str) -> None:
    quantizer, q = _make(name, device)
    full = q.clone()
    q.update_usage(columnwise_usage=False)
    assert q.has_usage("rowwise") and not q.has_usage("columnwise")
    derivable = name in ("delayed", "current", "block2d")
    if derivable:
        q.update_usage(columnwise_usage=True)  # exact: a transpose of the same bytes
        assert _same_bytes(q, full)
    else:
        with pytest.raises(RuntimeError, match="cannot be derived"):
            q.update_usage(columnwise_usage=True)
    q.update_usage(rowwise_usage=True, columnwise_usage=False)
    with pytest.raises(ValueError, match="at least one usage"):
        q.update_usage(rowwise_usage=False)
    col_only = full.clone()
    col_only.update_usage(rowwise_usage=False)
    assert torch.equal(col_only.dequantize(), full.dequantize(usage="columnwise"))
    with pytest.raises(RuntimeError, match="no rowwise data"):
        col_only.dequantize(usage="rowwise")


@scheme
def test_memory_is_only_the_quantized_arrays(device: torch.device, name: str) -> None:
    _, q = _make(name, device)
    p = torch.nn.Parameter(q)
    distinct = {id(t): t for t in _arrays(p).values()}
    assert p.quantized_nbytes() == sum(t.numel() * t.element_size() for t in distinct.values())
    numel = SHAPE[0] * SHAPE[1]
    bytes_per_copy = numel // 2 if name.startswith("nvfp4") else numel  # E2M1 packs two per byte
    # two low-precision copies plus small (padded) scales: far below a 4-byte/element fp32 copy
    assert 2 * bytes_per_copy <= p.quantized_nbytes() < 2 * bytes_per_copy + numel // 2
    assert not any(t.is_floating_point() and t.numel() >= numel for t in distinct.values())
    q.update_usage(columnwise_usage=False)
    assert bytes_per_copy <= q.quantized_nbytes() < bytes_per_copy + numel // 4


@scheme
def test_plain_tensor_round_trip_is_bit_exact(device: torch.device, name: str) -> None:
    quantizer, q = _make(name, device, dtype=torch.bfloat16)
    tensors, metadata = q.to_plain_tensors()
    json.dumps(metadata)  # pickle-free, JSON-compatible
    assert all(type(t) is torch.Tensor for t in tensors.values())
    rebuilt = QuantizedTensor.from_plain_tensors(tensors, metadata)
    assert type(rebuilt) is type(q) and rebuilt.dtype == torch.bfloat16 and _same_bytes(rebuilt, q)
    assert type(rebuilt.quantizer) is type(quantizer) and rebuilt.quantizer._config() == quantizer._config()
    new_values = torch.randn(SHAPE, device=device)
    rebuilt.copy_(new_values)  # the rebuilt quantizer works
    assert _same_bytes(rebuilt, quantizer(new_values))
    given = QuantizedTensor.from_plain_tensors(tensors, metadata, quantizer=quantizer)
    assert given.quantizer is quantizer


def test_delayed_scaling_round_trip_keeps_scale_and_amax(device: torch.device) -> None:
    quantizer = _delayed(device)
    q = quantizer(torch.randn(SHAPE, device=device))
    tensors, metadata = q.to_plain_tensors()
    rebuilt = Float8Tensor.from_plain_tensors(tensors, metadata)
    assert rebuilt.quantizer.scale.item() == 4.0 and rebuilt.quantizer.amax.item() == quantizer.amax.item()
    assert rebuilt.quantizer.scale is not quantizer.scale  # copies, not the recipe state
    with pytest.raises(ValueError, match="not a"):
        from refops.quantization import MXFP8Tensor

        MXFP8Tensor.from_plain_tensors(tensors, metadata)


def test_module_conversions_keep_parameter_identity(device: torch.device) -> None:
    quantizer = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, device)
    lin = torch.nn.Linear(SHAPE[1], SHAPE[0], bias=False, device=device)
    lin.weight = torch.nn.Parameter(quantizer(lin.weight.detach()))
    weight = lin.weight
    bytes_before = weight._data.clone()
    lin.half()
    assert lin.weight is weight and isinstance(weight, Float8Tensor) and weight.dtype == torch.float16
    lin.float()
    assert lin.weight is weight and weight.dtype == torch.float32 and torch.equal(weight._data, bytes_before)
    state = lin.state_dict()
    assert isinstance(state["weight"], Float8Tensor)
    new = torch.randn(SHAPE, device=device)
    lin.load_state_dict({"weight": new})
    assert lin.weight is weight and torch.equal(weight._data, quantizer(new)._data)


def test_quantize_is_straight_through_for_autograd(device: torch.device) -> None:
    x = torch.randn(SHAPE, device=device, requires_grad=True)
    q = MXFP8Quantizer(DType.kFloat8E4M3)(x)
    assert q.requires_grad
    (q.dequantize() * 3).sum().backward()
    assert torch.equal(x.grad, torch.full(SHAPE, 3.0, device=device))


def test_quantizer_interface(device: torch.device) -> None:
    quantizer = _delayed(device)
    quantizer.set_usage(columnwise=False)
    assert (quantizer.rowwise_usage, quantizer.columnwise_usage) == (True, False)
    q = quantizer(torch.ones(4, 4, device=device))
    assert not q.has_usage("columnwise")
    clone = quantizer.copy()
    assert clone is not quantizer and clone.scale is quantizer.scale and clone.amax is quantizer.amax
    out = quantizer.make_empty((4, 4), device=device)
    assert quantizer.quantize(torch.full((4, 4), 2.0, device=device), out=out) is out
    assert torch.equal(out.dequantize(), torch.full((4, 4), 2.0, device=device))
    skipped = quantizer.update_quantized(torch.zeros(4, 4, device=device), out, noop_flag=torch.ones(1))
    assert skipped is out and torch.equal(out.dequantize(), torch.full((4, 4), 2.0, device=device))
    with pytest.raises(TypeError, match="can only update Float8Tensor"):
        quantizer.update_quantized(torch.zeros(32, 32), MXFP8Quantizer(DType.kFloat8E4M3)(torch.zeros(32, 32)))
    quantizer.set_usage(rowwise=False)
    with pytest.raises(ValueError, match="neither"):
        quantizer(torch.ones(2, 2, device=device))


def test_quantizer_role_and_dtype_enum() -> None:
    role = QuantizerRole(module_type="linear", tensor_type="weight", name="fc1")
    assert role == QuantizerRole("linear", "weight", "fc1") and QuantizerRole().name == ""
    with pytest.raises(Exception):
        role.name = "fc2"  # type: ignore[misc]
    assert (DType.kFloat8E4M3, DType.kFloat8E5M2, DType.kFloat8E8M0, DType.kFloat4E2M1) == (7, 8, 9, 10)


def test_pickle_is_refused_with_a_pointer() -> None:
    import pickle

    q = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, "cpu")(torch.ones(2, 2))
    with pytest.raises(TypeError, match="to_plain_tensors"):
        pickle.dumps(q)
