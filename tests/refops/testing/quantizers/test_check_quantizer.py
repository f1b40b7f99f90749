"""refops.testing.check_quantizer: a candidate quantizer against the reference on adversarial inputs, bit for bit."""

from __future__ import annotations

import pytest
import torch

import refops as te
from refops.quantization import (
    DType,
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
)
from refops.testing import RECIPE_NAMES, check_quantizer, make_recipe
from refops.testing.quantizers.cases import CASES

FLT_MAX = torch.finfo(torch.float32).max


def _amax(x: torch.Tensor) -> torch.Tensor:
    a = x.float().abs()
    return torch.where(torch.isnan(a), torch.zeros_like(a), a).amax().reshape(1)


def fp8_cs_dividing(x):
    """The bug of the issue: ``x / (amax / 448)`` instead of ``x * (448 / amax)``, dequantized."""
    scale_inv = _amax(x) / 448.0
    data = (x.float() / scale_inv).clamp(-448, 448).to(torch.float8_e4m3fn)
    return (data.float() * scale_inv).to(x.dtype)


def fp8_cs_multiplying(x, quantizer):
    """A correct plain-torch current-scaling quantizer: TE's order and edge cases, both orientations."""
    amax = _amax(x)
    scale = torch.tensor([448.0]) / amax
    scale = torch.where((amax == 0) | torch.isinf(amax), torch.ones_like(scale), scale)
    scale = torch.where(torch.isinf(scale), torch.full_like(scale, FLT_MAX), scale)
    data = (x.float() * scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    if quantizer.columnwise_usage:
        data = data.reshape(-1, x.shape[-1]).t().contiguous()
    return data, torch.reciprocal(scale)


def test_the_division_instead_of_multiplication_bug_is_caught_with_evidence():
    report = check_quantizer(fp8_cs_dividing, te.recipe.Float8CurrentScaling())
    assert not report.ok
    ties = report["ties", "float32", "rowwise"]
    assert ties.status == "differs" and ties.code_mismatches > 100  # the constructed ties expose it
    assert report["normal", "float32", "rowwise"].status == "ok"  # random values alone would not
    text = str(report)
    assert "FAILED" in text and "first mismatches (" in text and "ties/float32/rowwise at [" in text
    assert "(code 0x" in text  # expected value, with the reference's code and scale
    assert "a code and a scale that disagree" in text  # the dequantized tier's limit, stated
    with pytest.raises(AssertionError, match="ties"):
        report.assert_ok()


def test_the_first_mismatch_names_input_expected_and_got_codes_and_scales():
    def dividing(x, quantizer):
        scale_inv = _amax(x) / 448.0
        data = (x.float() / scale_inv).clamp(-448, 448).to(torch.float8_e4m3fn)
        return {"data": data if quantizer.rowwise_usage else data.t().contiguous(), "scale_inv": scale_inv}

    report = check_quantizer(dividing, Float8CurrentScalingQuantizer(DType.kFloat8E4M3), cases=["ties"],
                             dtypes=[torch.float32])
    assert report.output == "data_and_scale_inv (inferred from the first result)"
    assert [r.status for r in report.runs if r.layout == "contiguous"] == ["differs", "differs"]
    assert {r.status for r in report.runs} == {"differs"}  # in the other layouts too
    first = report.mismatches[0]
    assert first.case == "ties" and first.dtype == "float32" and first.usage == "rowwise"
    assert first.expected_code != first.got_code  # a code that differs is listed before a scale that differs
    assert first.expected_code.startswith("0x") and "scale" not in first.expected_code
    assert first.expected_scale != "-" and first.got_scale != "-"


def test_a_correct_plain_torch_candidate_passes_every_case_in_both_orientations():
    report = check_quantizer(fp8_cs_multiplying, te.recipe.Float8CurrentScaling())
    report.assert_ok()
    statuses = {(r.case, r.dtype, r.usage): r.status for r in report.runs}
    assert len(statuses) == sum(len(c.dtypes or (1, 2, 3)) for c in CASES) * 2
    assert set(statuses.values()) == {"ok"}
    assert report["ties", "bfloat16", "columnwise"].elements == 64 * 128


@pytest.mark.parametrize("recipe_name", RECIPE_NAMES)
@pytest.mark.parametrize("role", ["input", "weight"])
def test_the_reference_quantizer_passes_for_every_recipe(recipe_name, role):
    report = check_quantizer(lambda x, quantizer: quantizer(x), make_recipe(recipe_name), role=role)
    report.assert_ok()
    assert report.output.startswith("quantized_tensor")
    compared = [r for r in report.runs if r.status == "ok"]
    assert len(compared) >= 100 and sum(r.elements for r in compared) > 500_000


@pytest.mark.parametrize(
    "quantizer",
    [
        Float8CurrentScalingQuantizer(DType.kFloat8E5M2, force_pow_2_scales=True),
        MXFP8Quantizer(DType.kFloat8E4M3, with_2d_quantization=True),
        Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=1,
                             force_pow_2_scales=False),
        NVFP4Quantizer(with_rht=True, with_2d_quantization=False),
        NVFP4Quantizer(with_2d_quantization=True),
        NVFP4Quantizer(row_scaled_nvfp4=True),
    ],
    ids=["cs-e5m2-pow2", "mxfp8-2d", "block-1d-fp32-scales", "nvfp4-rht", "nvfp4-2d", "nvfp4-row-scaled"],
)
def test_quantizer_options_are_checked_as_given(quantizer):
    report = check_quantizer(lambda x, q: q(x), quantizer, cases=["normal", "ties", "zero_blocks", "inf", "ragged"])
    report.assert_ok()
    assert type(quantizer).__name__ in report.reference


