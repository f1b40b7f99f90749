"""refops.testing.format_diagnosis: a differing quantized tensor named for what it is, on plain tensors and in
check_quantizer's reports."""

from __future__ import annotations

import pytest
import torch

import refops as te
from refops.formats import E4M3, E5M2, e8m0_from_fp32
from refops.quantization import DType, MXFP8Quantizer
from refops.testing import check_quantizer
from refops.testing.format_diagnosis import diagnose_mismatch

VALUES = torch.randn(64, 128, generator=torch.Generator().manual_seed(3))


def _per_tensor(fmt, max_of=None):
    """Current scaling of VALUES to ``fmt``, with the scale of ``max_of``'s max (default: fmt's own)."""
    scale = torch.tensor([(max_of or fmt).max]) / VALUES.abs().amax()
    return fmt.quantize(VALUES * scale), torch.reciprocal(scale)


@pytest.mark.parametrize("with_values", [True, False], ids=["values", "no-values"])
def test_e4m3_codes_where_e5m2_is_asked_are_named_with_their_scale(with_values):
    expected, expected_scale_inv = _per_tensor(E5M2)
    got, got_scale_inv = _per_tensor(E4M3)
    said = diagnose_mismatch(expected.view(torch.uint8), got, expected_scale_inv, got_scale_inv,
                             expected_format="E5M2", values=VALUES if with_values else None)
    assert said.startswith("the candidate's codes are the E4M3 quantization of the same values (its data is "
                           "torch.float8_e4m3fn), where E5M2 was expected")
    assert "scale_inv is 2^7 x the reference's everywhere: the scale for E4M3's max (448) where E5M2" in said


def test_e5m2_codes_where_e4m3_is_asked_are_named_the_other_way():
    expected, expected_scale_inv = _per_tensor(E4M3)
    got, got_scale_inv = _per_tensor(E5M2)
    said = diagnose_mismatch(expected, got.view(torch.uint8), expected_scale_inv, got_scale_inv,
                             expected_format=DType.kFloat8E4M3, values=VALUES)
    assert said.startswith("the candidate's codes are the E5M2 quantization of the same values, where E4M3")
    assert "2^-7 x the reference's everywhere: the scale for E5M2's max (57344)" in said


def test_the_right_format_with_the_other_formats_scale_is_a_scale_finding_only():
    expected, expected_scale_inv = _per_tensor(E5M2)
    got, got_scale_inv = _per_tensor(E5M2, max_of=E4M3)  # E5M2 codes, scaled for 448
    said = diagnose_mismatch(expected, got, expected_scale_inv, got_scale_inv, expected_format="E5M2", values=VALUES)
    assert said == ("scale_inv is 2^7 x the reference's everywhere: the scale for E4M3's max (448) where E5M2 "
                    "(max 57344) was expected")


def test_codes_transposed_are_named():
    expected, scale_inv = _per_tensor(E4M3)
    said = diagnose_mismatch(expected, expected.t().contiguous(), scale_inv, scale_inv, expected_format=E4M3)
    assert said == ("the candidate's codes are the reference's transposed: shape (128, 64) where (64, 128) was "
                    "expected (the other orientation's layout)")


def _mxfp8_scales(round_down: bool) -> torch.Tensor:
    values = VALUES.clone()
    values[::2, ::32] = 7.0  # in every other row, every block's amax / 448 is 2^-6: both roundings agree there
    amax = values.reshape(64, 4, 32).abs().amax(-1) / 448.0
    up = e8m0_from_fp32(amax)
    if not round_down:
        return up
    return (amax.view(torch.int32) >> 23).to(torch.uint8)  # the exponent byte as it is: a floor


def test_an_e8m0_exponent_rounded_down_is_named_in_the_blocks_it_changes():
    expected, got = _mxfp8_scales(round_down=False), _mxfp8_scales(round_down=True)
    codes = torch.zeros(64, 128, dtype=torch.uint8)
    said = diagnose_mismatch(codes, codes, expected, got, expected_format="E4M3")
    lower = int((expected != got).sum())
    assert lower == expected.numel() // 2  # the rows without the planted power of two
    assert said == (f"scale_inv is 2^-1 x the reference's in {lower} of {expected.numel()} blocks and equal in the "
                    "rest: the E8M0 exponent rounded down where the reference rounds it up (TE takes the power of "
                    "two at or above amax / max)")


def test_an_fp32_scale_inv_one_ulp_off_is_named():
    expected, scale_inv = _per_tensor(E4M3)
    off = torch.nextafter(scale_inv, torch.ones(1))
    said = diagnose_mismatch(expected, expected, scale_inv, off, expected_format="E4M3")
    assert said.startswith("scale_inv is one fp32 ulp off the reference's in 1 of 1 entries")


