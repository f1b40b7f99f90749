"""Quantized tensor parallelism on 2 ranks.

D5: quantizing each rank's shard and gathering the quantized data is bit-exact with gathering
the high-precision shards and quantizing once, for every scheme (the shards' global scale is
shared through amax reduction), and the ranks end with identical scales.
D6: ``BasicLinear`` / ``Linear`` with TP under ``autocast`` of each recipe against a float64
reference within ``quantization_tols``, and the gathered operand's quantizer state equal
across ranks.
"""

from __future__ import annotations

import pytest
import torch

from refops.ops.tensor_parallel_gather import gather_along_first_dim
from refops.quantization import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
)
from refops.quantization.quantizer import DType
from refops.testing import quantization_tols

from _tp_reference import expected, make_case, rank_device, run_case

WORLD = 2
E4M3 = DType.kFloat8E4M3

#: name -> (shard shape, dtype, quantizer factory(device, reduce)); every quantizer makes both usages.
SCHEMES = {
    "fp8_current_scaling": ((32, 64), torch.float32, lambda d, reduce: Float8CurrentScalingQuantizer(
        E4M3, d, with_amax_reduction=reduce)),
    "fp8_delayed_scaling": ((32, 64), torch.float32, lambda d, reduce: Float8Quantizer(
        torch.full((1,), 96.0, device=d), torch.zeros(1, device=d), E4M3)),
    "mxfp8": ((32, 64), torch.bfloat16, lambda d, reduce: MXFP8Quantizer(E4M3)),
    "mxfp8_3d": ((2, 16, 64), torch.float32, lambda d, reduce: MXFP8Quantizer(E4M3)),
    "fp8_block_1d": ((128, 64), torch.float32, lambda d, reduce: Float8BlockQuantizer(
        E4M3, rowwise=True, columnwise=True, block_scaling_dim=1)),
    "fp8_block_2d": ((128, 160), torch.bfloat16, lambda d, reduce: Float8BlockQuantizer(
        E4M3, rowwise=True, columnwise=True, block_scaling_dim=2)),
    "fp8_block_1d_unaligned": ((32, 64), torch.float32, lambda d, reduce: Float8BlockQuantizer(
        E4M3, rowwise=True, columnwise=True, block_scaling_dim=1)),
    "nvfp4": ((32, 64), torch.float32, lambda d, reduce: NVFP4Quantizer(with_amax_reduction=reduce)),
    "nvfp4_rht": ((32, 64), torch.bfloat16, lambda d, reduce: NVFP4Quantizer(
        with_amax_reduction=reduce, with_rht=True, with_post_rht_amax=True)),
    "nvfp4_2d": ((32, 64), torch.bfloat16, lambda d, reduce: NVFP4Quantizer(
        with_amax_reduction=reduce, with_2d_quantization=True)),
    "nvfp4_row_scaled": ((32, 64), torch.float32, lambda d, reduce: NVFP4Quantizer(
        with_amax_reduction=reduce, row_scaled_nvfp4=True)),
}


@pytest.fixture
def device_type(request) -> str:
    return torch.device(request.config.getoption("--device")).type


def _shards(name: str, world: int) -> list[torch.Tensor]:
    """Per-rank shards with different ranges (rank r up to 3^r), so a local amax would differ."""
    shape, dtype, _ = SCHEMES[name]
    g = torch.Generator().manual_seed(len(name))
    return [((torch.rand(shape, generator=g) - 0.3) * 3.0 ** r).to(dtype) for r in range(world)]


def _quantized_gathers(rank: int, world: int, device_type: str) -> dict:
    device = rank_device(rank, device_type)
    out = {}
    for name, (_, _, make) in SCHEMES.items():
        shards = [s.to(device) for s in _shards(name, world)]
        quantizer = make(device, True)
        gathered = gather_along_first_dim(shards[rank], None, quantizer=quantizer)
        reference = make(device, False)(torch.cat(shards))
        g_tensors, g_meta = gathered.to_plain_tensors()
        r_tensors, r_meta = reference.to_plain_tensors()
        out[name] = {
            "type": (type(gathered).__name__, type(reference).__name__),
            "shape": (tuple(gathered.shape), tuple(reference.shape)),
            "meta": (g_meta["meta"], r_meta["meta"]),
            "gathered": {k: v.cpu() for k, v in g_tensors.items() if not k.startswith("quantizer.")},
            "reference": {k: v.cpu() for k, v in r_tensors.items() if not k.startswith("quantizer.")},
            "scale": getattr(quantizer, "scale", torch.zeros(1)).cpu().clone(),
        }
    out["errors"] = _gather_errors(rank, device)
    return out


def _gather_errors(rank: int, device: torch.device) -> dict:
    """Refusals: different delayed-scaling scales per rank; an unaligned shard that is already quantized."""
    errors = {}
    x = torch.rand(32, 64, device=device)
    per_rank_scale = Float8Quantizer(torch.full((1,), 1.0 + rank, device=device), torch.zeros(1, device=device), E4M3)
    try:
        gather_along_first_dim(per_rank_scale(x), None)
    except ValueError as e:
        errors["scales"] = str(e)
    block = Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True, block_scaling_dim=1)
    try:
        gather_along_first_dim(block(x), None)
    except ValueError as e:
        errors["unaligned"] = str(e)
    return errors


