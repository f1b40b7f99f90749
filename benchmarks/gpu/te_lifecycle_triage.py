"""check_lifecycle pointed at TransformerEngine, and one probe per reported violation (issue #25 item 4).

Run on a machine with one CUDA GPU and TransformerEngine installed, from the repository root:

    python3 benchmarks/gpu/te_lifecycle_triage.py OUTDIR

It writes ``OUTDIR/te_lifecycle_reports.txt`` (the full check_lifecycle report of each TE subject) and
``OUTDIR/te_lifecycle_triage.json`` (each subject's statuses, and each probe's observed facts), and prints
one line per probe. The probes confirm, on TE itself, the mechanism behind each verdict of
docs/oracle.md ("Pointed at TransformerEngine"):

* ``bias_reset_raises``: ``te.ops.Bias.reset_parameters()`` on a materialized bias raises (a TE bug);
* ``stale_grad_after_setattr``: after ``setattr`` of a weight in a ``te.ops.Sequential``, the old object gets the grad;
* ``assign_separates_aliases``: ``load_state_dict(assign=True)`` leaves ``Linear.weight`` not its basic op's;
* ``deepcopy_fp8_storage``: a TE FP8 weight's wrapper reports data pointer 0 (original and copy alike) while
  the inner FP8 bytes of the copy are its own (the oracle's former false positive);
* ``meta_build_allocation``: the bytes a meta build allocates under delayed scaling equal the recipe state the
  op holds (``held_state``), so ``zero_allocation_on_meta`` holds;
* ``requires_grad_flip``: a weight frozen on meta is trainable after TE's reset_parameters() (a TE bug).

TransformerEngine is imported lazily; without it (or without a GPU) the script says so and exits 2.
"""

from __future__ import annotations

import copy
import json
import pathlib
import sys
import traceback

import torch


def _te():
    try:
        import transformer_engine.pytorch as te_pt  # noqa: F401  (optional: the device machine's TE)
        from transformer_engine.common import recipe as te_recipe
    except ImportError as error:
        print(f"TransformerEngine is not importable ({error}); install it to run this triage", file=sys.stderr)
        sys.exit(2)
    return te_pt, te_recipe


def _x(shape):
    return lambda device: (torch.randn(*shape, device=device),)


def subjects(te_pt, te_recipe):
    delayed = te_recipe.DelayedScaling(fp8_format=te_recipe.Format.E4M3, amax_history_len=8)

    def quantized(build):
        def factory(device):
            with te_pt.quantized_model_init(enabled=True, recipe=delayed):
                return build(device)
        return factory

    ops = te_pt.ops
    return {
        "ops.BasicLinear": (lambda d: ops.BasicLinear(64, 32, device=d), _x((32, 64))),
        "ops.Linear": (lambda d: ops.Linear(64, 32, device=d), _x((32, 64))),
        "ops.Sequential(LayerNorm, Linear)": (
            lambda d: ops.Sequential(ops.LayerNorm(64, device=d), ops.Linear(64, 32, device=d)), _x((32, 64))),
        "ops.Linear under quantized_model_init(delayed)": (quantized(lambda d: ops.Linear(64, 32, device=d)), None),
        "Linear (module API)": (lambda d: te_pt.Linear(64, 32, device=d), _x((32, 64))),
    }


