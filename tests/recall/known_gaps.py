"""Where the current oracle misses a bug or fails a correct twin, and which capability is missing.

The ONE place that says so: ``test_recall.py`` marks these parameters ``xfail(strict=True)`` and the
docs table prints the reasons. When the oracle gains the capability, the strict xfail fails: delete
the entry here and regenerate the table (``python3 -m tests.recall --write-docs``).
"""

#: case name -> why the oracle does not catch the bug
MISSED_BUGS: dict[str, str] = {
    "norm_fused_amax_before_output_rounding":
        "an opaque candidate exposes no quantized operands, and a scale one ulp off is far inside the "
        "numerics tier's spread; only refops_quantized_operands() (or check_quantizer on the fused kernel) "
        "would show the bytes",
}

#: case name -> why the oracle fails the correct twin (a false alarm)
FAILED_TWINS: dict[str, str] = {
}