def test_a_rounding_bug_inside_the_right_format_and_an_equal_result_are_not_given_a_name():
    expected, scale_inv = _per_tensor(E4M3)
    bits = expected.view(torch.uint8).clone()
    bits[::7, ::5] ^= 1  # one step off in some elements: the right format, a wrong rounding
    assert diagnose_mismatch(expected, bits, scale_inv, scale_inv, expected_format="E4M3", values=VALUES) is None
    assert diagnose_mismatch(expected, expected, scale_inv, scale_inv, expected_format="E4M3") is None


def test_bad_arguments_are_named():
    codes, scale_inv = _per_tensor(E4M3)
    with pytest.raises(ValueError, match=r"^diagnose_mismatch: expected_format must be 'E4M3', 'E5M2' or 'E2M1'"):
        diagnose_mismatch(codes, codes, scale_inv, scale_inv, expected_format="E3M4")
    with pytest.raises(TypeError, match=r"^diagnose_mismatch: got_data must be a tensor of codes \(uint8 or a "
                                        r"float8 dtype\), got Tensor torch.float32"):
        diagnose_mismatch(codes, VALUES, scale_inv, scale_inv, expected_format="E4M3")
    with pytest.raises(ValueError, match=r"^diagnose_mismatch: values has 10 elements, expected_data 8192"):
        diagnose_mismatch(codes, codes, scale_inv, scale_inv, expected_format="E4M3", values=torch.ones(10))
    with pytest.raises(ValueError, match=r"got_scale_inv of shape \(3, 200\) does not tile the data's \(64, 128\)"):
        diagnose_mismatch(codes, codes, scale_inv, torch.ones(3, 200), expected_format="E4M3")


# ------------------------------------------------------------------ in check_quantizer's reports
def _e4m3_cast(x, quantizer):
    """A delayed-scaling cast that ignores quantizer.dtype: always E4M3."""
    data = E4M3.quantize(x.float() * quantizer.scale)
    return data if quantizer.rowwise_usage else data.reshape(-1, x.shape[-1]).t().contiguous(), \
        torch.reciprocal(quantizer.scale)


def test_hybrid_grads_cast_to_e4m3_are_diagnosed_by_name():
    recipe = te.recipe.DelayedScaling(fp8_format=te.recipe.Format.HYBRID)
    check_quantizer(_e4m3_cast, recipe, role="input", cases=["normal", "ties"]).assert_ok()  # forward: E4M3 is right
    report = check_quantizer(_e4m3_cast, recipe, role="grad_output", cases=["normal", "ties"])
    assert not report.ok and "kFloat8E5M2" in report.reference
    said = "the candidate's codes are the E4M3 quantization of the same values, where E5M2 was expected"
    assert all(said in r.detail for r in report.failures)
    assert said in str(report)


def test_a_columnwise_result_in_the_rowwise_layout_is_diagnosed_as_transposed():
    def rowwise_layout_always(x, quantizer):
        quantizer.set_usage(rowwise=True, columnwise=False)  # the bug: the orientation asked for is ignored
        t = quantizer(x)
        return t._data, t._scale_inv  # the column-wise copy is the transpose of these bytes

    report = check_quantizer(rowwise_layout_always, te.recipe.Float8CurrentScaling(), cases=["normal"], layouts=[])
    assert [r.usage for r in report.failures] == ["columnwise"] * 3
    assert all(r.detail.startswith("the candidate's codes are the reference's transposed: shape (64, 128) where "
                                   "(128, 64) was expected") for r in report.failures)


def test_mxfp8_scales_rounded_down_are_diagnosed():
    def floor_scales(x, quantizer):
        t = quantizer(x)
        blocks = x.float().reshape(x.shape[0], -1, 32)
        amax = torch.where(torch.isnan(blocks), 0.0, blocks.abs()).amax(-1) * torch.tensor(1 / 448)
        return t._rowwise_data, (amax.view(torch.int32) >> 23).to(torch.uint8)  # the bug: no rounding up

    report = check_quantizer(floor_scales, MXFP8Quantizer(DType.kFloat8E4M3), usages=["rowwise"], cases=["normal"],
                             dtypes=[torch.float32], layouts=[])
    [run] = report.failures
    assert run.scale_mismatches > 0 and "the E8M0 exponent rounded down where the reference rounds it up" in run.detail


def test_a_run_that_fails_with_every_code_and_scale_equal_says_what_differs():
    def amax_without_abs(x, quantizer):
        data, scale_inv = _e4m3_cast(x, quantizer)
        return data, scale_inv, x.float().nan_to_num(nan=0.0).max().reshape(1)  # the bug: no abs

    report = check_quantizer(amax_without_abs, te.recipe.DelayedScaling(), cases=["constant"], layouts=[])
    rows = [line for line in str(report).splitlines() if line.startswith("constant ")]
    assert len(rows) == len(report.failures) == 6
    for row, run in zip(rows, report.failures):
        assert run.code_mismatches == 0 and run.scale_mismatches == 0
        assert " 0/8192 " in row and "every code and every scale_inv equal; amax returned -3.0 != expected 3.0" in row
