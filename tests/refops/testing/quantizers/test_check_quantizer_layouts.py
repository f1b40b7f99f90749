"""check_quantizer on inputs in other layouts: the same values non-contiguous, behind a storage offset and expanded
(stride 0) must give the reference's bytes for the contiguous tensor; a candidate cannot change what later runs see."""

from __future__ import annotations

import math

import pytest
import torch

import refops as te
from refops.testing import RECIPE_NAMES, check_quantizer, make_recipe
from refops.testing.quantizers.cases import CASES
from refops.testing.quantizers.input_layouts import LAYOUTS, STORAGE_OFFSET_BYTES, UNALIGNED_OFFSET, present

CS = te.recipe.Float8CurrentScaling()
LAYOUT_CASES = [c.name for c in CASES if c.layouts]


def _row_major_strides(shape):
    return tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))


def writes_codes_in_storage_order(x, quantizer):
    """The strides bug: an output made with torch.empty_like(x) (the input's strides) filled as if contiguous."""
    codes = quantizer(x)._data
    out = torch.empty_like(x, dtype=torch.uint8)
    torch.as_strided(out, (out.numel(),), (1,)).copy_(codes.reshape(-1))  # writes storage order, not index order
    return out, quantizer(x)._scale_inv


def reads_storage_from_its_start(x, quantizer):
    """The storage-offset bug: the input read from its storage's first element (a data pointer without the offset)."""
    from_start = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage(), 0, x.shape, x.stride())
    return quantizer(from_start)


def walks_rows_by_the_last_stride(x, quantizer):
    """The expanded-input bug: a unit last stride taken to mean row-major (a stride-0 row dim is not)."""
    if x.stride(-1) == 1:
        x = torch.as_strided(x, x.shape, _row_major_strides(x.shape), x.storage_offset())
    return quantizer(x.contiguous())


def _failing(report):
    return {(r.case, r.layout) for r in report.failures}


def test_an_output_written_with_the_inputs_strides_is_caught_in_the_non_contiguous_layout():
    report = check_quantizer(writes_codes_in_storage_order, CS, usages=["rowwise"])
    assert not report.ok
    assert {layout for _, layout in _failing(report)} == {"non-contiguous"}
    assert {case for case, _ in _failing(report)} == set(LAYOUT_CASES)
    run = report["ties", "float32", "rowwise", "non-contiguous"]
    assert run.status == "differs" and run.code_mismatches > run.elements // 2
    assert report["ties", "float32", "rowwise"].status == "ok"  # the contiguous run alone would pass
    text = str(report)
    assert "ties            float32   rowwise    [non-contiguous]  64x128        differs" in text
    assert "ties/float32/rowwise [non-contiguous] at [" in text
    assert "(2 only in another input layout)" not in text and f"({len(report.failures)} only in another" in text


def test_an_input_read_without_its_storage_offset_is_caught_in_the_storage_offset_layout():
    report = check_quantizer(reads_storage_from_its_start, make_recipe("mxfp8"), cases=["normal", "ties"])
    assert {layout for _, layout in _failing(report)} == {"storage offset"}
    run = report["normal", "bfloat16", "columnwise", "storage offset"]
    assert run.status == "differs" and run.code_mismatches > 0
    assert report["normal", "bfloat16", "columnwise"].status == "ok"
    assert (f"storage offset (a slice behind {STORAGE_OFFSET_BYTES} bytes of NaN, aligned) on normal, ties"
            in "\n".join(report.compared))


def test_an_expanded_input_that_breaks_the_kernel_is_caught_with_the_error():
    report = check_quantizer(walks_rows_by_the_last_stride, make_recipe("nvfp4"), role="weight",
                             cases=["normal", "broadcast_row"])
    assert _failing(report) == {("broadcast_row", "expanded")}
    run = report["broadcast_row", "bfloat16", "rowwise", "expanded"]
    assert run.status == "candidate raised" and "out of bounds" in run.detail
    assert report["broadcast_row", "bfloat16", "rowwise"].status == "ok"
    assert "broadcast_row   bfloat16  rowwise    [expanded]        64x128        candidate raised" in str(report)


@pytest.mark.parametrize("recipe_name", RECIPE_NAMES)
@pytest.mark.parametrize("role", ["input", "weight", "grad_output"])
def test_refops_quantizers_give_the_same_bytes_in_every_layout(recipe_name, role):
    recipe = make_recipe(recipe_name)
    if recipe_name.startswith("nvfp4") and role == "grad_output":
        pytest.skip("NVFP4's grad_output rounds stochastically: check_quantizer refuses it")
    report = check_quantizer(lambda x, quantizer: quantizer(x), recipe, role=role, cases=LAYOUT_CASES)
    report.assert_ok()
    layouts = {r.layout for r in report.compared_runs}
    assert layouts == {"contiguous", *LAYOUTS}  # every layout ran, and was compared
    assert not any(n.startswith("storage order:") for n in report.not_compared)  # row-major data throughout