def test_quantize_then_gather_is_bit_exact(ranks, device_type):
    """D5: every array (data, scales, amaxes) equals quantizing the gathered tensor; scales agree across ranks."""
    results = ranks(_quantized_gathers, device_type)
    for name in SCHEMES:
        for rank, per_rank in enumerate(results):
            got = per_rank[name]
            label = f"{name} rank {rank}"
            assert got["type"][0] == got["type"][1], label
            assert got["shape"][0] == got["shape"][1], label
            assert got["meta"][0] == got["meta"][1], label
            assert sorted(got["gathered"]) == sorted(got["reference"]), label
            for key, value in got["reference"].items():
                assert torch.equal(got["gathered"][key], value), f"{label}: {key}"
        assert torch.equal(results[0][name]["scale"], results[1][name]["scale"]), name
    for per_rank in results:
        assert "the ranks' Float8Tensor scale_inv differ" in per_rank["errors"]["scales"]
        assert "does not quantize to whole blocks along dim 0" in per_rank["errors"]["unaligned"]


# ----------------------------------------------------------------------- D6
RECIPES = ("fp8_current_scaling", "fp8_delayed_scaling", "mxfp8", "fp8_block_scaling", "nvfp4")
CONFIGS = (("linear", "column", True), ("linear", "row", True), ("linear", "column", False),
           ("linear", "row", False), ("basic_linear", "column", True), ("basic_linear", "row", True))


def _cases(recipe: str) -> list[dict]:
    cases = [
        make_case(kind, mode, sp, torch.bfloat16, world=WORLD, seed=100 + i, batch=64, in_features=64,
                  out_features=64, recipe=recipe, steps=2)
        for i, (kind, mode, sp) in enumerate(CONFIGS)
    ]
    if recipe == "fp8_block_scaling":  # 128 rows per rank: the gathers move quantized blocks (32 rows fall back)
        cases += [make_case("basic_linear", mode, True, torch.bfloat16, world=WORLD, seed=120, batch=256,
                            in_features=64, out_features=64, recipe=recipe, steps=2) for mode in ("column", "row")]
    return cases


def _run_quantized(rank: int, world: int, device_type: str, cases: list[dict]) -> list[dict]:
    device = rank_device(rank, device_type)
    return [run_case(case, rank, world, device) for case in cases]


@pytest.mark.parametrize("recipe", RECIPES)
def test_tensor_parallel_linear_under_autocast(ranks, device_type, recipe):
    """D6: y, dx, dW (db) within quantization_tols of float64; the input quantizer's amax/scale equal on both ranks."""
    cases = _cases(recipe)
    results = ranks(_run_quantized, device_type, cases)
    tols = quantization_tols(recipe)
    for i, case in enumerate(cases):
        label = f"{recipe} {case['kind']} mode={case['mode']} sp={case['sp']}"
        for rank in range(WORLD):
            got, want = results[rank][i], expected(case, rank, WORLD)
            for name in want:
                torch.testing.assert_close(got[name], want[name], **tols, msg=lambda m: f"{label} rank {rank} {name}: {m}")
        if case["mode"] == "column" and case["sp"]:  # the gathered input: one global scale
            for key in ("amax", "scale"):
                if key in results[0][i]:
                    assert torch.equal(results[0][i][key], results[1][i][key]), f"{label}: {key}"


def _norm_then_gather(rank: int, world: int, device_type: str, recipes: tuple[str, ...]) -> dict:
    """LayerNorm -> column Linear, with SP (the norm quantizes the shard, the linear gathers it) and
    without (the norm quantizes the full input); same parameters, same data."""
    device = rank_device(rank, device_type)
    out = {}
    for recipe in recipes:
        for sp in (True, False):
            case = make_case("ln_linear", "column", sp, torch.bfloat16, world=WORLD, seed=7, batch=64,
                             in_features=64, out_features=64, recipe=recipe)
            out[recipe, sp] = run_case(case, rank, world, device)
    return out


NORM_RECIPES = ("fp8_current_scaling", "fp8_delayed_scaling", "mxfp8", "nvfp4", "fp8_block_scaling")


def test_a_norm_quantized_shard_gathers_like_the_full_input(ranks, device_type):
    """With SP the linear gathers the norm's quantized shards; that equals quantizing the full norm output,
    so SP and non-SP runs agree bit for bit (FP8 block scaling: 32-row shards take TE's high-precision
    fallback, so only within tolerance)."""
    results = ranks(_norm_then_gather, device_type, NORM_RECIPES)
    for rank, got in enumerate(results):
        for recipe in NORM_RECIPES:
            sp, full = got[recipe, True], got[recipe, False]
            pairs = {"y": (sp["y"], full["y"]), "dw": (sp["dw"], full["dw"]), "db": (sp["db"], full["db"]),
                     "dx": (sp["dx"], full["dx"].chunk(WORLD)[rank])}
            for name, (a, b) in pairs.items():
                if recipe == "fp8_block_scaling":
                    torch.testing.assert_close(a, b, **quantization_tols(recipe), msg=f"{recipe} {name}")
                else:
                    assert torch.equal(a, b), f"{recipe} rank {rank}: {name} differs between SP and non-SP"
