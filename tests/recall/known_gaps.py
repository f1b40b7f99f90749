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
    "mxfp8_backward_requires_contiguous_grad":
        "every output grad compare_modules' script hands the backward is contiguous (its default grads, or "
        "grad_output as given); 'input layouts' varies the inputs only, so a backward that needs a contiguous "
        "output grad never meets a non-contiguous one (an output-grad layouts step, dy transposed back and "
        "behind a storage offset, would raise it)",
    "gelu_backward_reads_strided_grad_as_contiguous":
        "every output grad compare_modules' script hands the backward is contiguous, so a backward that reads "
        "the output grad's memory as row-major computes right every time; only a non-contiguous output grad "
        "(the output transposed downstream) shows it, and no scenario passes one",
    "load_state_dict_assign_unfreezes_parameter":
        "load_state_dict_assign_into_meta loads into a meta-built module whose parameters are all trainable, "
        "and requires_grad_kept freezes a parameter only before reset_parameters, to_empty and the first "
        "forward: no property freezes one before load_state_dict(assign=True), so a flag taken from the "
        "checkpoint (True) instead of the module goes unseen",
}

#: case name -> why the oracle fails the correct twin (a false alarm)
FAILED_TWINS: dict[str, str] = {
}