def test_a_candidate_that_writes_into_its_input_fails_and_later_runs_see_the_right_values():
    def zeroes_its_input(x, quantizer):
        result = quantizer(x)
        x.zero_()  # the bug: the caller's activation is gone
        return result

    report = check_quantizer(zeroes_its_input, CS, cases=["normal", "ties"], layouts=["non-contiguous"])
    assert {r.status for r in report.runs} == {"differs"}
    for run in report.runs:
        assert run.code_mismatches == 0 and run.scale_mismatches == 0  # every later run got its own fresh values
        assert f"the candidate wrote into its input: {run.elements} elements changed" in run.detail


def test_layout_runs_are_indexed_by_layout_and_named_in_the_report():
    report = check_quantizer(lambda x, q: q(x), CS, cases=["broadcast_row", "ragged"], dtypes=[torch.float16])
    assert report.layouts == ["contiguous", *LAYOUTS]
    assert report["broadcast_row", "float16", "rowwise"].layout == "contiguous"  # three keys: the contiguous run
    expanded = report["broadcast_row", "float16", "columnwise", "expanded"]
    assert expanded.name == "broadcast_row float16 columnwise [expanded]" and expanded.status == "ok"
    with pytest.raises(KeyError, match=r"that run has the layouts \['contiguous'\]"):
        report["ragged", "float16", "rowwise", "expanded"]
    assert any(n == "other layouts: the other case (ragged) ran on contiguous inputs only (a representative few run "
                    "in every layout, to keep the check fast)" for n in report.not_compared)
    assert "  by layout: contiguous 4/4, non-contiguous 2/2, storage offset 2/2, expanded 2/2" in str(report)


def test_the_layouts_argument_selects_and_is_checked():
    only = check_quantizer(lambda x, q: q(x), CS, cases=["normal"], layouts=["storage offset"])
    assert {r.layout for r in only.runs} == {"contiguous", "storage offset"}
    none = check_quantizer(lambda x, q: q(x), CS, cases=["normal"], layouts=[])
    assert {r.layout for r in none.runs} == {"contiguous"}
    assert "other layouts: every input was contiguous (layouts=[])" in none.not_compared
    with pytest.raises(TypeError, match=r"^check_quantizer: layouts must be a list of layout names, got str "
                                        r"'expanded' \(write layouts=\['expanded'\]\)"):
        check_quantizer(lambda x, q: q(x), CS, layouts="expanded")
    with pytest.raises(ValueError, match=r"^check_quantizer: unknown layouts \['contiguous'\]; .*contiguous runs "
                                         r"always; leave it out"):
        check_quantizer(lambda x, q: q(x), CS, layouts=["contiguous"])


def test_the_presented_inputs_hold_the_values_in_their_layout():
    x = torch.randn(6, 5, 4)
    strided = present(x, "non-contiguous")
    assert not strided.is_contiguous() and torch.equal(strided, x)
    offset = present(x, "storage offset")
    assert offset.storage_offset() * 4 == STORAGE_OFFSET_BYTES and offset.is_contiguous() and torch.equal(offset, x)
    assert present(x.half(), "storage offset").storage_offset() * 2 == STORAGE_OFFSET_BYTES
    unaligned = present(x, "unaligned storage offset")
    assert unaligned.storage_offset() == UNALIGNED_OFFSET and torch.equal(unaligned, x)
    assert (UNALIGNED_OFFSET * 4) % 16 and (UNALIGNED_OFFSET * 2) % 16  # not 16-byte aligned in any input dtype
    row = x[:1, :1].expand(6, 5, 4).contiguous()
    expanded = present(row, "expanded")
    assert expanded.stride()[:2] == (0, 0) and torch.equal(expanded, row)
    with pytest.raises(ValueError, match="an expanded layout needs equal rows"):
        present(x, "expanded")


def test_the_unaligned_storage_offset_runs_only_when_asked_and_catches_a_kernel_that_rounds_the_pointer_down():
    def rounds_the_pointer_down(x, quantizer):
        # The bug: a vectorized kernel that aligns its first load to 16 bytes reads from before the slice.
        if x.storage_offset() % (16 // x.element_size()):
            start = x.storage_offset() - x.storage_offset() % (16 // x.element_size())
            x = torch.as_strided(x, x.shape, x.stride(), start)
        return quantizer(x)

    default = check_quantizer(rounds_the_pointer_down, CS, cases=["normal"])
    default.assert_ok()  # the aligned offset is read right
    assert "unaligned storage offset" not in {r.layout for r in default.runs}
    asked = check_quantizer(rounds_the_pointer_down, CS, cases=["normal"], layouts=["unaligned storage offset"])
    assert {layout for _, layout in _failing(asked)} == {"unaligned storage offset"}
    assert "not 16-byte aligned" in "\n".join(asked.compared)
