"""Where the current oracle misses a bug or fails a correct twin, and which capability is missing.

The ONE place that says so: ``test_recall.py`` marks these parameters ``xfail(strict=True)`` and the
docs table prints the reasons. When the oracle gains the capability, the strict xfail fails; delete
the entry here and the docs table updates itself (``test_docs_table_is_current`` says how).
"""

#: case name -> why the oracle does not catch the bug
MISSED_BUGS: dict[str, str] = {
    "fp8_output_written_with_input_strides":
        "check_quantizer's matrix holds only contiguous inputs; it needs transposed and sliced views",
    "fp8_input_storage_offset_ignored":
        "check_quantizer's matrix holds only inputs that start at their storage's first element; "
        "it needs views with a storage offset",
    "e8m0_scale_from_float_log2":
        "no case puts a block amax a few ulps above 448 * 2^k, where float log2 rounds onto the integer "
        "and the E8M0 round-up is lost (the ties case targets E4M3 code midpoints)",
}

#: case name -> why the oracle fails the correct twin (a false alarm)
FAILED_TWINS: dict[str, str] = {}
