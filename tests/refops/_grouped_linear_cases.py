"""GroupedLinear test setup shared by the ``test_op_grouped_linear*`` files: sizes, op factory, float64 reference."""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from refops.ops.basic.grouped_linear import GroupedLinear

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