def test_the_three_output_conventions_compare_the_same_quantization():
    quantizer = MXFP8Quantizer(DType.kFloat8E4M3)

    def as_tuple(x, q):
        t = q(x)
        usage = "rowwise" if q.rowwise_usage else "columnwise"
        return getattr(t, f"_{usage}_data").view(torch.float8_e4m3fn), getattr(t, f"_{usage}_scale_inv")

    def dequantized(x, q):
        return q(x).dequantize(usage="rowwise" if q.rowwise_usage else "columnwise")

    for candidate, output in ((lambda x, q: q(x), "quantized_tensor"), (as_tuple, "data_and_scale_inv"),
                              (dequantized, "dequantized")):
        report = check_quantizer(candidate, quantizer, output=output, cases=["normal", "nan"])
        report.assert_ok()
        assert report.output == output
    # A wrong scale byte whose block is all zero dequantizes equal: only the byte tiers can see it.
    def zero_block_scale_off(x, q):
        data, scale = as_tuple(x, q)
        scale = scale.clone()
        scale[(x.reshape(-1, x.shape[-1]).abs().amax(dim=1) == 0).nonzero()[:1, 0], 0] += 1
        return data, scale

    caught = check_quantizer(zero_block_scale_off, quantizer, cases=["zero_blocks"], dtypes=[torch.float32])
    assert not caught.ok and caught.failures[0].scale_mismatches == 1 and caught.failures[0].code_mismatches == 0


def test_inputs_the_reference_rejects_are_recorded_not_compared():
    report = check_quantizer(lambda x, q: q(x), make_recipe("mxfp8"), cases=["normal", "ragged"],
                             dtypes=[torch.bfloat16])
    assert report.ok
    run = report["ragged", "bfloat16", "rowwise"]
    assert run.status == "both reject" and "reference: ValueError" in run.detail
    assert any("the reference rejects some inputs of ragged" in note for note in report.not_compared)
    assert "runs not compared: 2 both reject" in str(report) and "rejected by the reference: ragged" in str(report)

    def accepts_anything(x, q):
        return x.to(torch.float8_e4m3fn), torch.ones(1)

    lenient = check_quantizer(accepts_anything, make_recipe("mxfp8"), cases=["ragged"], dtypes=[torch.bfloat16])
    assert lenient["ragged", "bfloat16", "rowwise"].status == "reference rejects"


def test_a_candidate_that_raises_where_the_reference_does_not_fails():
    def fails_on_nan(x, q):
        if torch.isnan(x).any():
            raise RuntimeError("NaN input")
        return q(x)

    report = check_quantizer(fails_on_nan, make_recipe("fp8_current_scaling"), cases=["normal", "nan"])
    assert not report.ok
    assert report["nan", "float16", "columnwise"].status == "candidate raised"
    assert "RuntimeError: NaN input" in report["nan", "float16", "columnwise"].detail


