"""Minimal reproductions of what check_lifecycle reports on TransformerEngine, one subprocess each.

    python benchmarks/gpu/te_lifecycle_repros.py OUTDIR [--only NAME ...]

Needs a CUDA GPU and TransformerEngine (2.20.2 when this was written); run from the repository root
(the repros that compare with refops import it). Each repro is a few lines of plain TE code that prints
one verdict line, ``BUG: ...`` or ``ok: ...``, and runs in its own interpreter, so that a CUDA error in
one cannot spoil the others. Writes ``OUTDIR/te_lifecycle_repros.md`` (a table, then each repro's code
and output) and ``OUTDIR/te_lifecycle_repros.json``. Exit status 0 when every repro ran (whatever its
verdict), 1 when one crashed or timed out, 2 without TE or a GPU.

``suspect`` says what reading TE's source (2.20.2) led to expect: "TE bug" (the repro should print
BUG) or "oracle false positive" (TE behaves as promised, refops' check_lifecycle was too strict: the
repro should print ok and say why). docs/conformance.md tells the story; the final column is what
this GPU says.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time

HEADER = "import copy, torch\nimport transformer_engine.pytorch as te\n"


@dataclasses.dataclass(frozen=True)
class Repro:
    name: str
    #: The check_lifecycle property that reported it.
    property: str
    #: "TE bug" or "oracle false positive": what reading TE's source predicts.
    suspect: str
    #: Where in TE 2.20.2 the behaviour comes from.
    cause: str
    code: str


REPROS = [
    Repro(
        "meta_basic_linear_backward",
        "eager_values_after_first_forward",
        "TE bug",
        "ops/fuser.py: OperationFuser.__init__ caches the basic ops' parameters; maybe_fuse_ops then runs "
        "pre_first_fuser_forward(), which replaces the meta weight with a new Parameter, and never re-caches: "
        "autograd receives the meta tensor (the seed's bug, TE PR #3327, not in 2.20.2)",
        """
        op = te.ops.BasicLinear(64, 64, device="meta")
        x = torch.randn(32, 64, device="cuda", requires_grad=True)
        try:
            op(x).sum().backward()
        except RuntimeError as error:
            print("BUG: backward of a meta-built te.ops.BasicLinear raised:", str(error).splitlines()[0])
        else:
            ok = op.weight.grad is not None and op.weight.grad.device.type == "cuda"
            print("ok: the materialized weight got its grad" if ok else "BUG: the materialized weight got no grad")
        """,
    ),
    Repro(
        "bias_reset_parameters_twice",
        "eager_values_after_to_empty, aliases_preserved, requires_grad_kept",
        "TE bug",
        "ops/basic/bias.py: Bias.reset_parameters() keeps a bias already on CUDA and calls bias.zero_() on it "
        "outside torch.no_grad(): an in-place op on a leaf that requires grad. So to_empty() + "
        "reset_parameters() (PyTorch's and FSDP2's way to materialize a meta model) raises on every op with a bias",
        """
        model = te.ops.Sequential(te.ops.Linear(64, 64, device="meta"))
        model.to_empty(device="cuda")
        try:
            for module in model.modules():
                if hasattr(module, "reset_parameters"):
                    module.reset_parameters()
        except RuntimeError as error:
            print("BUG: to_empty() + reset_parameters() raised:", str(error).splitlines()[0])
        else:
            print("ok: to_empty() + reset_parameters() materialized the model")
        """,
    ),
    Repro(
        "setattr_weight_in_sequential",
        "no_stale_cache_after_replacement",
        "TE bug",
        "ops/sequential.py caches its OperationFusers (_module_groups) and ops/fuser.py caches their parameters "
        "at construction; nothing re-checks them, so after `model[0].weight = new` autograd still gets the old "
        "Parameter: the forward computes with the new weight, the grad lands on the replaced one",
        """
        torch.manual_seed(0)
        model = te.ops.Sequential(te.ops.Linear(64, 64, device="cuda"))
        x = torch.randn(32, 64, device="cuda")
        model(x).sum().backward()
        old = model[0].weight
        new = torch.nn.Parameter(old.detach().clone())
        model[0].weight = new
        old.grad = None
        model(x).sum().backward()
        if new.grad is None or old.grad is not None:
            print(f"BUG: after model[0].weight = new, new.grad is {'None' if new.grad is None else 'set'} and the "
                  f"replaced weight's grad is {'set' if old.grad is not None else 'None'}")
        else:
            print("ok: the new weight got the grad")
        """,
    ),
    Repro(
        "meta_linear_aliases_after_materialization",
        "eager_values_after_reset_parameters, eager_values_after_first_forward, aliases_preserved",
        "TE bug",
        "ops/linear.py registers `weight` and `bias` on the composite Linear as aliases of its basic ops' "
        "parameters; ops/basic/basic_linear.py reset_parameters() (also run by the first forward of a meta-built "
        "op) assigns the basic op a new Parameter: the composite's `weight` stays the old meta tensor, so "
        "model.parameters() (what an optimizer is built from) still yields meta tensors",
        """
        model = te.ops.Linear(64, 64, device="meta")
        x = torch.randn(32, 64, device="cuda")
        try:
            model(x)
        except RuntimeError as error:
            print("BUG: the first forward of a meta-built te.ops.Linear raised:", str(error).splitlines()[0])
        else:
            on_meta = sorted(name for name, p in model.named_parameters() if p.is_meta)
            tied = model.weight is model.basic_ops[0].weight
            if on_meta or not tied:
                print(f"BUG: after the first forward of a meta-built te.ops.Linear, {on_meta} are still on meta "
                      f"(model.weight is model.basic_ops[0].weight: {tied})")
            else:
                print("ok: the first forward materialized every parameter the module lists")
        """,
    ),
    Repro(
        "delayed_scaling_checkpoint_refused",
        "checkpoint_round_trip",
        "TE bug",
        "_extra_state.py: a delayed-scaling op saves its recipe state (scale, amax history) as a Python pickle in "
        "`_extra_state`, and set_extra_state refuses to unpickle it unless NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1 "
        "(a security guard added in 2.x): TE's own state_dict does not load back by default. refops stores the "
        "recipe state as tensors, so nothing needs unpickling",
        """
        from transformer_engine.common.recipe import DelayedScaling

        recipe = DelayedScaling()
        with te.quantized_model_init(enabled=True, recipe=recipe):
            model = te.ops.Linear(64, 64, device="cuda")
        with te.autocast(enabled=True, recipe=recipe):
            model(torch.randn(32, 64, device="cuda")).sum().backward()
        with te.quantized_model_init(enabled=True, recipe=recipe):
            fresh = te.ops.Linear(64, 64, device="cuda")
        try:
            fresh.load_state_dict(model.state_dict())
        except RuntimeError as error:
            print("BUG: TE's own delayed-scaling checkpoint does not load back:", str(error).splitlines()[0][:160])
        else:
            print("ok: the delayed-scaling checkpoint loaded back")
        """,
    ),
    Repro(
        "load_state_dict_assign_linear",
        "load_state_dict_assign_into_meta",
        "TE bug",
        "ops/linear.py: Linear registers `weight` and `bias` as its own parameters, aliases of its basic ops'. "
        "load_state_dict(assign=True) wraps each loaded tensor in a new Parameter per module: Linear.weight "
        "gets one (which register_parameter also gives the basic op), then BasicLinear's own load gives the "
        "basic op another; nothing re-ties them",
        """
        source = te.ops.Linear(64, 64, device="cuda")
        model = te.ops.Linear(64, 64, device="meta")
        model.load_state_dict(source.state_dict(), assign=True)
        tied = model.weight is model.basic_ops[0].weight and model.bias is model.basic_ops[1].bias
        if not tied:
            names = [name for name, _ in model.named_parameters()]
            print(f"BUG: after load_state_dict(assign=True) model.weight is not model.basic_ops[0].weight; "
                  f"named_parameters() lists {names}")
        else:
            print("ok: the aliases still name the basic ops' parameters")
        """,
    ),
    Repro(
        "deepcopy_fp8_weight_storage",
        "deepcopy_keeps_aliases_and_shares_nothing",
        "oracle false positive",
        "quantized_tensor.py: QuantizedTensor.untyped_storage() returns an empty UntypedStorage (data_ptr 0) for "
        "every quantized tensor; check_lifecycle compares (device, untyped_storage().data_ptr()), so any two "
        "FP8 weights look like one storage. The bytes live in _data / _transpose / _scale_inv",
        """
        from transformer_engine.common.recipe import Float8CurrentScaling
        with te.quantized_model_init(enabled=True, recipe=Float8CurrentScaling()):
            op = te.ops.Linear(64, 64, device="cuda")
        clone = copy.deepcopy(op)
        def buffers(t):
            return {n: getattr(t, n).data_ptr() for n in ("_data", "_transpose", "_scale_inv")
                    if getattr(t, n, None) is not None}
        original, copied = buffers(op.weight), buffers(clone.weight)
        shared = sorted(n for n in original if original[n] == copied.get(n))
        if shared:
            print(f"BUG: the deep copy of the FP8 weight shares its buffers {shared}")
        else:
            print(f"ok: the copy's FP8 buffers {sorted(copied)} are its own; untyped_storage().data_ptr() is "
                  f"{op.weight.untyped_storage().data_ptr()} and {clone.weight.untyped_storage().data_ptr()} "
                  "(an empty storage for every quantized tensor): the oracle compared those")
        """,
    ),
    Repro(
        "meta_build_recipe_state_bytes",
        "zero_allocation_on_meta",
        "oracle false positive",
        "ops/basic/basic_linear.py: under quantized_model_init the constructor calls reset_recipe_state(), and "
        "DelayedScalingRecipeState allocates its scale and amax history on the current CUDA device. Parameters "
        "stay on meta; refops' reference allocates its recipe state on the materialization device too",
        """
        import refops
        from transformer_engine.common.recipe import DelayedScaling, Format
        def bytes_allocated():
            torch.cuda.synchronize()
            return torch.cuda.memory_stats().get("allocated_bytes.all.allocated", 0)
        before = bytes_allocated()
        with te.quantized_model_init(enabled=True, recipe=DelayedScaling(fp8_format=Format.E4M3, amax_history_len=8)):
            op = te.ops.BasicLinear(64, 64, device="meta")
        te_bytes = bytes_allocated() - before
        before = bytes_allocated()
        with torch.device("cuda"), refops.quantized_model_init(
                recipe=refops.recipe.DelayedScaling(fp8_format=refops.recipe.Format.E4M3, amax_history_len=8)):
            ref = refops.ops.BasicLinear(64, 64, device="meta")
        ref_bytes = bytes_allocated() - before
        if not op.weight.is_meta:
            print(f"BUG: the meta build's weight is on {op.weight.device}")
        else:
            print(f"ok: the weight stays on meta; TE allocated {te_bytes} bytes (recipe state: scale and amax "
                  f"history) and refops {ref_bytes} bytes for the same meta build (refops' weight on meta: "
                  f"{ref.weight.is_meta}): not a TE-only behaviour")
        """,
    ),
    Repro(
        "reset_parameters_unfreezes",
        "requires_grad_kept",
        "TE bug",
        "ops/basic/basic_linear.py and bias.py: reset_parameters() of a meta parameter allocates a new tensor and "
        "wraps it in a new torch.nn.Parameter, whose requires_grad is True: a weight frozen before "
        "materialization (LoRA, BitFit, a frozen embedding built on meta for FSDP2) silently becomes trainable",
        """
        op = te.ops.BasicLinear(64, 64, device="meta")
        op.weight.requires_grad_(False)
        op.reset_parameters()
        bias = te.ops.Bias(64, device="meta")
        bias.bias.requires_grad_(False)
        bias.reset_parameters()
        flipped = [name for name, p in (("BasicLinear.weight", op.weight), ("Bias.bias", bias.bias))
                   if p.requires_grad]
        if flipped:
            print(f"BUG: reset_parameters() made the frozen {', '.join(flipped)} trainable again")
        else:
            print("ok: the frozen parameters stayed frozen")
        """,
    ),
    Repro(
        "grouped_linear_block_scaling_not_supported",
        "every property of GroupedLinear under FP8 block scaling (bfloat16)",
        "TE bug",
        "ops/basic/grouped_linear.py -> general_grouped_gemm -> common/gemm/cublaslt_gemm.cu: TE's grouped GEMM "
        "of 1x128 / 128x128 block-scaled operands asks cuBLAS for an algorithm it does not have on sm_90 "
        "(torch 2.11+cu130): CUBLAS_STATUS_NOT_SUPPORTED for any split sizes, while per-tensor FP8 works; TE's "
        "own test_grouped_linear[fp8_block_scaling] fails the same way on that GPU",
        """
        from transformer_engine.common.recipe import Float8BlockScaling
        op = te.ops.GroupedLinear(2, 128, 128, bias=True, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
        try:
            with te.autocast(enabled=True, recipe=Float8BlockScaling()):
                op(x, torch.tensor([128, 128], device="cuda"))
            torch.cuda.synchronize()
        except RuntimeError as error:
            print("BUG: te.ops.GroupedLinear under Float8BlockScaling raised:", str(error).splitlines()[0][-120:])
        else:
            print("ok: GroupedLinear runs under Float8BlockScaling")
        """,
    ),
    Repro(
        "block_scaling_f32_scales_ignored",
        "(found while mapping recipes for the quantizer tier)",
        "TE bug",
        "common/recipe/__init__.py: Float8BlockScaling's fp8_quant_fwd_inp / fwd_weight / bwd_grad are class "
        "attributes computed once, at import, from NVTE_FP8_BLOCK_SCALING_FP32_SCALES; the recipe states read "
        "them, so the constructor argument use_f32_scales=True changes nothing",
        """
        from transformer_engine.common.recipe import Float8BlockScaling
        from transformer_engine.pytorch.quantization import RecipeState
        recipe = Float8BlockScaling(use_f32_scales=True)
        quantizer = RecipeState.create(recipe, mode="forward", num_quantizers=2).make_quantizers()[0]
        if quantizer.force_pow_2_scales:
            print("BUG: Float8BlockScaling(use_f32_scales=True) makes quantizers with force_pow_2_scales=True "
                  f"(recipe.fp8_quant_fwd_inp = {recipe.fp8_quant_fwd_inp})")
        else:
            print("ok: use_f32_scales=True gives fp32 scales")
        """,
    ),
]


def run_repro(repro: Repro, timeout: float) -> dict:
    """Run one repro in a fresh interpreter: its verdict, its output, its time."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVTE_")}  # TE's defaults, not this shell's
    code = HEADER + textwrap.dedent(repro.code)
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
        output, errors, status = done.stdout.strip(), done.stderr.strip(), done.returncode
    except subprocess.TimeoutExpired:
        output, errors, status = "", f"timed out after {timeout:.0f} s", None
    lines = output.splitlines()
    verdict_line = next((line for line in reversed(lines) if line.startswith(("BUG:", "ok"))), "")
    if status == 0 and verdict_line:
        verdict = "BUG" if verdict_line.startswith("BUG:") else "ok"
    else:
        verdict = "crashed"
        verdict_line = (errors.splitlines() or ["no output"])[-1]
    return {
        "name": repro.name,
        "property": repro.property,
        "suspect": repro.suspect,
        "cause": repro.cause,
        "verdict": verdict,
        "as_suspected": verdict == ("BUG" if repro.suspect == "TE bug" else "ok"),
        "output": verdict_line,
        "stderr_tail": errors.splitlines()[-5:],
        "seconds": round(time.perf_counter() - start, 1),
        "code": code,
    }


