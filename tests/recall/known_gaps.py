"""Where the current oracle misses a bug or fails a correct twin, and which capability is missing.

The ONE place that says so: ``test_recall.py`` marks these parameters ``xfail(strict=True)`` and the
docs table prints the reasons. When the oracle gains the capability, the strict xfail fails: delete
the entry here and regenerate the table (``python3 -m tests.recall --write-docs``).
"""

#: case name -> why the oracle does not catch the bug
MISSED_BUGS: dict[str, str] = {
    "e8m0_scale_from_float_log2":
        "no case puts a block amax where RN(amax/448) lies an ulp above a power of two, where float "
        "log2 rounds onto the integer and the E8M0 round-up is lost (the ties case targets E4M3 code midpoints)",
    "fp8_backward_decodes_with_live_scale_inv":
        "compare_modules runs one fresh forward and backward; it needs interleaved microbatches "
        "(fwd1, fwd2, bwd1, bwd2) (#40 item 1)",
    "layer_norm_reads_strided_input_as_contiguous":
        "compare_modules runs the inputs it is given; it does not also run a non-contiguous copy of them",
    "norm_fused_amax_before_output_rounding":
        "an opaque candidate exposes no quantized operands, and a scale one ulp off is far inside the "
        "numerics tier's spread; only refops_quantized_operands() (or check_quantizer on the fused kernel) "
        "would show the bytes",
    "main_grad_accumulates_first_microbatch_only":
        "compare_modules runs one backward and compares .grad; it neither compares weight.main_grad "
        "(accumulate_into_main_grad) nor accumulates a second microbatch",
}

#: case name -> why the oracle fails the correct twin (a false alarm)
FAILED_TWINS: dict[str, str] = {
    "dropout_backward_scaled_by_p":
        "compare_modules runs the candidate, the reference and its twins each with their own RNG draws, "
        "so every dropout mask differs and a correct dropout fails the element-wise bound (needs an RNG "
        "replay per run); the bug's failure is this same false alarm, not a detection",
}
