"""A whole pipeline under the fast path vs the reference backend: LayerNorm -> Linear -> GELU -> Linear.

256 tokens, forward and backward, two training steps (delayed scaling updates its
scales in between), under every recipe of ``refops.testing.RECIPE_NAMES`` and
without quantization. Two models with the same parameters run the same inputs,
one per backend. Every output and gradient went through a GEMM, so each is
compared element-wise with the recipe's ``quantization_tols`` (``gemm_tols``
without quantization); the absolute part of the tolerance is taken relative to
the tensor's largest magnitude (at least 5% of rtol), so that cancellation near
zero in a GEMM output does not fail a comparison whose error is set by the
inputs' scale. The GEMM path (``torch._scaled_mm`` or not) must be the one
``fastpath.gemm.GEMM_PATHS`` lists for the recipe.
"""

from __future__ import annotations

from typing import Optional

import pytest
import torch

import refops
import refops as te
from fastpath.gemm import GEMM_PATHS
from refops.ops.basic.activation import GELU
from refops.ops.basic.layer_norm import LayerNorm
from refops.ops.sequential import Sequential
from refops.testing import RECIPE_NAMES, gemm_tols, make_recipe, quantization_tols
from refops.testing.tensor_report import compare_tensors

TOKENS = 256
STEPS = 2


def build(hidden: int, ffn: int, dtype: torch.dtype, device: torch.device) -> Sequential:
    torch.manual_seed(0)
    model = Sequential(
        LayerNorm(hidden, device=device, dtype=dtype),
        te.ops.Linear(hidden, ffn, device=device, dtype=dtype),
        GELU(),
        te.ops.Linear(ffn, hidden, device=device, dtype=dtype),
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or name.startswith("0."):
                p.add_(torch.empty_like(p).uniform_(-0.5, 0.5))  # non-trivial norm params and biases
    return model


def tolerances(recipe_name: Optional[str], dtype: torch.dtype) -> dict[str, float]:
    return quantization_tols(recipe_name) if recipe_name else gemm_tols(dtype)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, tols: dict[str, float]) -> None:
    assert actual is not None and expected is not None, f"{what}: a gradient is missing"
    scale = float(expected.detach().float().abs().amax()) if expected.numel() else 0.0
    atol = max(tols["atol"], 0.05 * tols["rtol"]) * max(scale, 1e-6)
    result = compare_tensors(what, actual, expected, tier="tolerance", rtol=tols["rtol"], atol=atol)
    if not result.passed:
        i = result.first_mismatches[0]
        a = actual.dequantize() if hasattr(actual, "dequantize") else actual
        e = expected.dequantize() if hasattr(expected, "dequantize") else expected
        raise AssertionError(f"{result}; at {i}: fastpath {a[i].item()!r} vs reference {e[i].item()!r} "
                             f"(|max| of the reference {scale:.3e})")


def run_steps(model, backend, recipe_name, inputs, grads):
    """Forward + backward ``STEPS`` times; returns per step (y, x.grad, {param: grad})."""
    recipe = make_recipe(recipe_name) if recipe_name else None
    results = []
    for x, dy in zip(inputs, grads):
        for p in model.parameters():
            p.grad = None
        x = x.clone().requires_grad_(True)
        with refops.use_backend(backend), te.autocast(enabled=recipe is not None, recipe=recipe):
            y = model(x)
        y.backward(dy)
        results.append((y.detach(), x.grad, {n: p.grad for n, p in model.named_parameters()}))
    return results


CASES = [(name, torch.bfloat16) for name in (None, *RECIPE_NAMES)]
CASES += [(None, torch.float32), ("fp8_current_scaling", torch.float32)]


@pytest.mark.parametrize("hidden,ffn", [(256, 1024), (1024, 256)], ids=["h256-ffn1024", "h1024-ffn256"])
@pytest.mark.parametrize("recipe_name,dtype", CASES, ids=[f"{r or 'none'}-{str(d)[6:]}" for r, d in CASES])
def test_layernorm_mlp_fastpath_vs_reference(recipe_name, dtype, hidden, ffn, cuda, reference_backend,
                                             fastpath_backend, monkeypatch):
    reference_model = build(hidden, ffn, dtype, cuda)
    fast_model = build(hidden, ffn, dtype, cuda)
    fast_model.load_state_dict(reference_model.state_dict())
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(TOKENS, hidden, generator=g).to(dtype).to(cuda) for _ in range(STEPS)]
    grads = [(torch.randn(TOKENS, hidden, generator=g) * 0.1).to(dtype).to(cuda) for _ in range(STEPS)]

    expected = run_steps(reference_model, reference_backend, recipe_name, inputs, grads)
    scaled_mm_calls = []
    real_scaled_mm = torch._scaled_mm

    def counting_scaled_mm(*args, **kwargs):
        scaled_mm_calls.append(1)
        return real_scaled_mm(*args, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", counting_scaled_mm)
    actual = run_steps(fast_model, fastpath_backend, recipe_name, inputs, grads)
    torch.cuda.synchronize()

    tols = tolerances(recipe_name, dtype)
    for step, ((y, dx, pgrads), (y_ref, dx_ref, pgrads_ref)) in enumerate(zip(actual, expected)):
        assert_close(y, y_ref, f"step {step} output", tols)
        assert_close(dx, dx_ref, f"step {step} input grad", tols)
        for name, grad_ref in pgrads_ref.items():
            assert_close(pgrads[name], grad_ref, f"step {step} {name}.grad", tols)

    uses_scaled_mm = GEMM_PATHS[recipe_name or "none"].path == "scaled_mm"
    # Per step: fprop, dgrad and wgrad of both linears.
    assert len(scaled_mm_calls) == (6 * STEPS if uses_scaled_mm else 0), GEMM_PATHS[recipe_name or "none"]