def markdown(results: list[dict], te_version: str, gpu: str) -> str:
    lines = [f"# check_lifecycle's reports on TransformerEngine {te_version}: minimal reproductions", "",
             f"GPU: {gpu}. Each repro ran in its own interpreter; `suspect` is what TE's source predicts.", "",
             "| repro | property | suspect | verdict | as suspected | output |", "|---|---|---|---|---|---|"]
    for r in results:
        output = r["output"].replace("|", "\\|")
        lines.append(f"| {r['name']} | {r['property']} | {r['suspect']} | **{r['verdict']}** | "
                     f"{'yes' if r['as_suspected'] else 'NO'} | {output} |")
    for r in results:
        lines += ["", f"## {r['name']}", "", f"Cause (TE 2.20.2): {r['cause']}.", "", "```python",
                  r["code"].rstrip(), "```", "", "```text", r["output"], "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=pathlib.Path, help="directory for te_lifecycle_repros.md and .json")
    parser.add_argument("--only", nargs="+", choices=[r.name for r in REPROS], help="only these repros")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per repro (default 300)")
    args = parser.parse_args(argv)
    try:
        import torch
        import transformer_engine.pytorch  # noqa: F401
        from importlib.metadata import version
    except Exception as error:  # noqa: BLE001  (any failure to import TE means: not here)
        print(f"te_lifecycle_repros: needs TransformerEngine ({type(error).__name__}: {error}); install it with: "
              "pip install --no-build-isolation 'transformer_engine[pytorch]'", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("te_lifecycle_repros: needs a CUDA GPU (TransformerEngine's ops run there); none is visible",
              file=sys.stderr)
        return 2
    te_version = version("transformer_engine")
    gpu = f"{torch.cuda.get_device_name()} (compute capability {'.'.join(map(str, torch.cuda.get_device_capability()))})"
    results = []
    for repro in REPROS:
        if args.only and repro.name not in args.only:
            continue
        result = run_repro(repro, args.timeout)
        print(f"{result['name']:<36} {result['verdict']:<8} {result['output']}", flush=True)
        results.append(result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "te_lifecycle_repros.md").write_text(markdown(results, te_version, gpu))
    (args.out / "te_lifecycle_repros.json").write_text(json.dumps(
        {"transformer_engine": te_version, "gpu": gpu, "repros": results}, indent=1) + "\n")
    print(f"wrote {args.out / 'te_lifecycle_repros.md'} and .json")
    return 1 if any(r["verdict"] == "crashed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
