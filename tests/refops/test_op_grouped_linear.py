"""GroupedLinear: per-group GEMMs vs a float64 per-split ``F.linear`` reference, and its lifecycle."""

from __future__ import annotations

import contextlib
import math
import types

import pytest
import torch
import torch.nn.functional as F

from refops.ops.basic.grouped_linear import GRAD_INPUT_BUFFER_KEY, OUTPUT_BUFFER_KEY, GroupedLinear
from refops.ops.sequential import Sequential
from refops.testing.tolerances import dtype_tols, gemm_tols

G, IN, OUT = 4, 16, 16
SPLITS = [8, 0, 12, 4]  # TE's shuffled {0, 128, 256, 384} mix, scaled down: group 1 is empty
ROWS = sum(SPLITS)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
#: mode -> (single_grouped_weight, single_grouped_bias)
PARAM_MODES = {
    "discrete": (False, False),
    "single": (True, True),
    "single_weight": (True, False),
    "single_bias": (False, True),
}
BIAS_CASES = [(False, False), (True, False), (True, True)]  # (bias, scale_bias)


def make_op(device, dtype=torch.float32, mode="discrete", **kwargs) -> GroupedLinear:
    single_weight, single_bias = PARAM_MODES[mode]
    return GroupedLinear(
        G, IN, OUT, device=device, dtype=dtype,
        single_grouped_weight=single_weight, single_grouped_bias=single_bias, **kwargs,
    )


def randomize_biases(op: GroupedLinear) -> None:
    """Biases start at zero; give them values so the bias terms are really tested."""
    with torch.no_grad():
        for name, param in op.named_parameters():
            if name.startswith("bias"):
                param.copy_(torch.randn_like(param))


def splits(sizes=SPLITS, dtype=torch.int64) -> torch.Tensor:
    return torch.tensor(sizes, dtype=dtype)


def weight_grad(op: GroupedLinear, g: int) -> torch.Tensor:
    return op.weight.grad[g] if op.single_grouped_weight else op.get_parameter(f"weight{g}").grad


def bias_grad(op: GroupedLinear, g: int) -> torch.Tensor:
    return op.bias.grad[g] if op.single_grouped_bias else op.get_parameter(f"bias{g}").grad


def reference(op: GroupedLinear, x, dy, scales=None, sizes=SPLITS) -> types.SimpleNamespace:
    """float64: split the rows, ``F.linear`` each split with its own weight and bias, concatenate."""
    x64 = x.detach().double().requires_grad_()
    ws = [op.group_weight(g).detach().double().requires_grad_() for g in range(G)]
    bs = [None if op.group_bias(g) is None else op.group_bias(g).detach().double().requires_grad_() for g in range(G)]
    s64 = None if scales is None else scales.detach().double().requires_grad_()
    rows, outs, start = x64.reshape(-1, op.in_features), [], 0
    for g, n in enumerate(sizes):
        y = F.linear(rows[start:start + n], ws[g], bs[g] if s64 is None else None)
        if s64 is not None and bs[g] is not None:
            y = y + s64[start:start + n, None] * bs[g]
        outs.append(y)
        start += n
    y = torch.cat(outs).reshape(*x.shape[:-1], op.out_features)
    y.backward(dy.double())
    return types.SimpleNamespace(
        y=y.detach(), dx=x64.grad, dw=[w.grad for w in ws], db=[None if b is None else b.grad for b in bs],
        dscales=None if s64 is None else s64.grad,
    )


def close(actual: torch.Tensor, expected: torch.Tensor, tols: dict) -> None:
    torch.testing.assert_close(actual.double(), expected, **tols)


