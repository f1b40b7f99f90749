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
    "norm_reset_parameters_leaves_meta":
        "a composite is reset child by child and each child's claim to materialize through reset_parameters() "
        "is inferred on its own: the TE-style LayerNorm whose reset_parameters() leaves both tensors on meta is "
        "taken for a PyTorch-convention module (to_empty() first), and the block passes materializable_from_meta "
        "through to_empty(); it would take a claim inferred without an argument (TE's "
        "reset_parameters(defer_init=...) signature) or a composite whose children disagree (one materializes, "
        "one stays on meta) reported as a partial materialization",
    "fp8_state_dropped_when_resaved_before_forward":
        "checkpoint_round_trip_after_training saves the trained module once, loads it into a fresh module and "
        "runs the next step; it never saves again from the loaded module before that module's first forward "
        "(a resumed job checkpointing at once, a load-convert-save script), which is where get_extra_state() "
        "writes no FP8 state; it would take a second hop (train, save, load, save, load) compared with the "
        "source's next step",
}

#: case name -> why the oracle fails the correct twin (a false alarm)
FAILED_TWINS: dict[str, str] = {
}
