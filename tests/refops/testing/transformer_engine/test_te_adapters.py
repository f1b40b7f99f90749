"""refops.testing.transformer_engine on the CPU: the mapping of every option, and the error without TE.

TransformerEngine is not installed here. Two stand-ins are put under its module names
(``tests/refops/_fake_te.py``): a *recording* TE, whose classes record how the adapters
construct and call them (with a ``DType`` and a ``Format`` of their own, so that a mapping by
value instead of by name would show), and refops itself under TE's names, with which the
adapters run end to end through the oracle's tiers.
"""

from __future__ import annotations

import copy
import inspect
import subprocess
import sys

import pytest
import torch

import refops
from refops.quantization import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
)
from refops.recipe import (
    CustomRecipe,
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    Format,
    MMParams,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)
from refops.testing import check_lifecycle, check_quantizer, compare_modules, make_recipe
from refops.testing import transformer_engine as adapters
from refops.testing.transformer_engine import (
    INSTALL_HINT,
    TransformerEngineUnavailable,
    availability,
    bit_identical_share,
    build_pair,
    candidate_context,
    copy_values,
    lifecycle_cases,
    quantized_fields,
    quantizer_candidate,
    te_quantizer,
    te_recipe,
    te_role_quantizer,
)

from _fake_te import DType as FakeDType
from _fake_te import Format as FakeFormat
from _fake_te import flip_first_code, install_recording_te, install_refops_as_te

CPU = torch.device("cpu")


