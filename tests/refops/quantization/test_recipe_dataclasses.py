"""Recipe dataclasses: TE's names, defaults, env overrides, predicates and validation."""

from __future__ import annotations

import dataclasses

import pytest

from refops import recipe as r

ALL_RECIPES = [r.DelayedScaling, r.Float8CurrentScaling, r.MXFP8BlockScaling, r.Float8BlockScaling, r.NVFP4BlockScaling]
ENV_VARS = [
    "NVTE_BACKWARD_OVERRIDE",
    "NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES",
    "NVTE_FP8_BLOCK_SCALING_FP32_SCALES",
    "NVTE_MXFP8_ENABLE_2D_QUANTIZATION",
    "NVTE_NVFP4_DISABLE_RHT",
    "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING",
    "NVTE_NVFP4_DISABLE_2D_QUANTIZATION",
    "NVTE_NVFP4_ROW_SCALED_ACTIVATION",
    "NVTE_NVFP4_4OVER6",
    "NVTE_NVFP4_4OVER6_E4M3_USE_256",
    "NVTE_NVFP4_4OVER6_ERR_MODE",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def test_format_maxima() -> None:
    assert (r.Format.E2M1.max_fwd, r.Format.E2M1.max_bwd) == (6, 6)
    assert (r.Format.E4M3.max_fwd, r.Format.E4M3.max_bwd) == (448, 448)
    assert (r.Format.E5M2.max_fwd, r.Format.E5M2.max_bwd) == (57344, 57344)
    assert (r.Format.HYBRID.value.max_fwd, r.Format.HYBRID.value.max_bwd) == (448, 57344)


def test_qparams_and_mmparams_are_frozen_with_te_defaults() -> None:
    q = r.QParams()
    assert (q.power_2_scale, q.amax_epsilon, q.random_hadamard_transform, q.stochastic_rounding,
            q.fp4_2d_quantization) == (False, 0.0, False, False, False)
    assert r.MMParams().use_split_accumulator is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.power_2_scale = True  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.MMParams().use_split_accumulator = False  # type: ignore[misc]


def test_delayed_scaling_defaults() -> None:
    d = r.DelayedScaling()
    assert (d.margin, d.fp8_format, d.amax_history_len, d.amax_compute_algo) == (0, r.Format.HYBRID, 1024, "max")
    assert (d.scaling_factor_compute_algo, d.reduce_amax, d.fp8_dpa, d.fp8_mha, d.backward_override) == (
        None, True, False, False, None)


def test_current_scaling_defaults_and_pow2_env(monkeypatch: pytest.MonkeyPatch) -> None:
    c = r.Float8CurrentScaling()
    assert c.fp8_format == r.Format.HYBRID and c.use_power_2_scales is False
    assert c.fp8_quant_fwd_inp == c.fp8_quant_fwd_weight == c.fp8_quant_bwd_grad == r.QParams()
    assert c.fp8_gemm_fprop.use_split_accumulator is False
    assert c.fp8_gemm_dgrad.use_split_accumulator and c.fp8_gemm_wgrad.use_split_accumulator
    monkeypatch.setenv("NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES", "1")
    c2 = r.Float8CurrentScaling()
    assert c2.use_power_2_scales is True and c2.fp8_quant_bwd_grad.power_2_scale is True


def test_mxfp8_defaults_and_2d_env(monkeypatch: pytest.MonkeyPatch) -> None:
    m = r.MXFP8BlockScaling()
    assert (m.margin, m.fp8_format, m.enable_2d_quantization) == (0, r.Format.E4M3, False)
    monkeypatch.setenv("NVTE_MXFP8_ENABLE_2D_QUANTIZATION", "1")
    assert r.MXFP8BlockScaling().enable_2d_quantization is True
    assert r.MXFP8BlockScaling(enable_2d_quantization=False).enable_2d_quantization is False


def test_float8_block_defaults_and_fp32_scales_env(monkeypatch: pytest.MonkeyPatch) -> None:
    b = r.Float8BlockScaling()
    assert (b.x_block_scaling_dim, b.w_block_scaling_dim, b.grad_block_scaling_dim) == (1, 2, 1)
    assert b.fp8_format == r.Format.E4M3 and b.fp8_quant_fwd_weight.power_2_scale is True
    monkeypatch.setenv("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "1")
    assert r.Float8BlockScaling().fp8_quant_fwd_inp.power_2_scale is False


def test_float8_block_use_f32_scales_of_the_instance_reaches_its_quantizers() -> None:
    """TE 2.20.2 derives the QParams from the env var at import, as class attributes, so the constructor's
    use_f32_scales is ignored there. refops derives them per instance, and each quantizer follows."""
    from refops.quantization.recipe_state import RecipeState

    for use_f32_scales in (True, False):
        b = r.Float8BlockScaling(use_f32_scales=use_f32_scales)
        assert {q.power_2_scale for q in (b.fp8_quant_fwd_inp, b.fp8_quant_fwd_weight, b.fp8_quant_bwd_grad)} == {
            not use_f32_scales}
        for mode, count in (("forward", 3), ("backward", 2)):
            quantizers = RecipeState.create(b, mode=mode, num_quantizers=count).make_quantizers()
            assert [q.force_pow_2_scales for q in quantizers] == [not use_f32_scales] * count
    assert r.Float8BlockScaling().fp8_quant_fwd_inp.power_2_scale is True  # the class default is untouched


def test_nvfp4_defaults_build_qparams() -> None:
    n = r.NVFP4BlockScaling()
    assert n.fp4_quant_fwd_inp == r.QParams(random_hadamard_transform=True)
    assert n.fp4_quant_fwd_weight == r.QParams(fp4_2d_quantization=True)
    assert n.fp4_quant_bwd_grad == r.QParams(random_hadamard_transform=True, stochastic_rounding=True)
    assert (n.nvfp4_4over6, n.nvfp4_4over6_e4m3_use_256, n.nvfp4_4over6_err_mode) == ("none", "all", "MAE")
    assert (n.fp4_format, n.fp8_format, n.row_scaled_activation) == (r.Format.E2M1, r.Format.E4M3, False)


def test_nvfp4_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NVTE_NVFP4_DISABLE_RHT", "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING",
                 "NVTE_NVFP4_DISABLE_2D_QUANTIZATION", "NVTE_NVFP4_ROW_SCALED_ACTIVATION"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("NVTE_NVFP4_4OVER6", "weights")
    monkeypatch.setenv("NVTE_NVFP4_4OVER6_ERR_MODE", "mse")
    n = r.NVFP4BlockScaling()
    assert n.disable_rht and n.disable_stochastic_rounding and n.disable_2d_quantization and n.row_scaled_activation
    assert n.fp4_quant_fwd_inp == n.fp4_quant_fwd_weight == n.fp4_quant_bwd_grad == r.QParams()
    assert (n.nvfp4_4over6, n.nvfp4_4over6_err_mode) == ("weights", "MSE")


@pytest.mark.parametrize(
    "kwargs, match",
    [({"nvfp4_4over6": "everything"}, "nvfp4_4over6"), ({"nvfp4_4over6_err_mode": "L1"}, "err_mode"),
     ({"nvfp4_4over6_e4m3_use_256": "some"}, "use_256"), ({"fp4_format": r.Format.E4M3}, "fp4_format")],
)
def test_nvfp4_rejects_bad_options(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        r.NVFP4BlockScaling(**kwargs)


@pytest.mark.parametrize("cls", [r.Float8CurrentScaling, r.MXFP8BlockScaling, r.Float8BlockScaling, r.NVFP4BlockScaling])
@pytest.mark.parametrize("value", [None, "high_precision", "dequantized"])
def test_backward_override_values_and_env(monkeypatch: pytest.MonkeyPatch, cls: type, value: str | None) -> None:
    assert cls(backward_override=value).backward_override == value
    if value is not None:
        monkeypatch.setenv("NVTE_BACKWARD_OVERRIDE", value)
        assert cls().backward_override == value


@pytest.mark.parametrize("cls", ALL_RECIPES)
def test_backward_override_invalid_is_a_clear_error(cls: type) -> None:
    with pytest.raises(ValueError, match="backward_override"):
        cls(backward_override="fp64")


def test_delayed_scaling_only_allows_no_backward_override(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="DelayedScaling only supports backward_override=None"):
        r.DelayedScaling(backward_override="dequantized")
    monkeypatch.setenv("NVTE_BACKWARD_OVERRIDE", "high_precision")
    with pytest.raises(ValueError, match="NVTE_BACKWARD_OVERRIDE"):
        r.DelayedScaling()


def test_delayed_scaling_validates_algo_and_history() -> None:
    assert r.DelayedScaling(amax_compute_algo="most_recent").amax_compute_algo == "most_recent"
    assert callable(r.DelayedScaling(amax_compute_algo=lambda h: h.max()).amax_compute_algo)
    with pytest.raises(ValueError, match="amax_compute_algo"):
        r.DelayedScaling(amax_compute_algo="mean")
    with pytest.raises(ValueError, match="amax_history_len"):
        r.DelayedScaling(amax_history_len=0)


@pytest.mark.parametrize("cls", [r.DelayedScaling, r.Float8CurrentScaling, r.MXFP8BlockScaling, r.Float8BlockScaling])
def test_pure_e5m2_training_is_rejected(cls: type) -> None:
    with pytest.raises(ValueError, match="E5M2"):
        cls(fp8_format=r.Format.E5M2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"x_block_scaling_dim": 2}, "2D x 2D"),  # w is 2D by default
        ({"w_block_scaling_dim": 1, "x_block_scaling_dim": 2, "grad_block_scaling_dim": 2}, "2D x 2D"),
        ({"w_block_scaling_dim": 3}, "w_block_scaling_dim"),
        ({"fp8_gemm_fprop": r.MMParams(use_split_accumulator=False)}, "split_accumulator"),
        ({"fp8_dpa": True}, "attention"),
    ],
)
def test_float8_block_scaling_rejects(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        r.Float8BlockScaling(**kwargs)


def test_predicates_on_classes_and_instances() -> None:
    table = [
        (r.DelayedScaling(), {"delayed", "float8_per_tensor_scaling"}),
        (r.Float8CurrentScaling(), {"float8_current_scaling", "float8_per_tensor_scaling"}),
        (r.MXFP8BlockScaling(), {"mxfp8"}),
        (r.Float8BlockScaling(), {"float8_block_scaling"}),
        (r.NVFP4BlockScaling(), {"nvfp4"}),
        (r.CustomRecipe(qfactory=lambda role: None), {"custom"}),
    ]
    names = ["delayed", "float8_current_scaling", "float8_per_tensor_scaling", "mxfp8", "float8_block_scaling",
             "nvfp4", "custom"]
    for recipe, expected in table:
        for name in names:
            assert getattr(recipe, name)() == (name in expected), (type(recipe).__name__, name)
            assert getattr(type(recipe), name)() == (name in expected)
    assert isinstance(r.DelayedScaling(), r.Recipe)


def test_custom_recipe_defaults_and_validation() -> None:
    c = r.CustomRecipe(qfactory=lambda role: None)
    assert (c.fp8_format, c.quantization_alignment, c.backward_override) == (r.Format.HYBRID, 128, None)
    with pytest.raises(ValueError, match="qfactory"):
        r.CustomRecipe(qfactory=3)


def test_recipes_are_mutable_dataclasses_like_te() -> None:
    d = r.DelayedScaling()
    d.margin = 2
    assert d.margin == 2