# ------------------------------------------------------------------ numerics
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias,scale_bias", BIAS_CASES)
@pytest.mark.parametrize("mode", PARAM_MODES)
def test_grouped_linear(device, mode, bias, scale_bias, dtype):
    op = make_op(device, dtype, mode, bias=bias, scale_bias=scale_bias)
    randomize_biases(op)
    x = torch.randn(ROWS, IN, dtype=dtype, requires_grad=True)
    scales = torch.rand(ROWS, dtype=dtype, requires_grad=True) if scale_bias else None
    y = op(x, splits(), *([scales] if scale_bias else []))
    dy = torch.randn_like(y)
    y.backward(dy)
    ref = reference(op, x, dy, scales)
    tols = gemm_tols(dtype)
    assert y.dtype == dtype and y.shape == (ROWS, OUT)
    close(y, ref.y, tols)
    close(x.grad, ref.dx, tols)
    for g in range(G):
        close(weight_grad(op, g), ref.dw[g], tols)
        if bias:
            close(bias_grad(op, g), ref.db[g], tols)
    if scale_bias:
        close(scales.grad, ref.dscales, tols)
    assert torch.count_nonzero(weight_grad(op, 1)) == 0  # the empty group
    if bias:
        assert torch.count_nonzero(bias_grad(op, 1)) == 0


@pytest.mark.parametrize("scales_requires_grad", [False, True])
@pytest.mark.parametrize("weight_requires_grad", [False, True])
@pytest.mark.parametrize("input_requires_grad", [False, True])
@pytest.mark.parametrize("mode", ["discrete", "single"])
def test_requires_grad(device, mode, input_requires_grad, weight_requires_grad, scales_requires_grad):
    op = make_op(device, torch.float32, mode, scale_bias=True)
    randomize_biases(op)
    for param in op.parameters():
        param.requires_grad_(weight_requires_grad)
    x = torch.randn(ROWS, IN, requires_grad=input_requires_grad)
    scales = torch.rand(ROWS, requires_grad=scales_requires_grad)
    y = op(x, splits(), scales)
    any_grad = input_requires_grad or weight_requires_grad or scales_requires_grad
    assert y.requires_grad == any_grad
    dy = torch.randn_like(y)
    ref = reference(op, x, dy, scales)
    close(y, ref.y, gemm_tols(torch.float32))
    if any_grad:
        y.backward(dy)
    assert (x.grad is not None) == input_requires_grad
    assert (scales.grad is not None) == scales_requires_grad
    assert all((p.grad is not None) == weight_requires_grad for p in op.parameters())
    tols = gemm_tols(torch.float32)
    if input_requires_grad:
        close(x.grad, ref.dx, tols)
    if scales_requires_grad:
        close(scales.grad, ref.dscales, tols)
    if weight_requires_grad:
        for g in range(G):
            close(weight_grad(op, g), ref.dw[g], tols)
            close(bias_grad(op, g), ref.db[g], tols)


def test_no_grad_forward_matches(device):
    op = make_op(device, scale_bias=True)
    randomize_biases(op)
    x, scales = torch.randn(ROWS, IN, requires_grad=True), torch.rand(ROWS)
    with torch.no_grad():
        y_inference = op(x, splits(), scales)
    assert not y_inference.requires_grad
    assert torch.equal(y_inference, op(x, splits(), scales).detach())


@pytest.mark.parametrize("split_dtype", [torch.uint8, torch.int16, torch.int32, torch.int64])
def test_split_size_dtypes(device, split_dtype):
    op = make_op(device)
    x = torch.randn(ROWS, IN)
    assert torch.equal(op(x, splits(dtype=split_dtype)), op(x, splits()))