# --------------------------------------------------------------------------- without TE
def test_importing_the_adapters_does_not_import_transformer_engine():
    code = ("import sys, refops.testing.transformer_engine as t; "
            "assert 'transformer_engine' not in sys.modules, sorted(m for m in sys.modules if 'transformer' in m); "
            "print(t.INSTALL_HINT)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "pip install --no-build-isolation 'transformer_engine[pytorch]'"


ADAPTER_CALLS = {
    "te_recipe": lambda: te_recipe(DelayedScaling()),
    "te_quantizer": lambda: te_quantizer(MXFP8Quantizer(refops.DType.kFloat8E4M3)),
    "te_role_quantizer": lambda: te_role_quantizer(MXFP8BlockScaling(), "input"),
    "quantizer_candidate": lambda: quantizer_candidate(MXFP8BlockScaling()),
    "candidate_context": lambda: candidate_context(None),
    "build_pair": lambda: build_pair("linear", recipe=None, dtype=torch.float32, device=CPU),
    "lifecycle_cases": lambda: lifecycle_cases(),
}


@pytest.mark.parametrize("name", sorted(ADAPTER_CALLS))
def test_without_te_every_adapter_says_who_needs_it_and_how_to_install(name, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformer_engine", None)  # an import of it fails as if absent
    with pytest.raises(TransformerEngineUnavailable) as raised:
        ADAPTER_CALLS[name]()
    message = str(raised.value)
    assert message.startswith(f"{name} needs TransformerEngine, which is not installed here")
    assert message.endswith(f"install it with: {INSTALL_HINT}")
    assert isinstance(raised.value, ImportError)


def test_a_te_that_fails_to_import_is_told_apart_from_a_missing_one(monkeypatch):
    def broken(name):
        raise OSError("libtransformer_engine.so: cannot open shared object file")

    monkeypatch.setattr(availability.importlib, "import_module", broken)
    with pytest.raises(TransformerEngineUnavailable, match=r"te_recipe needs TransformerEngine, which is installed "
                       r"but fails to import here \(OSError: libtransformer_engine.so: cannot open"):
        te_recipe(DelayedScaling())


def test_the_version_comes_from_the_package(monkeypatch):
    install_refops_as_te(monkeypatch, version="2.20.2")
    assert adapters.import_te("a test").version == "2.20.2"


# ------------------------------------------------------------------- quantizers: mapping
E4M3, E5M2 = refops.DType.kFloat8E4M3, refops.DType.kFloat8E5M2

QUANTIZERS = {
    "delayed": lambda: Float8Quantizer(torch.tensor([0.5]), torch.tensor([3.0]), E5M2, rowwise=False, columnwise=True),
    "current": lambda: Float8CurrentScalingQuantizer(E4M3, rowwise=True, columnwise=False, with_amax_reduction=True,
                                                     amax_reduction_group="group", force_pow_2_scales=True,
                                                     amax_epsilon=1e-3),
    "mxfp8": lambda: MXFP8Quantizer(E5M2, rowwise=False, columnwise=True, with_2d_quantization=True),
    "block": lambda: Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True, amax_epsilon=0.25,
                                          force_pow_2_scales=False, block_scaling_dim=1),
    "nvfp4": lambda: NVFP4Quantizer(rowwise=True, columnwise=False, with_amax_reduction=True,
                                    amax_reduction_group="g", with_rht=True, with_post_rht_amax=True,
                                    with_2d_quantization=True, stochastic_rounding=True, with_random_sign_mask=False,
                                    row_scaled_nvfp4=True, nvfp4_use_4over6=True, nvfp4_e4m3_max=256,
                                    nvfp4_4over6_err_mode="MSE"),
}

EXPECTED = {
    "current": ((FakeDType.kFloat8E4M3, CPU), dict(rowwise=True, columnwise=False, with_amax_reduction=True,
                                                   amax_reduction_group="group", force_pow_2_scales=True,
                                                   amax_epsilon=1e-3)),
    "mxfp8": ((FakeDType.kFloat8E5M2,), dict(rowwise=False, columnwise=True, with_2d_quantization=True)),
    "block": ((FakeDType.kFloat8E4M3,), dict(rowwise=True, columnwise=True, amax_epsilon=0.25,
                                             force_pow_2_scales=False, block_scaling_dim=1)),
    "nvfp4": ((), dict(fp4_dtype=FakeDType.kFloat4E2M1, rowwise=True, columnwise=False, with_amax_reduction=True,
                       amax_reduction_group="g", with_rht=True, with_post_rht_amax=True, with_2d_quantization=True,
                       stochastic_rounding=True, row_scaled_nvfp4=True, nvfp4_use_4over6=True, nvfp4_e4m3_max=256,
                       nvfp4_4over6_err_mode="MSE", with_random_sign_mask=False)),
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_te_quantizer_passes_every_option_to_the_class_of_the_same_name(kind, monkeypatch):
    rec = install_recording_te(monkeypatch)
    made = te_quantizer(QUANTIZERS[kind](), device=CPU)
    name = type(QUANTIZERS[kind]()).__name__
    assert type(made).__name__ == name
    assert rec.of(name) == [EXPECTED[kind]]
    assert made.internal is False and made.optimize_for_gemm is False, "plain (unswizzled) scales, autograd on"


def test_te_quantizer_gives_delayed_scaling_copies_of_the_scale_and_amax(monkeypatch):
    rec = install_recording_te(monkeypatch)
    refops_q = QUANTIZERS["delayed"]()
    made = te_quantizer(refops_q, device=CPU)
    (args, kwargs), = rec.of("Float8Quantizer")
    scale, amax, dtype = args
    assert torch.equal(scale, torch.tensor([0.5])) and torch.equal(amax, torch.tensor([3.0]))
    assert scale is not refops_q.scale and amax is not refops_q.amax, "TE records into its own buffers"
    assert dtype is FakeDType.kFloat8E5M2 and kwargs == dict(rowwise=False, columnwise=True)
    assert made.scale is scale


@pytest.mark.parametrize("cls", [Float8Quantizer, Float8CurrentScalingQuantizer, MXFP8Quantizer,
                                 Float8BlockQuantizer, NVFP4Quantizer])
def test_every_constructor_argument_of_a_refops_quantizer_is_mapped(cls):
    """A new option on a refops quantizer must reach TE: this fails until the adapter maps it."""
    params = set(inspect.signature(cls.__init__).parameters) - {"self"}
    handled = {"fp8_dtype", "fp4_dtype", "rowwise", "columnwise", "scale", "amax", "device"}
    assert params - handled == set(adapters.quantizer_classes._OPTIONS[cls]), cls.__name__


def test_te_quantizer_refuses_what_is_not_a_refops_quantizer(monkeypatch):
    install_recording_te(monkeypatch)

    class Custom(MXFP8Quantizer):
        pass

    with pytest.raises(TypeError, match=r"te_quantizer: expected one of refops' quantizers .*got Custom"):
        te_quantizer(Custom(E4M3))
    with pytest.raises(TypeError, match="got str"):
        te_quantizer("fp8")


def test_te_role_quantizer_asks_te_recipe_state_for_the_role(monkeypatch):
    rec = install_recording_te(monkeypatch)
    made = te_role_quantizer(Float8CurrentScaling(fp8_format=Format.HYBRID), "grad_output", device=CPU)
    (args, kwargs), = rec.of("RecipeState.create")
    assert type(args[0]).__name__ == "Float8CurrentScaling" and args[0].fp8_format is FakeFormat.HYBRID
    assert kwargs["mode"] == "backward" and kwargs["num_quantizers"] == 1 and kwargs["device"] == CPU
    assert [(r.module_type, r.tensor_type) for r in kwargs["roles"]] == [("linear", "grad_output")]
    assert made.optimize_for_gemm is False
    te_role_quantizer(Float8CurrentScaling(), "weight", device=CPU)
    assert rec.of("RecipeState.create")[1][1]["mode"] == "forward"
    with pytest.raises(ValueError, match=r"te_role_quantizer: role must be one of \('input', 'weight', "
                                         r"'grad_output'\), got 'output'"):
        te_role_quantizer(Float8CurrentScaling(), "output")


# ----------------------------------------------------------------------- recipes: mapping
def test_te_recipe_passes_every_field_by_name(monkeypatch):
    install_recording_te(monkeypatch)
    delayed = te_recipe(DelayedScaling(margin=2, fp8_format=Format.E4M3, amax_history_len=16,
                                       amax_compute_algo="most_recent", reduce_amax=False))
    assert type(delayed).__name__ == "DelayedScaling"
    assert (delayed.margin, delayed.fp8_format, delayed.amax_history_len, delayed.amax_compute_algo,
            delayed.reduce_amax) == (2, FakeFormat.E4M3, 16, "most_recent", False)
    current = te_recipe(Float8CurrentScaling(fp8_format=Format.HYBRID, use_power_2_scales=True,
                                             fp8_gemm_fprop=MMParams(use_split_accumulator=True)))
    assert current.use_power_2_scales is True and current.fp8_format is FakeFormat.HYBRID
    assert type(current.fp8_gemm_fprop).__name__ == "MMParams" and current.fp8_gemm_fprop.use_split_accumulator
    nvfp4 = te_recipe(NVFP4BlockScaling(disable_rht=True, disable_2d_quantization=True, row_scaled_activation=True,
                                        nvfp4_4over6="weights", nvfp4_4over6_err_mode="MSE"))
    assert (nvfp4.disable_rht, nvfp4.disable_2d_quantization, nvfp4.row_scaled_activation, nvfp4.nvfp4_4over6,
            nvfp4.nvfp4_4over6_err_mode) == (True, True, True, "weights", "MSE")
    assert te_recipe(None) is None


def test_te_recipe_sets_the_derived_quantization_parameters_on_the_instance(monkeypatch):
    """TE 2.20.2 computes Float8BlockScaling's QParams as class attributes from an environment variable read
    at import: the constructor's use_f32_scales would be ignored. The adapter sets refops' values."""
    install_recording_te(monkeypatch)
    block = te_recipe(Float8BlockScaling(use_f32_scales=True, x_block_scaling_dim=2, w_block_scaling_dim=1))
    for name in ("fp8_quant_fwd_inp", "fp8_quant_fwd_weight", "fp8_quant_bwd_grad"):
        qparams = getattr(block, name)
        assert type(qparams).__name__ == "QParams" and qparams.power_2_scale is False, name
    assert (block.x_block_scaling_dim, block.w_block_scaling_dim) == (2, 1)
    nvfp4 = te_recipe(NVFP4BlockScaling(disable_rht=False, disable_stochastic_rounding=False,
                                        disable_2d_quantization=False))
    assert nvfp4.fp4_quant_bwd_grad.stochastic_rounding and nvfp4.fp4_quant_bwd_grad.random_hadamard_transform
    assert nvfp4.fp4_quant_fwd_weight.fp4_2d_quantization and not nvfp4.fp4_quant_fwd_inp.stochastic_rounding


def test_te_recipe_refuses_a_setting_te_cannot_take_and_drops_one_left_at_its_default(monkeypatch):
    install_recording_te(monkeypatch, drop_fields={"MXFP8BlockScaling": ("enable_2d_quantization",)})
    assert type(te_recipe(MXFP8BlockScaling(enable_2d_quantization=False))).__name__ == "MXFP8BlockScaling"
    with pytest.raises(ValueError, match=r"te_recipe: MXFP8BlockScaling.enable_2d_quantization=True, but "
                                         r"TransformerEngine 9.9-recording's MXFP8BlockScaling has no field "
                                         r"'enable_2d_quantization': the recipe cannot be reproduced"):
        te_recipe(MXFP8BlockScaling(enable_2d_quantization=True))
    with pytest.raises(TypeError, match="te_recipe: expected a refops Recipe"):
        te_recipe("delayed")


def test_te_recipe_wraps_a_custom_recipe_factory(monkeypatch):
    rec = install_recording_te(monkeypatch)
    seen = []

    def qfactory(role):
        seen.append(role)
        return MXFP8Quantizer(E5M2 if role.tensor_type == "grad_output" else E4M3)

    translated = te_recipe(CustomRecipe(qfactory=qfactory))
    role = sys.modules["transformer_engine.pytorch.quantization"].QuantizerRole("linear", "grad_output", "fc1")
    made = translated.qfactory(role)
    assert seen == [refops.QuantizerRole("linear", "grad_output", "fc1")], "TE's role reaches the refops factory"
    assert type(made).__name__ == "MXFP8Quantizer" and rec.of("MXFP8Quantizer")[-1][0] == (FakeDType.kFloat8E5M2,)


# ----------------------------------------------------------- quantizer candidate: behaviour
def test_per_tensor_fp8_column_wise_asks_te_for_both_usages_and_returns_the_transpose(monkeypatch):
    rec = install_recording_te(monkeypatch)
    recipe = Float8CurrentScaling(fp8_format=Format.E4M3)
    report = check_quantizer(quantizer_candidate(recipe, device=CPU), recipe, output="data_and_scale_inv",
                             cases=["normal", "ties"], dtypes=[torch.bfloat16])
    report.assert_ok()
    asked = [k for a, k in rec.of("quantize")]
    assert dict(rowwise=True, columnwise=False) in asked
    assert dict(rowwise=True, columnwise=True) in asked and dict(rowwise=False, columnwise=True) not in asked
    assert report["ties", "bfloat16", "columnwise"].status == "ok"


def test_a_te_without_a_transpose_gives_the_row_wise_codes_transposed(monkeypatch):
    install_refops_as_te(monkeypatch)
    x = torch.randn(64, 32)
    tensor = refops.Float8CurrentScalingQuantizer(E4M3)(x)
    expected = quantized_fields(tensor, "columnwise")["data"]
    tensor._transpose = None  # as TE keeps it where cuBLAS takes non-TN FP8 GEMMs
    got = quantized_fields(tensor, "columnwise")["data"]
    assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)) and got.shape == (32, 64)


