"""check_quantizer misused: every bad argument is one clear error before anything runs, and a check that
compared nothing fails instead of passing after zero runs."""

from __future__ import annotations

import pytest
import torch

import refops as te
from refops.quantization import DType, Float8CurrentScalingQuantizer
from refops.testing import check_quantizer, make_recipe

CS = te.recipe.Float8CurrentScaling()


def reference(x, quantizer):
    return quantizer(x)


class Counting:
    """A candidate that counts its calls: an argument error must come before the first one."""

    def __init__(self):
        self.calls = 0

    def __call__(self, x, quantizer):
        self.calls += 1
        return quantizer(x)


@pytest.mark.parametrize("argument", ["usages", "cases", "dtypes"])
def test_an_empty_selection_is_a_value_error_not_an_ok_report(argument):
    candidate = Counting()
    with pytest.raises(ValueError, match=rf"^check_quantizer: {argument} is empty, so nothing would be checked"):
        check_quantizer(candidate, CS, **{argument: []})
    assert candidate.calls == 0


def test_a_selection_whose_cases_run_in_none_of_the_dtypes_is_a_value_error():
    with pytest.raises(ValueError, match=r"selection runs nothing: full_tiles runs in bfloat16 only, and dtypes is \[float32\]"):
        check_quantizer(reference, CS, cases=["full_tiles"], dtypes=[torch.float32])


def test_a_dtype_the_quantizers_do_not_take_is_named_with_what_is_expected():
    # Before: KeyError: torch.float64, raised from inside the matrix.
    with pytest.raises(ValueError, match=r"check_quantizer: dtypes float64 are not input dtypes .*expected some of "
                                         r"float32, float16, bfloat16"):
        check_quantizer(reference, CS, dtypes=[torch.float32, torch.float64])


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(dtypes=torch.float32), r"dtypes must be a list of torch dtypes, got dtype torch.float32 \(write "
                                     r"dtypes=\[torch.float32\]\)"),
        (dict(usages="rowwise"), r"usages must be a list of orientations, got str 'rowwise' \(write "
                                 r"usages=\['rowwise'\]\)"),
        (dict(cases="ties"), r"cases must be a list of case names, got str 'ties' \(write cases=\['ties'\]\)"),
        (dict(dtypes=["float32"]), r"dtypes must hold torch dtypes, got str 'float32'"),
    ],
    ids=["one-dtype", "usages-string", "cases-string", "dtype-name"],
)
def test_a_single_value_where_a_list_is_expected_is_a_type_error(kwargs, expected):
    with pytest.raises(TypeError, match="^check_quantizer: " + expected):
        check_quantizer(reference, CS, **kwargs)


@pytest.mark.parametrize("candidate", [None, torch.zeros(3), "my_kernel"], ids=["None", "tensor", "str"])
def test_a_candidate_that_cannot_be_called_is_one_type_error(candidate):
    # Before: 120 rows of "candidate raised: TypeError: ... object is not callable" and a FAILED report.
    with pytest.raises(TypeError, match=r"^check_quantizer: candidate must be callable, candidate\(x\) or "
                                        r"candidate\(x, quantizer\), got "):
        check_quantizer(candidate, CS)


def test_role_with_a_quantizer_is_refused_rather_than_ignored():
    with pytest.raises(ValueError, match="role='weight' chooses a recipe's quantizer; a quantizer "
                                         r"\(Float8CurrentScalingQuantizer\) is checked as given"):
        check_quantizer(reference, Float8CurrentScalingQuantizer(DType.kFloat8E4M3), role="weight")


def test_a_check_that_compared_nothing_fails():
    # A one-argument candidate cannot be asked for column-wise: every run is skipped.
    report = check_quantizer(lambda x: Float8CurrentScalingQuantizer(DType.kFloat8E4M3)(x).dequantize(), CS,
                             usages=["columnwise"], cases=["normal"])
    assert {r.status for r in report.runs} == {"skipped"}
    assert report.nothing_compared and not report.ok
    runs = 3 * (1 + 2)  # three dtypes, on the contiguous input and in the two strided layouts
    assert str(report).splitlines()[0].endswith(f"FAILED: nothing was compared ({runs} runs: {runs} skipped)")
    with pytest.raises(AssertionError, match="nothing was compared"):
        report.assert_ok()


def test_a_check_whose_every_input_the_reference_rejects_fails():
    # MXFP8 needs dims that 32 divides: the reference rejects every run of "ragged".
    report = check_quantizer(reference, make_recipe("mxfp8"), cases=["ragged"], dtypes=[torch.bfloat16])
    assert {r.status for r in report.runs} == {"both reject"}
    assert not report.ok
    assert "FAILED: nothing was compared (2 runs: 2 both reject)" in str(report)