def test_delayed_scaling_gives_the_candidate_its_scale_and_a_one_argument_candidate_is_refused():
    def delayed(x, quantizer):
        s = quantizer.scale
        data = (x.float() * s).clamp(-448, 448).to(torch.float8_e4m3fn)
        return data if quantizer.rowwise_usage else data.t().contiguous(), torch.reciprocal(s)

    report = check_quantizer(delayed, make_recipe("fp8_delayed_scaling"), cases=["normal", "at_and_past_max"])
    report.assert_ok()
    with pytest.raises(TypeError, match="quantizer.scale"):
        check_quantizer(lambda x: x, make_recipe("fp8_delayed_scaling"))


def test_a_one_argument_candidate_is_checked_rowwise_and_the_report_says_so():
    report = check_quantizer(lambda x: Float8CurrentScalingQuantizer(DType.kFloat8E4M3)(x).dequantize(),
                             te.recipe.Float8CurrentScaling(), cases=["normal"])
    report.assert_ok()
    assert report["normal", "float32", "columnwise"].status == "skipped"
    assert any("column-wise not checked" in note for note in report.not_compared)


def test_bad_arguments_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="stochastic rounding"):
        check_quantizer(lambda x, q: q(x), te.recipe.NVFP4BlockScaling(), role="grad_output")
    with pytest.raises(ValueError, match="output must be one of"):
        check_quantizer(lambda x: x, te.recipe.Float8CurrentScaling(), output="bytes")
    with pytest.raises(ValueError, match="unknown cases"):
        check_quantizer(lambda x: x, te.recipe.Float8CurrentScaling(), cases=["nope"])
    with pytest.raises(TypeError, match="Quantizer or Recipe"):
        check_quantizer(lambda x: x, "fp8")


def test_the_matrix_is_deterministic():
    first = check_quantizer(fp8_cs_dividing, te.recipe.Float8CurrentScaling(), cases=["ties", "heavy_tails"])
    torch.manual_seed(99)
    second = check_quantizer(fp8_cs_dividing, te.recipe.Float8CurrentScaling(), cases=["ties", "heavy_tails"])
    assert first.runs == second.runs and first.mismatches == second.mismatches