def test_delayed_scaling_amax_is_recorded_into_the_case_quantizer_and_returned(monkeypatch):
    install_refops_as_te(monkeypatch)
    quantizer = Float8Quantizer(torch.tensor([2.0]), torch.zeros(1), E4M3)
    candidate = quantizer_candidate(quantizer, device=CPU)
    x = torch.tensor([[1.0, -7.5], [3.0, 0.25]])
    fields = candidate(x, quantizer)
    assert quantizer.amax.item() == 7.5 and fields["amax"].tolist() == [7.5]
    assert set(fields) == {"data", "scale_inv", "amax"} and fields["scale_inv"].tolist() == [0.5]


def test_swizzled_scales_are_refused_not_compared(monkeypatch):
    install_refops_as_te(monkeypatch)
    tensor = refops.MXFP8Quantizer(E4M3)(torch.randn(64, 64))
    tensor._with_gemm_swizzled_scales = True
    with pytest.raises(ValueError, match="MXFP8Tensor's scales are swizzled for cuBLAS"):
        quantized_fields(tensor, "rowwise")
    tensor = refops.MXFP8Quantizer(E4M3, rowwise=True, columnwise=False)(torch.randn(64, 64))
    with pytest.raises(ValueError, match="MXFP8Tensor holds no columnwise data"):
        quantized_fields(tensor, "columnwise")


