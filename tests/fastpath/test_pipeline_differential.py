"""A whole pipeline under the fast path vs the reference backend: LayerNorm -> Linear -> GELU -> Linear.

256 tokens, forward and backward, two training steps (delayed scaling updates its
scales in between), under every recipe of ``refops.testing.RECIPE_NAMES`` and
without quantization. Two models with the same parameters run the same inputs,
one per backend. The GEMM path (``torch._scaled_mm`` or not) must be the one
``fastpath.gemm.GEMM_PATHS`` lists for the recipe.

How outputs and gradients are compared (:func:`assert_close`). The two backends
round the same values in different orders (GEMM accumulation, norm statistics),
so an intermediate bf16 element now and then lands one ulp away from the
reference's; GELU and the next GEMM carry that into many outputs. An output near
zero (cancellation in the GEMM) then differs by several of its own ulps while the
error is tiny on the scale of the terms it sums. So every tensor passes two checks:

* whole tensor, the ``"sqnr"`` tier: the error's energy against the signal's.
  Floors: a quantized recipe, 20 dB (``refops.testing.compare_modules``' floor for
  a quantized pipeline); high precision, the larger of 40 dB and
  ``-20 log10(rtol)``. One bf16 rounding is a relative error of at most 2^-8, an
  SQNR of at least 48 dB; 40 dB leaves room for about six such roundings' worth
  of differences in every element (48.2 - 10 log10 6.6 = 40). An error of ``rtol`` of
  every element's magnitude, the element-wise tolerance taken as a whole, has
  SQNR ``-20 log10(rtol)``: 36 dB for bf16, 60 dB for fp16 and fp32 (``gemm_tols``),
  so fp32 pipelines are held to 60 dB. Measured on an H200: 73 to 81 dB in bf16.
* element-wise, the ``"tolerance"`` tier with ``rtol`` of the recipe
  (``quantization_tols``) or dtype (``gemm_tols``) and ``atol = rtol * max|reference|``:
  every element of a GEMM output sums terms on the scale of the tensor, so its
  error is bounded by ``rtol`` of that scale (the largest magnitude bounds it from
  above), not of its own value, which cancellation can make arbitrarily small.
"""

from __future__ import annotations

import math
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


#: SQNR floor (dB) of any tensor of a quantized pipeline (refops.testing.compare_modules' floor).
QUANTIZED_SQNR_FLOOR_DB = 20.0
#: The least SQNR floor (dB) of a high-precision pipeline: about six bf16 roundings' worth of difference.
HIGH_PRECISION_SQNR_FLOOR_DB = 40.0


def tolerances(recipe_name: Optional[str], dtype: torch.dtype) -> dict[str, float]:
    return quantization_tols(recipe_name) if recipe_name else gemm_tols(dtype)


def sqnr_floor_db(recipe_name: Optional[str], tols: dict[str, float]) -> float:
    """The whole-tensor floor (see the module docstring)."""
    if recipe_name:
        return QUANTIZED_SQNR_FLOOR_DB
    return max(HIGH_PRECISION_SQNR_FLOOR_DB, -20.0 * math.log10(tols["rtol"]))


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, tols: dict[str, float],
                 floor_db: float) -> None:
    """SQNR >= ``floor_db`` and ``|a - e| <= rtol * (|e| + max|e|)`` element-wise (module docstring)."""
    assert actual is not None and expected is not None, f"{what}: a gradient is missing"
    scale = float(expected.detach().float().abs().amax()) if expected.numel() else 0.0
    whole = compare_tensors(f"{what} (SQNR)", actual, expected, tier="sqnr", sqnr_floor_db=floor_db)
    elements = compare_tensors(what, actual, expected, tier="tolerance", rtol=tols["rtol"], atol=tols["rtol"] * scale)
    failures = [] if whole.passed else [str(whole)]
    if not elements.passed:
        i = elements.first_mismatches[0]
        a = actual.dequantize() if hasattr(actual, "dequantize") else actual
        e = expected.dequantize() if hasattr(expected, "dequantize") else expected
        failures.append(f"{elements}; at {i}: fastpath {a[i].item()!r} vs reference {e[i].item()!r} "
                        f"(|max| of the reference {scale:.3e})")
    assert not failures, "\n".join(failures)


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
    floor = sqnr_floor_db(recipe_name, tols)
    for step, ((y, dx, pgrads), (y_ref, dx_ref, pgrads_ref)) in enumerate(zip(actual, expected)):
        assert_close(y, y_ref, f"step {step} output", tols, floor)
        assert_close(dx, dx_ref, f"step {step} input grad", tols, floor)
        for name, grad_ref in pgrads_ref.items():
            assert_close(pgrads[name], grad_ref, f"step {step} {name}.grad", tols, floor)

    uses_scaled_mm = GEMM_PATHS[recipe_name or "none"].path == "scaled_mm"
    # Per step: fprop, dgrad and wgrad of both linears.
    assert len(scaled_mm_calls) == (6 * STEPS if uses_scaled_mm else 0), GEMM_PATHS[recipe_name or "none"]