def probes(te_pt, te_recipe, device):
    from refops.testing.lifecycle.materialization import held_state

    ops = te_pt.ops
    out = {}

    def probe(name):
        def wrap(fn):
            try:
                out[name] = fn()
            except Exception as error:  # noqa: BLE001  (a probe's failure is a fact too)
                out[name] = {"probe raised": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()[-800:]}
            print(f"{name}: {json.dumps(out[name])[:400]}")
        return wrap

    @probe("bias_reset_raises")
    def _():
        bias = ops.Bias(8, device=device)
        try:
            bias.reset_parameters()
            return {"raised": None}
        except RuntimeError as error:
            return {"raised": str(error).splitlines()[0]}

    @probe("stale_grad_after_setattr")
    def _():
        seq = ops.Sequential(ops.Linear(16, 8, device=device))
        seq(torch.randn(4, 16, device=device)).sum().backward()
        old = seq[0].weight
        new = torch.nn.Parameter(old.detach().clone())
        seq.zero_grad(set_to_none=True)
        seq[0].weight = new
        seq(torch.randn(4, 16, device=device)).sum().backward()
        return {"old_got_grad": old.grad is not None, "new_got_grad": new.grad is not None}

    @probe("assign_separates_aliases")
    def _():
        source = ops.Linear(16, 8, device=device)
        state = {k: v.clone() for k, v in source.state_dict().items() if isinstance(v, torch.Tensor)}
        op = ops.Linear(16, 8, device="meta")
        op.load_state_dict(state, assign=True, strict=False)
        return {"weight_is_basic_op_weight": op.weight is op.basic_ops[0].weight,
                "named_parameters": [n for n, _ in op.named_parameters()]}

    @probe("deepcopy_fp8_storage")
    def _():
        with te_pt.quantized_model_init(enabled=True, recipe=te_recipe.Float8CurrentScaling()):
            op = ops.BasicLinear(64, 32, device=device)
        clone = copy.deepcopy(op)
        inner = [n for n in ("_data", "_transpose", "_scale_inv") if getattr(op.weight, n, None) is not None]
        return {"type": type(op.weight).__name__,
                "wrapper_data_ptrs": [op.weight.untyped_storage().data_ptr(), clone.weight.untyped_storage().data_ptr()],
                "inner_shared": {n: getattr(op.weight, n).data_ptr() == getattr(clone.weight, n).data_ptr()
                                 for n in inner}}

    @probe("meta_build_allocation")
    def _():
        delayed = te_recipe.DelayedScaling(fp8_format=te_recipe.Format.E4M3, amax_history_len=8)
        torch.cuda.synchronize()
        before = torch.cuda.memory_stats(device)["allocated_bytes.all.allocated"]
        with te_pt.quantized_model_init(enabled=True, recipe=delayed):
            op = ops.Linear(64, 32, device="meta")
        allocated = torch.cuda.memory_stats(device)["allocated_bytes.all.allocated"] - before
        state = held_state(op, device)
        return {"allocated": allocated,
                "held_state": {path: [list(t.shape), t.untyped_storage().nbytes()] for path, t in state.items()},
                "held_rounded_to_512": sum(-(-t.untyped_storage().nbytes() // 512) * 512 for t in state.values())}

    @probe("requires_grad_flip")
    def _():
        op = ops.BasicLinear(16, 8, device="meta")
        op.weight.requires_grad_(False)
        op.reset_parameters()
        module = te_pt.Linear(16, 8, device="meta")
        module.weight.requires_grad_(False)
        module.to_empty(device=device)
        module.reset_parameters()
        return {"ops.BasicLinear after reset_parameters": op.weight.requires_grad,
                "Linear after to_empty + reset_parameters": module.weight.requires_grad}

    return out


def main() -> None:
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "te_lifecycle_triage")
    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("no CUDA device: TransformerEngine's ops need one", file=sys.stderr)
        sys.exit(2)
    te_pt, te_recipe = _te()
    from refops.testing import check_lifecycle

    device = torch.device("cuda", torch.cuda.current_device())
    results, texts = {"subjects": {}}, []
    for name, (factory, inputs) in subjects(te_pt, te_recipe).items():
        try:
            report = check_lifecycle(factory, device=device, inputs=inputs)
            results["subjects"][name] = {r.name: [str(r.status), r.evidence] for r in report}
            texts.append(f"== {name}\n{report}\n")
            print(f"{name}: {'ok' if report.ok else [r.name for r in report.violations]}")
        except Exception as error:  # noqa: BLE001  (an argument error names the misuse)
            results["subjects"][name] = {"check raised": f"{type(error).__name__}: {error}"}
            texts.append(f"== {name}\ncheck raised {type(error).__name__}: {error}\n")
            print(f"{name}: check raised {type(error).__name__}: {error}")
    results["probes"] = probes(te_pt, te_recipe, device)
    (out / "te_lifecycle_reports.txt").write_text("\n".join(texts))
    (out / "te_lifecycle_triage.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