@pytest.mark.parametrize("name", ["fp8_delayed_scaling", "fp8_current_scaling", "mxfp8", "fp8_block_scaling",
                                  "nvfp4", "nvfp4_4over6"])
def test_refops_as_te_passes_check_quantizer_for_every_recipe_and_role(name, monkeypatch):
    install_refops_as_te(monkeypatch)
    recipe = make_recipe(name)
    for role in adapters.ROLES:
        report = check_quantizer(quantizer_candidate(recipe, role=role, device=CPU), recipe, role=role,
                                 output="data_and_scale_inv", dtypes=[torch.bfloat16])
        report.assert_ok()
        assert report.subject == f"TransformerEngine ({type(recipe).__name__}, {role})"


def test_a_linear_weight_role_gets_mxfp8_2d_blocks_as_check_quantizer_reference_does(monkeypatch):
    """TE gives 2D blocks only to a slot whose role names a linear's weight: a role without the module type
    would give the candidate 1D blocks against a 2D reference (every weight row would fail)."""
    install_refops_as_te(monkeypatch)
    recipe = MXFP8BlockScaling(enable_2d_quantization=True)
    assert te_role_quantizer(recipe, "weight", device=CPU).with_2d_quantization is True
    assert te_role_quantizer(recipe, "input", device=CPU).with_2d_quantization is False
    check_quantizer(quantizer_candidate(recipe, role="weight", device=CPU), recipe, role="weight",
                    output="data_and_scale_inv", dtypes=[torch.bfloat16]).assert_ok()