def test_leading_dims_are_flattened_to_rows(device):
    op = make_op(device)
    randomize_biases(op)
    x = torch.randn(2, ROWS // 2, IN, requires_grad=True)
    y = op(x, splits())
    assert y.shape == (2, ROWS // 2, OUT)
    dy = torch.randn_like(y)
    y.backward(dy)
    ref = reference(op, x, dy)
    close(y, ref.y, gemm_tols(torch.float32))
    close(x.grad, ref.dx, gemm_tols(torch.float32))


def test_all_rows_in_one_group(device):
    op = make_op(device, mode="single")
    x = torch.randn(ROWS, IN, requires_grad=True)
    y = op(x, splits([0, 0, ROWS, 0]))
    y.backward(torch.ones_like(y))
    assert torch.count_nonzero(op.weight.grad[[0, 1, 3]]) == 0
    assert torch.equal(op.bias.grad[2], torch.full((OUT,), float(ROWS)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_autocast(device, dtype):
    op = make_op(device, dtype)
    randomize_biases(op)
    x = torch.randn(ROWS, IN, dtype=dtype)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        y = op(x, splits())
    assert y.dtype == torch.bfloat16
    ref_op = make_op(device, torch.bfloat16)
    with torch.no_grad():
        for (_, p), (_, q) in zip(ref_op.named_parameters(), op.named_parameters()):
            p.copy_(q)
    assert torch.equal(y, ref_op(x.to(torch.bfloat16), splits()))


# ------------------------------------------------------------------ parameters
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("mode", PARAM_MODES)
def test_parameter_names_and_order(device, mode, bias):
    """The grads follow this order (TE §2.6); refops registers single params at construction."""
    single_weight, single_bias = PARAM_MODES[mode]
    weights = ["weight"] if single_weight else [f"weight{g}" for g in range(G)]
    biases = (["bias"] if single_bias else [f"bias{g}" for g in range(G)]) if bias else []
    op = make_op(device, mode=mode, bias=bias)
    assert [n for n, _ in op.named_parameters()] == weights + biases
    if single_weight:
        assert op.weight.shape == (G, OUT, IN)
    if single_bias and bias:
        assert op.bias.shape == (G, OUT)


@pytest.mark.parametrize("dtype", DTYPES)
def test_init_values_and_modes_identical(device, dtype):
    """kaiming_uniform_(a=sqrt(5)) per group in group order, zero biases, identical in both layouts."""
    torch.manual_seed(3)
    discrete = make_op(device, dtype, "discrete")
    torch.manual_seed(3)
    single = make_op(device, dtype, "single")
    torch.manual_seed(3)
    expected = [torch.empty(OUT, IN, dtype=dtype) for _ in range(G)]
    for w in expected:
        torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5))
    for g in range(G):
        assert torch.equal(discrete.get_parameter(f"weight{g}"), expected[g])
        assert torch.equal(single.weight[g], expected[g])
        assert torch.count_nonzero(discrete.get_parameter(f"bias{g}")) == 0
    assert torch.count_nonzero(single.bias) == 0
    assert single.weight.abs().max() <= 1 / math.sqrt(IN)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_discrete_and_single_modes_compute_identically(device, dtype):
    torch.manual_seed(5)
    ops = [make_op(device, dtype, mode, scale_bias=True) for mode in ("discrete", "single")]
    with torch.no_grad():  # same non-zero biases in both layouts
        biases = torch.randn(G, OUT, dtype=dtype)
        ops[1].bias.copy_(biases)
        for g in range(G):
            ops[0].get_parameter(f"bias{g}").copy_(biases[g])
            ops[0].get_parameter(f"weight{g}").copy_(ops[1].weight[g])
    x, scales = torch.randn(ROWS, IN, dtype=dtype), torch.rand(ROWS, dtype=dtype)
    dy = torch.randn(ROWS, OUT, dtype=dtype)
    results = []
    for op in ops:
        xi, si = x.clone().requires_grad_(), scales.clone().requires_grad_()
        y = op(xi, splits(), si)
        y.backward(dy)
        dw = torch.stack([weight_grad(op, g) for g in range(G)])
        db = torch.stack([bias_grad(op, g) for g in range(G)])
        results.append((y, xi.grad, si.grad, dw, db))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_rng_state_tracker_forks_once_per_group(device):
    class Tracker:
        forks = 0

        @contextlib.contextmanager
        def fork(self):
            Tracker.forks += 1
            yield

    for mode in ("discrete", "single"):
        Tracker.forks = 0
        op = make_op(device, mode=mode, rng_state_tracker_function=Tracker)
        assert Tracker.forks == G
        op.reset_parameters()
        assert Tracker.forks == 2 * G


# ------------------------------------------------------------------ deferred init (meta)
@pytest.mark.parametrize("input_requires_grad", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["discrete", "single"])
def test_meta_construction_matches_eager(device, mode, dtype, input_requires_grad):
    x = torch.randn(ROWS, IN, dtype=dtype)
    scales = torch.rand(ROWS, dtype=dtype)
    dy = torch.randn(ROWS, OUT, dtype=dtype)
    torch.manual_seed(7)
    eager = make_op(device, dtype, mode, scale_bias=True)
    meta = make_op("meta", dtype, mode, scale_bias=True)
    assert all(p.is_meta for p in meta.parameters())
    ids = {n: id(p) for n, p in meta.named_parameters()}
    torch.manual_seed(7)  # materialization at the first forward sees eager construction's RNG state
    outputs = []
    for op in (meta, eager):
        xi, si = x.clone().requires_grad_(input_requires_grad), scales.clone().requires_grad_()
        y = op(xi, splits(), si)
        y.backward(dy)
        outputs.append((y, si.grad, *([xi.grad] if input_requires_grad else [])))
    assert {n: id(p) for n, p in meta.named_parameters()} == ids  # same objects, same count
    for (name, p), (_, q) in zip(meta.named_parameters(), eager.named_parameters()):
        assert p.device == device and torch.equal(p, q), name
        assert torch.equal(p.grad, q.grad), name
    for a, b in zip(*outputs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("mode", ["discrete", "single"])
def test_meta_requires_grad_and_attributes_survive(device, mode):
    meta = make_op("meta", mode=mode, delay_wgrad_compute=True)
    for param in meta.parameters():
        param.requires_grad_(False)
        param.custom_tag = "kept"
    meta(torch.randn(ROWS, IN), splits())
    for param in meta.parameters():
        assert not param.is_meta and not param.requires_grad and param.custom_tag == "kept"
    assert all(getattr(p, "skip_backward_post_hook", False) for n, p in meta.named_parameters() if "weight" in n)


def test_reset_parameters_twice_in_single_mode(device):
    """TE fails on the second call (weight0 is gone); refops keeps count, identity and init rule."""
    op = make_op("meta", mode="single")
    before = [id(p) for p in op.parameters()]
    op.reset_parameters()
    first = op.weight.detach().clone()
    op.reset_parameters()
    assert [id(p) for p in op.parameters()] == before
    assert op.weight.device == device and not torch.equal(op.weight, first)
    assert op.weight.abs().max() <= 1 / math.sqrt(IN)


# ------------------------------------------------------------------ caller buffers
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_linear_caller_buffers(device, dtype):
    """TE's test: fc1 writes its dgrad, fc2 its output into caller buffers (through Sequential)."""
    fc1, fc2 = make_op(device, dtype), make_op(device, dtype)
    seq = Sequential(fc1, fc2)
    out_buf = torch.empty(ROWS, OUT, dtype=dtype)
    dgrad_buf = torch.empty(ROWS, IN, dtype=dtype)
    x = torch.randn(ROWS, IN, dtype=dtype)
    dy = torch.randn(ROWS, OUT, dtype=dtype)
    x_ref = x.clone().requires_grad_()
    y_ref = seq(x_ref, splits(), splits())
    y_ref.backward(dy)
    for _ in range(2):  # beyond TE: the same buffers can be reused every iteration
        xi = x.clone().requires_grad_()
        op_kwargs = {fc1: {GRAD_INPUT_BUFFER_KEY: dgrad_buf}, fc2: {OUTPUT_BUFFER_KEY: out_buf}}
        y = seq(xi, splits(), splits(), op_kwargs=op_kwargs)
        assert y.data_ptr() == out_buf.data_ptr() and not out_buf.requires_grad
        assert torch.equal(y, y_ref) and torch.equal(out_buf, y_ref)
        y.backward(dy)
        assert torch.equal(dgrad_buf, xi.grad) and torch.equal(xi.grad, x_ref.grad)


@pytest.mark.parametrize("key", [OUTPUT_BUFFER_KEY, GRAD_INPUT_BUFFER_KEY])
@pytest.mark.parametrize("problem", ["shape", "dtype", "device", "non_contiguous", "requires_grad"])
def test_caller_buffer_errors(device, key, problem):
    op = make_op(device)
    shape = (ROWS, OUT) if key == OUTPUT_BUFFER_KEY else (ROWS, IN)
    buffer = {
        "shape": lambda: torch.empty(ROWS + 1, shape[1]),
        "dtype": lambda: torch.empty(shape, dtype=torch.float16),
        "device": lambda: torch.empty(shape, device="meta"),  # a real second device needs no GPU this way
        "non_contiguous": lambda: torch.empty(shape[1], ROWS).t(),
        "requires_grad": lambda: torch.empty(shape, requires_grad=True),
    }[problem]()
    with pytest.raises(ValueError, match=key):
        op(torch.randn(ROWS, IN, requires_grad=True), splits(), **{key: buffer})


def test_caller_buffer_direct_call_and_bad_kwargs(device):
    op = make_op(device)
    x = torch.randn(ROWS, IN)
    buffer = torch.empty(ROWS, OUT)
    y = op(x, splits(), output=buffer)
    assert y.data_ptr() == buffer.data_ptr() and torch.equal(y, op(x, splits()))
    with pytest.raises(TypeError, match="torch.Tensor"):
        op(x, splits(), output=[0.0] * ROWS)
    with pytest.raises(TypeError, match="unexpected forward kwargs"):
        op(x, splits(), outputs=buffer)


# ------------------------------------------------------------------ weight-grad variants
@pytest.mark.parametrize("mode", ["discrete", "single"])
def test_delay_wgrad_compute(device, mode):
    torch.manual_seed(11)
    eager = make_op(device, mode=mode)
    torch.manual_seed(11)
    delayed = make_op(device, mode=mode, delay_wgrad_compute=True)
    calls = []
    delayed.register_wgrad_accumulation_and_reduce_hooks(lambda: calls.append(1))
    assert delayed.need_backward_dw() and not eager.need_backward_dw()
    weights = [p for n, p in delayed.named_parameters() if n.startswith("weight")]
    assert all(p.skip_backward_post_hook for p in weights)
    x, dy = torch.randn(ROWS, IN), torch.randn(ROWS, OUT)
    for step in (1, 2):
        for op in (eager, delayed):
            xi = x.clone().requires_grad_()
            op(xi, splits()).backward(dy)
        if step == 1:
            assert all(p.grad is None for p in weights)  # queued, not computed
        pairs = zip(eager.named_parameters(), delayed.named_parameters())
        assert all(torch.equal(p.grad, q.grad) for (name, p), (_, q) in pairs if name.startswith("bias"))
        delayed.backward_dw()
        for (_, p), (_, q) in zip(eager.named_parameters(), delayed.named_parameters()):
            assert torch.equal(p.grad, q.grad)  # step 2: both accumulated twice
        assert calls == [1] * step
    delayed.backward_dw()  # nothing queued: a no-op
    assert calls == [1, 1]


@pytest.mark.parametrize("variant", ["accumulate", "overwrite", "grad_added", "delayed"])
@pytest.mark.parametrize("mode", ["discrete", "single"])
def test_accumulate_into_main_grad(device, mode, variant):
    op = make_op(device, mode=mode, accumulate_into_main_grad=True, delay_wgrad_compute=variant == "delayed")
    weights = [p for n, p in op.named_parameters() if n.startswith("weight")]
    for w in weights:
        w.main_grad = torch.full(w.shape, 0.5)
        if variant == "overwrite":
            w.overwrite_main_grad = True
        if variant == "grad_added":
            w.grad_added_to_main_grad = False
    x, dy = torch.randn(ROWS, IN, requires_grad=True), torch.randn(ROWS, OUT)
    op(x, splits()).backward(dy)
    ref = reference(op, x, dy)
    if variant == "delayed":
        assert all(torch.equal(w.main_grad, torch.full(w.shape, 0.5)) for w in weights)
        op.backward_dw()
    main_grads = torch.cat([w.main_grad.reshape(-1, OUT, IN) for w in weights])
    offset = 0.0 if variant == "overwrite" else 0.5
    close(main_grads - offset, torch.stack(ref.dw), gemm_tols(torch.float32))
    for w in weights:
        if variant == "grad_added":
            assert w.grad_added_to_main_grad and torch.count_nonzero(w.grad) == 0
        else:
            assert w.grad is None
    close(bias_grad(op, 2), ref.db[2], dtype_tols(torch.float32))


def test_accumulate_into_main_grad_requires_main_grad(device):
    op = make_op(device, accumulate_into_main_grad=True)
    with pytest.raises(RuntimeError, match="main_grad"):
        op(torch.randn(ROWS, IN), splits())


# ------------------------------------------------------------------ Sequential
def test_sequential_with_extra_inputs(device):
    """GroupedLinear -> GroupedLinear(scale_bias): extra inputs (splits, splits, scales) go to Sequential."""
    fc1 = make_op(device)
    fc2 = make_op(device, mode="single", scale_bias=True)
    randomize_biases(fc1)
    randomize_biases(fc2)
    seq = Sequential(fc1, fc2)
    x = torch.randn(ROWS, IN, requires_grad=True)
    scales = torch.rand(ROWS, requires_grad=True)
    y = seq(x, splits(), splits(dtype=torch.int32), scales)
    dy = torch.randn_like(y)
    y.backward(dy)

    h = reference(fc1, x, torch.zeros(ROWS, OUT))  # forward of fc1 only
    h64 = h.y.requires_grad_()
    ref2 = reference(fc2, h64, dy, scales)
    h64.backward(ref2.dx)
    x_ref = reference(fc1, x, h64.grad)
    tols = gemm_tols(torch.float32)
    close(y, ref2.y, tols)
    close(x.grad, x_ref.dx, tols)
    close(scales.grad, ref2.dscales, tols)
    for g in range(G):
        close(weight_grad(fc1, g), x_ref.dw[g], tols)
        close(weight_grad(fc2, g), ref2.dw[g], tols)
        close(bias_grad(fc2, g), ref2.db[g], tols)
    assert all(p.grad is not None for p in seq.parameters())


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(num_groups=0), "num_groups"),
        (dict(in_features=0), "in_features"),
        (dict(out_features=-1), "out_features"),
        (dict(dtype=torch.float64), "supported dtypes"),
    ],
)
def test_constructor_errors(device, kwargs, match):
    args = dict(num_groups=G, in_features=IN, out_features=OUT) | kwargs
    with pytest.raises(ValueError, match=match):
        GroupedLinear(args.pop("num_groups"), args.pop("in_features"), args.pop("out_features"), **args)