def _nvfp4_rowwise(x, divide: bool):
    """A plain-torch NVFP4 row-wise quantizer (1x16 blocks, ``docs/recipes/nvfp4.md#the-arithmetic``);
    ``divide`` is the bug."""
    from refops.formats import e2m1_round_nearest_even, pack_e2m1

    m, k = x.reshape(-1, x.shape[-1]).shape
    blocks = x.reshape(m, k // 16, 16).float()
    amax = torch.where(torch.isnan(blocks), 0.0, blocks.abs()).amax().reshape(1)
    s_enc = torch.where((amax == 0) | torch.isinf(amax), 1.0, torch.tensor([2688.0]) / amax).clamp(max=FLT_MAX)
    block_amax = torch.where(torch.isnan(blocks), 0.0, blocks.abs()).amax(-1)
    s_b = (block_amax * (s_enc * torch.tensor(1 / 6))).clamp(max=448).to(torch.float8_e4m3fn)
    denominator = (s_b.float() * (torch.tensor([1.0]) / s_enc)).unsqueeze(-1)
    if divide:
        scaled = blocks / denominator  # the bug: TE multiplies by RN(1 / RN(s_b * S_dec))
    else:
        scaled = blocks * (torch.tensor(1.0) / denominator).clamp(max=FLT_MAX)
    return pack_e2m1(e2m1_round_nearest_even(scaled.reshape(m, k))), s_b.view(torch.uint8), amax


def test_an_nvfp4_candidate_that_divides_by_the_block_scale_is_caught_and_the_right_one_passes():
    quantizer = NVFP4Quantizer()
    right = check_quantizer(lambda x, q: _nvfp4_rowwise(x, divide=False), quantizer, usages=["rowwise"])
    right.assert_ok()
    wrong = check_quantizer(lambda x, q: _nvfp4_rowwise(x, divide=True), quantizer, usages=["rowwise"])
    assert wrong["ties", "float32", "rowwise"].code_mismatches > 100  # the E2M1 ties, through the block scale
    assert wrong["zero_blocks", "float32", "rowwise"].status == "differs"  # s_b = 0: 0 / 0 is NaN, not 0
    assert wrong["normal", "float32", "rowwise"].status == "ok"


def _mxfp8_rowwise(x, ties_away: bool):
    """A plain-torch MXFP8 row-wise quantizer (``docs/recipes/mxfp8.md#the-arithmetic``); ``ties_away`` rounds
    half away from zero."""
    from refops.formats import e8m0_encode_multiplier, e8m0_from_fp32

    m, k = x.reshape(-1, x.shape[-1]).shape
    blocks = x.reshape(m, k // 32, 32).float()
    e = e8m0_from_fp32(torch.where(torch.isnan(blocks), 0.0, blocks.abs()).amax(-1) * torch.tensor(1 / 448))
    scaled = (blocks * e8m0_encode_multiplier(e).unsqueeze(-1)).clamp(-448, 448)
    if ties_away:  # one ulp outward before the round-to-nearest-even cast: every tie goes up in magnitude
        scaled = torch.where(scaled == 0, scaled, torch.nextafter(scaled, 2 * scaled))
    return scaled.to(torch.float8_e4m3fn).reshape(m, k), e


def test_the_ties_case_holds_exact_ties_round_half_away_from_zero_is_caught_where_random_fp32_is_not():
    quantizer = MXFP8Quantizer(DType.kFloat8E4M3)
    check_quantizer(lambda x, q: _mxfp8_rowwise(x, ties_away=False), quantizer, usages=["rowwise"]).assert_ok()
    report = check_quantizer(lambda x, q: _mxfp8_rowwise(x, ties_away=True), quantizer, usages=["rowwise"],
                             dtypes=[torch.float32])
    assert {r.case for r in report.failures} == {"ties"}  # fp32 random values never land on a tie
    assert report["ties", "float32", "rowwise"].code_mismatches > 1000


# ------------------------------------------------------------------ the delayed-scaling amax
def _delayed_cast(x, quantizer):
    """A correct delayed-scaling cast: the given scale, clamp, cast; the orientation asked for."""
    data = (x.float() * quantizer.scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    return data if quantizer.rowwise_usage else data.t().contiguous(), torch.reciprocal(quantizer.scale)


def _max_skipping_nan(x, take_abs=True):
    v = x.float().abs() if take_abs else x.float()
    return torch.where(torch.isnan(v), torch.full_like(v, -torch.inf), v).amax().clamp_min(0).reshape(1)


DELAYED_CASES = ["normal", "constant", "nan", "at_and_past_max"]


def test_an_amax_recorded_without_abs_is_caught():
    def records_signed_max(x, quantizer):
        quantizer.amax.copy_(torch.fmax(quantizer.amax, _max_skipping_nan(x, take_abs=False)))  # the bug: no abs
        return _delayed_cast(x, quantizer)

    report = check_quantizer(records_signed_max, make_recipe("fp8_delayed_scaling"), cases=DELAYED_CASES)
    assert not report.ok  # before: ok, every code and scale_inv equal, the amax never looked at
    assert {r.case for r in report.failures} == {"constant"}  # the only case whose largest magnitude is negative
    # Every value -3: the signed max, accumulated into 0, leaves the buffer at 0: caught all the same.
    constant = report["constant", "bfloat16", "columnwise"]
    assert constant.status == "differs" and constant.code_mismatches == 0 and constant.scale_mismatches == 0
    assert "amax not recorded in quantizer.amax (still 0), expected 3.0" in constant.detail
    assert any(c.startswith("amax, bit for bit: recorded in quantizer.amax") for c in report.compared)

    def overwrites_with_signed_max(x, quantizer):
        quantizer.amax = torch.full((1,), float(x.float().nan_to_num(nan=0.0).max()))  # no abs, rebound
        return _delayed_cast(x, quantizer)

    rebound = check_quantizer(overwrites_with_signed_max, make_recipe("fp8_delayed_scaling"), cases=["constant"])
    assert all("amax recorded in quantizer.amax -3.0 != expected 3.0" in r.detail for r in rebound.runs)


def test_an_amax_returned_without_abs_is_caught_and_a_right_one_passes():
    def returns(take_abs):
        def candidate(x, quantizer):
            return (*_delayed_cast(x, quantizer), _max_skipping_nan(x, take_abs))
        return candidate

    wrong = check_quantizer(returns(False), make_recipe("fp8_delayed_scaling"), cases=DELAYED_CASES)
    assert not wrong.ok
    assert "amax returned 0.0 != expected 3.0" in wrong["constant", "float16", "rowwise"].detail
    right = check_quantizer(returns(True), make_recipe("fp8_delayed_scaling"), cases=DELAYED_CASES)
    right.assert_ok()
    assert any(c.startswith("amax, bit for bit: returned") for c in right.compared)
    assert not any("amax" in n for n in right.not_compared)


def test_the_reference_records_the_amax_and_passes():
    report = check_quantizer(lambda x, q: q(x), make_recipe("fp8_delayed_scaling"), cases=DELAYED_CASES)
    report.assert_ok()
    runs = len(report.compared_runs)
    assert runs == 4 * 3 * 2 + 2 * 3 * 2  # every case, dtype and usage; "normal" in two more layouts
    assert f"amax, bit for bit: recorded in quantizer.amax ({runs} runs; held to it in every run)" in report.compared


def test_an_amax_the_candidate_never_gives_is_reported_as_not_compared():
    report = check_quantizer(_delayed_cast, make_recipe("fp8_delayed_scaling"), cases=DELAYED_CASES)
    report.assert_ok()
    assert any(n.startswith("amax not compared: the candidate never provided it (delayed scaling's next scale "
                            "comes from it); to check it, return (data, scale_inv, amax)") for n in report.not_compared)
    lines = str(report).splitlines()
    assert any(line.startswith("  - amax not compared:") for line in lines[lines.index("not compared:"):])


# ------------------------------------------------------------------ saturation
def _cs_without_clamp(fp8_dtype):
    fmax = torch.finfo(fp8_dtype).max

    def candidate(x, quantizer):
        amax = _amax(x)
        scale = torch.tensor([fmax]) / amax
        scale = torch.where((amax == 0) | torch.isinf(amax), torch.ones_like(scale), scale)
        scale = torch.where(torch.isinf(scale), torch.full_like(scale, FLT_MAX), scale)
        data = (x.float() * scale).to(fp8_dtype)  # the bug: no clamp to +-max before the cast
        if quantizer.columnwise_usage:
            data = data.reshape(-1, x.shape[-1]).t().contiguous()
        return data, torch.reciprocal(scale)

    return candidate


def test_a_missing_clamp_is_reported_where_torchs_cast_saturates_and_caught_where_it_does_not():
    from refops.testing.quantizers.saturation import native_saturation

    report = check_quantizer(_cs_without_clamp(torch.float8_e4m3fn), te.recipe.Float8CurrentScaling(),
                             cases=["normal", "inf"])
    if native_saturation(torch.float8_e4m3fn, torch.device("cpu"))["inf"]:  # torch >= 2.13: the bytes are equal
        report.assert_ok()
        [note] = [n for n in report.not_compared if n.startswith("saturation:")]
        assert note.startswith(f"saturation: not distinguishable on this torch ({torch.__version__}): the cast to "
                               "float8_e4m3fn saturates")
        assert "6 compared runs (inf)" in note
    else:  # torch <= 2.11: the cast gives NaN
        assert report["inf", "float32", "rowwise"].status == "differs"


def test_a_missing_clamp_before_an_e5m2_cast_is_caught_on_every_torch():
    quantizer = Float8CurrentScalingQuantizer(DType.kFloat8E5M2)
    report = check_quantizer(_cs_without_clamp(torch.float8_e5m2), quantizer, cases=["normal", "inf"])
    assert [r.case for r in report.failures] == ["inf"] * 6  # inf * 1 -> inf, not 57344
    assert any(c.startswith("saturation: the clamp to ±57344 before the cast to float8_e5m2 is visible on this torch")
               for c in report.compared)
    assert report["normal", "float32", "rowwise"].past_max == 0 and report["inf", "float32", "rowwise"].past_max == 2


def test_delayed_scaling_counts_the_values_its_stale_scale_pushes_past_the_max():
    report = check_quantizer(lambda x, q: q(x), make_recipe("fp8_delayed_scaling"), cases=["at_and_past_max"],
                             dtypes=[torch.float32])
    run = report["at_and_past_max", "float32", "rowwise"]
    assert run.past_max == run.elements  # the scale is for amax / 4, every value is at least amax / 2
    normal = check_quantizer(lambda x, q: q(x), make_recipe("fp8_delayed_scaling"), cases=["normal"])
    assert {r.past_max for r in normal.runs} == {0}


# ------------------------------------------------------------------ the report's shape
def test_a_failing_report_leads_with_what_failed_and_summarizes_what_passed():
    report = check_quantizer(fp8_cs_dividing, te.recipe.Float8CurrentScaling())
    lines = str(report).splitlines()
    compared = len(report.compared_runs)
    assert compared == len(report.runs) // 2  # a one-argument candidate: row-wise only
    assert lines[0].endswith(f"(role input): FAILED: {len(report.failures)} of {compared} compared runs differ")
    assert lines[2] == f"failed runs ({len(report.failures)}):"
    header = lines[3]
    assert header.split()[-4:] == ["values", "differ", "scale_inv", "differ"]  # the column says what it holds
    # The ties fail in every layout alike: one row, and a line for the repeats.
    alike = [r for r in report.failures if r.layout != "contiguous"]
    assert [r.name for r in alike] == ["ties float32 rowwise [non-contiguous]", "ties float32 rowwise [storage offset]"]
    rows = lines[4 : 4 + len(report.failures) - len(alike)]
    assert all(" differs " in row and " contiguous " in row for row in rows)
    assert lines[4 + len(rows)].startswith("  and 2 runs in another input layout that fail as their contiguous run")
    assert not any(" ok " in line for line in lines)  # passing runs are counted, not listed
    passed = next(i for i, line in enumerate(lines) if line.startswith("passed (role input): "))
    assert passed > lines.index("first mismatches (the first of every failing run first):")
    assert lines[passed].endswith("by usage: rowwise " + f"{compared - len(report.failures)}/{compared}")
    assert lines[passed + 1].startswith("  by layout: contiguous ")
    assert "ties 6/9" in lines[passed + 2] and "normal 9/9" in lines[passed + 2]
    assert len(lines) < 75  # before: 90 lines, 58 of them rows
    table = report.table().splitlines()
    assert len(table) == 1 + len(report.runs)  # every run, on request


def test_mismatches_name_the_scale_they_show_scale_inv():
    def dividing(x, quantizer):
        scale_inv = _amax(x) / 448.0
        data = (x.float() / scale_inv).clamp(-448, 448).to(torch.float8_e4m3fn)
        return data if quantizer.rowwise_usage else data.t().contiguous(), scale_inv

    report = check_quantizer(dividing, te.recipe.Float8CurrentScaling(), cases=["ties"], dtypes=[torch.float32])
    first = report.mismatches[0]
    assert " scale_inv " in str(first) and " scale " not in str(first)
    assert first.expected_scale_inv == first.expected_scale  # the former name still answers
    assert float(first.expected_scale_inv) == pytest.approx(TIE_AMAX_SCALE_INV)


TIE_AMAX_SCALE_INV = 8.076315879821777 / 448  # the ties case's amax over E4M3's max: scale_inv, not scale


def test_a_passing_report_is_short_and_says_what_it_compared():
    report = check_quantizer(fp8_cs_multiplying, te.recipe.Float8CurrentScaling())
    lines = str(report).splitlines()
    runs, half = len(report.runs), len(report.runs) // 2
    assert lines[0].endswith(f"ok: {runs} of {runs} compared runs pass")
    assert f"passed (role input): {runs} of {runs} compared runs; by usage: rowwise {half}/{half}, columnwise {half}/{half}" in lines
    assert "compared:" in lines and "not compared:" in lines
    assert len(lines) < 16