def test_a_te_quantizer_with_a_planted_bug_fails_check_quantizer(monkeypatch):
    install_refops_as_te(monkeypatch, quantizers={"MXFP8Quantizer": flip_first_code(refops.MXFP8Quantizer)})
    recipe = make_recipe("mxfp8")
    report = check_quantizer(quantizer_candidate(recipe, device=CPU), recipe, output="data_and_scale_inv",
                             dtypes=[torch.float32], usages=["rowwise"])
    assert not report.ok and all(r.code_mismatches == 1 for r in report.failures)


def test_quantizer_candidate_refuses_bad_arguments(monkeypatch):
    install_refops_as_te(monkeypatch)
    with pytest.raises(TypeError, match="quantizer_candidate: expected a refops Quantizer or Recipe, got str"):
        quantizer_candidate("mxfp8")
    with pytest.raises(ValueError, match="quantizer_candidate: role must be one of"):
        quantizer_candidate(MXFP8BlockScaling(), role="wgrad")


# ---------------------------------------------------------------------------- modules
def test_candidate_context_is_te_autocast_with_te_recipe_made_once(monkeypatch):
    rec = install_recording_te(monkeypatch)
    context = candidate_context(Float8CurrentScaling(fp8_format=Format.HYBRID))
    with context():
        pass
    with context():
        pass
    made = rec.of("autocast")
    assert len(made) == 2 and all(k["enabled"] is True for _, k in made)
    assert made[0][1]["recipe"] is made[1][1]["recipe"], "one TE recipe for every call"
    assert made[0][1]["recipe"].fp8_format is FakeFormat.HYBRID
    assert [w for w, _, _ in rec.calls if w.startswith("autocast.")] == ["autocast.enter", "autocast.exit"] * 2
    with candidate_context(None)():
        pass
    assert rec.of("autocast")[-1][1] == dict(enabled=False, recipe=None)


@pytest.mark.parametrize("quantized_init", [False, True])
def test_build_pair_gives_both_sides_the_same_values(quantized_init, monkeypatch):
    install_refops_as_te(monkeypatch)
    recipe = make_recipe("fp8_current_scaling")
    te_module, ref_module = build_pair("linear_gelu_linear", recipe=recipe, dtype=torch.float32, device=CPU,
                                       quantized_init=quantized_init)
    assert te_module is not ref_module
    params = dict(ref_module.named_parameters())
    assert sorted(params) == sorted(n for n, _ in te_module.named_parameters()) == [
        "0.bias", "0.weight", "2.bias", "2.weight"]
    for name, p in te_module.named_parameters():
        assert type(p) is type(params[name]) and p is not params[name]
        a, b = (t.dequantize() if isinstance(t, refops.QuantizedTensor) else t for t in (p, params[name]))
        assert torch.equal(a, b), name
    assert isinstance(params["0.weight"], refops.Float8Tensor) == quantized_init
    report = compare_modules(te_module, ref_module, (torch.randn(16, 128),), recipe=recipe,
                             candidate_context=candidate_context(recipe), copy_parameters=False)
    assert report.ok, str(report)


def test_build_pair_and_copy_values_refuse_bad_arguments(monkeypatch):
    install_refops_as_te(monkeypatch)
    with pytest.raises(ValueError, match=r"build_pair: unknown pipeline 'mlp'; known: \['layernorm_mlp', 'linear', "
                                         r"'linear_gelu_linear'\]"):
        build_pair("mlp", recipe=None, dtype=torch.float32, device=CPU)
    with pytest.raises(ValueError, match="build_pair: quantized_init=True needs a recipe"):
        build_pair("linear", recipe=None, dtype=torch.float32, device=CPU, quantized_init=True)
    with pytest.raises(KeyError, match=r"copy_values: parameter names differ: the module has \['bias', 'weight'\], "
                                       r"the values \['weight'\]"):
        copy_values(refops.ops.Linear(4, 4), {"weight": torch.zeros(4, 4)})