def test_forward_input_errors(device):
    op = make_op(device, scale_bias=True)
    x, scales = torch.randn(ROWS, IN), torch.rand(ROWS)
    with pytest.raises(ValueError, match="Expected 4 splits, but got 3"):
        op(x, splits([8, 12, 4]), scales)
    with pytest.raises(ValueError, match="sum to 23"):
        op(x, splits([8, 0, 11, 4]), scales)
    with pytest.raises(ValueError, match="non-negative"):
        op(x, splits([10, -2, 12, 4]), scales)
    with pytest.raises(TypeError, match="integer tensor"):
        op(x, torch.tensor([8.0, 0.0, 12.0, 4.0]), scales)
    with pytest.raises(ValueError, match="in_features=16"):
        op(torch.randn(ROWS, IN + 1), splits(), scales)
    with pytest.raises(TypeError, match="dtype"):
        op(x.half(), splits(), scales)
    with pytest.raises(ValueError, match="one entry per input row"):
        op(x, splits(), torch.rand(ROWS - 1))
    with pytest.raises(TypeError, match="floating-point"):
        op(x, splits(), torch.ones(ROWS, dtype=torch.int64))


def _replace(op, name, **kw):
    old = op.get_parameter(name)
    op.register_parameter(name, torch.nn.Parameter(torch.zeros(old.shape, **kw)))


@pytest.mark.parametrize(
    "mode,bias,corrupt,match",
    [
        ("discrete", True, lambda op: _replace(op, "weight2", dtype=torch.float16), "Weight 2 has dtype"),
        ("discrete", True, lambda op: op.weight1.requires_grad_(False), "Weight 1 has requires_grad"),
        ("discrete", True, lambda op: _replace(op, "bias3", dtype=torch.bfloat16), "Bias 3 has dtype"),
        ("discrete", True, lambda op: op.register_parameter("bias2", None), "bias 2 is uninitialized"),
        ("discrete", False, lambda op: op.register_parameter("bias1", torch.nn.Parameter(torch.zeros(OUT))),
         "Expected no biases, but bias 1"),
        ("single", True, lambda op: op.bias.requires_grad_(False), "Bias has requires_grad"),
        ("single", True, lambda op: _replace(op, "bias", dtype=torch.float16), "Bias has dtype"),
    ],
)
def test_inconsistent_parameters_are_named(device, mode, bias, corrupt, match):
    op = make_op(device, mode=mode, bias=bias)
    corrupt(op)
    with pytest.raises(RuntimeError, match=match):
        op(torch.randn(ROWS, IN), splits())
