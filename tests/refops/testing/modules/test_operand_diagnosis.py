"""A module's exposed quantized operands that differ from the reference's are diagnosed, not only counted."""

from __future__ import annotations

import torch

import refops as te
from refops.testing import compare_modules


def _current_scaling(t: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    fmax = torch.finfo(fp8).max
    scale = (fmax / t.float().abs().amax()).reshape(1)
    return (t.float() * scale).clamp(-fmax, fmax).to(fp8), torch.reciprocal(scale)


class _Cast(torch.autograd.Function):
    """Forward: the values as they are; backward: the output grad cast to ``grad_format``, recorded."""

    @staticmethod
    def forward(ctx, y, module):
        ctx.module = module
        return y.view_as(y)

    @staticmethod
    def backward(ctx, dy):
        data, scale_inv = _current_scaling(dy, ctx.module.grad_format)
        ctx.module.operands["grad_output"] = (data, scale_inv)
        return dy, None


class _ExposingFp8Linear(torch.nn.Module):
    """A plain-torch current-scaling linear that exposes the operands it quantized, its grad cast to ``grad_format``."""

    def __init__(self, grad_format: torch.dtype) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(32, 64) * 0.1)
        self.bias = torch.nn.Parameter(torch.zeros(32))
        self.grad_format = grad_format
        self.operands: dict = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (xd, xs), (wd, ws) = _current_scaling(x, torch.float8_e4m3fn), _current_scaling(self.weight, torch.float8_e4m3fn)
        self.operands = {"input": (xd, xs), "weight": (wd, ws)}
        xq = x + (xd.float() * xs - x).detach()
        wq = self.weight + (wd.float() * ws - self.weight).detach()
        return _Cast.apply(xq @ wq.t() + self.bias, self)

    def refops_quantized_operands(self) -> dict:
        return self.operands


def _compare(grad_format: torch.dtype):
    torch.manual_seed(0)
    return compare_modules(_ExposingFp8Linear(grad_format), te.ops.Linear(64, 32), (torch.randn(16, 64),),
                           recipe=te.recipe.Float8CurrentScaling(), scenarios=("one step",), metamorphic=False)


def test_grads_cast_to_e4m3_under_hybrid_are_named_as_such_with_the_scale_ratio():
    report = _compare(torch.float8_e4m3fn)
    failing = {c.name: c for c in report.failures if c.kind == "bytes"}
    data, scale = failing["operand grad_output[rowwise data]"], failing["operand grad_output[rowwise scale_inv]"]
    for line in (data, scale):
        assert "E4M3 quantization of the same values" in line.why and "E5M2 was expected" in line.why
        assert "2^7" in line.why  # 448 / 57344: the scale of E4M3's max
    assert "E4M3 quantization" in str(report)


def test_the_correct_e5m2_grads_give_no_byte_failure():
    report = _compare(torch.float8_e5m2)
    assert [c.name for c in report.failures if c.kind == "bytes"] == []
    assert report["operand grad_output[rowwise data]"].passed


def test_an_operand_the_reference_lacks_is_a_failure_without_fabricated_values():
    model = _ExposingFp8Linear(torch.float8_e5m2)
    model.refops_quantized_operands = lambda: {**model.operands, "bias": model.operands["input"]}
    torch.manual_seed(0)
    report = compare_modules(model, te.ops.Linear(64, 32), (torch.randn(16, 64),),
                             recipe=te.recipe.Float8CurrentScaling(), scenarios=("one step",), metamorphic=False)
    lacking = next(c for c in report.failures if c.name.startswith("operand bias"))
    assert lacking.numel == 0 and lacking.criterion == "present on both sides"
    assert "mismatches=" not in str(lacking) and "the reference has none of" in lacking.why