def test_bit_identical_share():
    a = torch.tensor([1.0, 2.0, float("nan"), -0.0])
    assert bit_identical_share(a, a.clone()) == 1.0
    assert bit_identical_share(a, torch.tensor([1.0, 2.5, float("nan"), 0.0])) == 0.5  # -0.0 is not 0.0
    assert bit_identical_share(None, a) is None
    with pytest.raises(ValueError, match=r"bit_identical_share: torch.float32\[4\] against torch.bfloat16\[4\]"):
        bit_identical_share(a, a.bfloat16())


# -------------------------------------------------------------------------- lifecycle
def test_lifecycle_cases_build_each_op_and_filter_for_quantized_init(monkeypatch):
    install_refops_as_te(monkeypatch)
    assert [c.op for c in lifecycle_cases()] == list(adapters.LIFECYCLE_OPS)
    weighted = lifecycle_cases(make_recipe("mxfp8"), quantized_init=True)
    assert [c.op for c in weighted] == list(adapters.WEIGHTED_OPS)
    nvfp4 = lifecycle_cases(make_recipe("nvfp4"), ops=("Linear",))[0]
    assert nvfp4.dtype is torch.bfloat16 and nvfp4.inputs(CPU)[0].dtype is torch.bfloat16
    grouped = lifecycle_cases(ops=("GroupedLinear",))[0]
    x, splits = grouped.inputs(CPU)
    assert x.shape == (256, 128) and splits.tolist() == [128, 128] and splits.dtype is torch.int64
    assert grouped.dtype is torch.float32
    # TE's quantized grouped GEMM takes BF16/FP16 only (cuBLAS refuses fp32 on the H100): bfloat16 under a recipe
    quantized_grouped = lifecycle_cases(make_recipe("fp8_current_scaling"), ops=("GroupedLinear", "Linear"))
    assert [c.dtype for c in quantized_grouped] == [torch.bfloat16, torch.float32]
    assert quantized_grouped[0].factory(CPU).weight0.dtype is torch.bfloat16
    assert quantized_grouped[0].inputs(CPU)[0].dtype is torch.bfloat16
    module = weighted[1].factory(torch.device("meta"))
    assert type(module).__name__ == "Linear" and module.weight.is_meta
    with pytest.raises(ValueError, match=r"lifecycle_cases: unknown ops \['Conv'\]"):
        lifecycle_cases(ops=("Conv",))
    with pytest.raises(ValueError, match="lifecycle_cases: quantized_init=True needs a recipe"):
        lifecycle_cases(quantized_init=True)


def test_lifecycle_case_forward_runs_inside_te_autocast_also_in_a_deep_copy(monkeypatch):
    rec = install_recording_te(monkeypatch)
    case = lifecycle_cases(Float8CurrentScaling(), ops=("Linear",))[0]
    module = case.factory(CPU)
    (x,) = case.inputs(CPU)
    module(x)
    assert [w for w, _, _ in rec.calls if w.startswith("autocast.")] == ["autocast.enter", "autocast.exit"]
    clone = copy.deepcopy(module)
    assert clone.forward.__self__ is clone, "the wrapped forward is rebound to the copy"
    clone(x)
    assert len(rec.of("autocast.enter")) == 2
    assert dict(module.named_parameters()).keys() == {"weight", "bias"}, "names are the op's own"


def test_refops_as_te_holds_the_lifecycle_contract(monkeypatch):
    install_refops_as_te(monkeypatch)
    case = lifecycle_cases(make_recipe("fp8_current_scaling"), quantized_init=True, ops=("Linear",))[0]
    report = check_lifecycle(case.factory, inputs=case.inputs, device=CPU, materializes_through_reset_parameters=True,
                             materializes_at_first_forward=True)
    report.assert_ok()
    assert report.subject == "Linear"


def test_the_reference_control_is_refops_own_op_and_needs_no_te(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformer_engine", None)
    case = lifecycle_cases(make_recipe("fp8_current_scaling"), quantized_init=True, ops=("Linear",), reference=True)[0]
    module = case.factory(CPU)
    assert isinstance(module, refops.ops.Linear) and isinstance(module.weight, refops.Float8Tensor)
    assert case.factory.__qualname__ == "refops.ops.Linear"

