"""The lifecycle conformance check: exact verdicts on PyTorch, on refops, and on deliberately broken modules.

``torch.nn.Linear`` keeps every property PyTorch's conventions promise, and the
report says precisely where it legitimately differs from refops (it does not
materialize by itself, and ``to_empty`` replaces parameter objects). Every
param-owning refops op holds every property. Two broken modules show that the
check catches real bugs: one caches its parameters the way TransformerEngine's
fuser did before PR 3327 (issue 3322), one re-initializes differently from its
constructor (TE issue 2528).
"""

from __future__ import annotations

import copy
import math
import types

import pytest
import torch

import refops as te
from refops.quantization import DType, Float8CurrentScalingQuantizer, Float8Tensor, QuantizedTensor
from refops.ops.basic.basic_linear import BasicLinear
from refops.ops.basic.grouped_linear import GroupedLinear
from refops.ops.basic.layer_norm import LayerNorm
from refops.testing import LifecycleReport, Status, check_lifecycle
from refops.testing.lifecycle.check import PROPERTIES
from refops.testing.lifecycle.report import Kind

HELD, VIOLATED, KEPT, NOT_KEPT = Status.HELD, Status.VIOLATED, Status.KEPT, Status.NOT_KEPT
NOT_CHECKED, NOT_APPLICABLE = Status.NOT_CHECKED, Status.NOT_APPLICABLE
FORWARD_DEPENDENT = ["eager_values_after_first_forward", "no_stale_cache_after_replacement",
                     "checkpoint_round_trip_after_training"]
#: The properties of a conversion, not checked without convert=.
CONVERSION = ["requires_grad_kept_through_conversion", "aliases_kept_through_conversion", "identity_through_conversion"]


def _all_held() -> dict[str, Status]:
    """Every promise held and every extension kept; the conversion properties not checked (no convert= given)."""
    expected = {p: KEPT if prop.kind is Kind.EXTENSION else HELD for p, prop in PROPERTIES.items()}
    expected.update({p: NOT_CHECKED for p in CONVERSION})
    return expected


def _x(*shape, dtype=torch.float32):
    return lambda device: (torch.randn(*shape, device=device, dtype=dtype),)


def _statuses(report: LifecycleReport) -> dict[str, Status]:
    assert list(report.statuses) == list(PROPERTIES), "every property is reported, in order"
    return report.statuses


# ------------------------------------------------------------------ plain torch
NN_LINEAR = {
    "zero_allocation_on_meta": HELD,
    "materializable_from_meta": HELD,
    "eager_values_after_reset_parameters": NOT_APPLICABLE,
    "eager_values_after_to_empty": HELD,
    "eager_values_after_first_forward": NOT_KEPT,  # a refops extension: reported, not a violation
    "identity_through_materialization": NOT_APPLICABLE,
    "aliases_preserved": HELD,
    "requires_grad_kept": HELD,
    "no_stale_cache_after_replacement": HELD,
    "load_state_dict_assign_into_meta": HELD,
    "deepcopy_keeps_aliases_and_shares_nothing": HELD,
    "checkpoint_round_trip": HELD,
    "checkpoint_round_trip_after_training": HELD,
    **{p: NOT_CHECKED for p in CONVERSION},
}


def test_nn_linear_keeps_pytorch_conventions_and_the_report_says_where_it_differs(device):
    report = check_lifecycle(lambda d: torch.nn.Linear(16, 8, device=d), device=device, inputs=_x(4, 16))
    assert _statuses(report) == NN_LINEAR
    assert report.ok and report.violations == []
    report.assert_ok()
    assert "leaves every tensor of Linear on meta" in report["eager_values_after_reset_parameters"].evidence
    assert "to_empty replaced the objects of bias, weight" in report["eager_values_after_to_empty"].evidence
    first = report["eager_values_after_first_forward"].evidence
    assert "does not materialize through the first forward" in first and "RuntimeError" in first
    assert "to_empty() creates new parameter objects" in report["identity_through_materialization"].evidence
    assert "to_empty: weight, bias stayed frozen and received no grad" in report["requires_grad_kept"].evidence
    assert "not applicable on reset_parameters, first_forward" in report["requires_grad_kept"].evidence


def test_without_inputs_the_forward_dependent_properties_are_not_checked(device):
    report = check_lifecycle(lambda d: torch.nn.Linear(16, 8, device=d), device=device)
    expected = dict(NN_LINEAR)
    expected.update({name: NOT_CHECKED for name in FORWARD_DEPENDENT + ["identity_through_materialization"]})
    assert report.ok
    assert _statuses(report) == expected
    assert "needs inputs" in report["no_stale_cache_after_replacement"].evidence
    assert "first_forward not checked" in report["aliases_preserved"].evidence


def test_declaring_nn_linear_lazy_turns_its_differences_into_violations(device):
    report = check_lifecycle(lambda d: torch.nn.Linear(4, 3, device=d), device=device, inputs=_x(2, 4),
                             materializes_through_reset_parameters=True, materializes_at_first_forward=True)
    # identity_through_materialization is an extension: claiming to materialize does not make it a promise.
    assert [r.name for r in report.violations] == [
        "eager_values_after_reset_parameters",
        "eager_values_after_first_forward",
        "aliases_preserved",
        "requires_grad_kept",
    ]
    assert report["eager_values_after_first_forward"].kind is Kind.PROMISE  # claimed
    assert report["identity_through_materialization"].status is NOT_KEPT
    assert "left bias, weight on meta" in report["eager_values_after_reset_parameters"].evidence


def test_the_deprecated_lazy_keyword_is_both_claims(device):
    # Before the split, lazy=True said both; it still does, with a DeprecationWarning.
    with pytest.warns(DeprecationWarning, match="lazy= is deprecated"):
        old = check_lifecycle(lambda d: torch.nn.Linear(4, 3, device=d), device=device, inputs=_x(2, 4), lazy=True)
    new = check_lifecycle(lambda d: torch.nn.Linear(4, 3, device=d), device=device, inputs=_x(2, 4),
                          materializes_through_reset_parameters=True, materializes_at_first_forward=True)
    assert old.statuses == new.statuses


def test_a_module_without_parameters_is_not_applicable_everywhere(device):
    report = check_lifecycle(lambda d: torch.nn.GELU(), device=device, inputs=_x(2, 4))
    assert {p: s for p, s in _statuses(report).items() if p not in CONVERSION} == {
        p: NOT_APPLICABLE for p in PROPERTIES if p not in CONVERSION}
    assert report.ok
    assert report["zero_allocation_on_meta"].evidence == "the module has no parameters or buffers"


def test_tied_weights_coming_apart_under_to_empty_are_reported(device):
    class Tied(torch.nn.Module):
        def __init__(self, device):
            super().__init__()
            self.encoder = torch.nn.Linear(4, 4, bias=False, device=device)
            self.decoder = torch.nn.Linear(4, 4, bias=False, device=device)
            self.decoder.weight = self.encoder.weight

        def reset_parameters(self):
            self.encoder.reset_parameters()

        def forward(self, x):
            return self.decoder(self.encoder(x))

    report = check_lifecycle(Tied, device=device, inputs=_x(2, 4))
    assert report["aliases_preserved"].status is VIOLATED
    assert "to_empty: decoder.weight = encoder.weight came apart" in report["aliases_preserved"].evidence
    assert report["deepcopy_keeps_aliases_and_shares_nothing"].status is HELD


# ----------------------------------------------------------------------- refops
REFOPS_CASES = {
    "Linear": (lambda d, t: te.ops.Linear(16, 8, device=d, dtype=t), lambda t: _x(4, 16, dtype=t)),
    "BasicLinear": (lambda d, t: BasicLinear(16, 8, device=d, dtype=t), lambda t: _x(2, 3, 16, dtype=t)),
    "LayerNorm": (lambda d, t: LayerNorm(16, device=d, dtype=t), lambda t: _x(4, 16, dtype=t)),
    "GroupedLinear": (
        lambda d, t: GroupedLinear(4, 16, 8, device=d, dtype=t),
        lambda t: lambda device: (torch.randn(12, 16, device=device, dtype=t), torch.tensor([3, 0, 5, 4])),
    ),
    "Sequential": (
        lambda d, t: te.ops.Sequential(LayerNorm(16, device=d, dtype=t), te.ops.Linear(16, 8, device=d, dtype=t)),
        lambda t: _x(4, 16, dtype=t),
    ),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(REFOPS_CASES))
def test_refops_ops_hold_every_property(name, dtype, device):
    build, inputs = REFOPS_CASES[name]
    report = check_lifecycle(lambda d: build(d, dtype), device=device, inputs=inputs(dtype), seed=3, strict=True)
    assert report.subject == name
    assert _statuses(report) == _all_held(), str(report)
    report.assert_ok()


def test_refops_evidence_names_the_aliases_and_the_paths(device):
    report = check_lifecycle(lambda d: te.ops.Linear(4, 3, device=d), device=device, inputs=_x(2, 4))
    aliases = report["aliases_preserved"].evidence
    for path in ("reset_parameters", "to_empty", "first_forward"):
        assert f"{path}: kept (aliases basic_ops.0.weight = weight, basic_ops.1.bias = bias)" in aliases
    identity = report["identity_through_materialization"].evidence
    assert identity.count("2 parameter ids unchanged, the optimizer built before holds them") == 2
    assert "do not promise" not in identity  # refops' own op: no excuse is needed
    replaced = report["no_stale_cache_after_replacement"].evidence
    assert "setattr(weight, bias)" in replaced
    assert "register_parameter(basic_ops.0.weight, basic_ops.1.bias)" in replaced


def test_check_restores_the_callers_rng_state(device):
    torch.manual_seed(99)
    expected = torch.rand(3)
    torch.manual_seed(99)
    check_lifecycle(lambda d: BasicLinear(4, 3, device=d), device=device, inputs=_x(2, 4))
    assert torch.equal(torch.rand(3), expected)


def test_meta_is_not_a_target_device():
    with pytest.raises(ValueError, match="must be a real device"):
        check_lifecycle(lambda d: torch.nn.Linear(2, 2, device=d), device="meta")


# ---------------------------------------------------------------- broken modules
class _SnapshotLinearFunction(torch.autograd.Function):
    """Computes with the module's *current* parameters but returns grads for the snapshot it was given."""

    @staticmethod
    def forward(ctx, x, module, *snapshot):
        ctx.save_for_backward(x)
        ctx.module = module
        return x @ module.weight.t() + module.bias

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return dy @ ctx.module.weight, None, dy.t() @ x, dy.sum(0)


class SnapshotLinear(torch.nn.Module):
    """The seed's bug in miniature: parameters cached once, materialization makes new objects."""

    def __init__(self, in_features: int, out_features: int, device=None):
        super().__init__()
        device = torch.device(device if device is not None else "cpu")
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, device=device))
        self.bias = torch.nn.Parameter(torch.empty(out_features, device=device))
        if device.type != "meta":
            self.reset_parameters()
        self._snapshot = list(self.parameters())  # cached at construction, never refreshed

    def reset_parameters(self):
        device = torch.get_default_device() if self.weight.is_meta else self.weight.device
        weight = torch.empty(self.weight.shape, device=device)
        torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
        self.weight = torch.nn.Parameter(weight)  # a new object: requires_grad and identity are lost
        self.bias = torch.nn.Parameter(torch.zeros(self.bias.shape, device=device))

    def forward(self, x):
        if self.weight.is_meta:
            self.reset_parameters()
        return _SnapshotLinearFunction.apply(x, self, *self._snapshot)


def test_the_seeds_bug_is_reported_violated_with_evidence(device):
    report = check_lifecycle(lambda d: SnapshotLinear(4, 3, device=d), device=device, inputs=_x(2, 4))
    assert _statuses(report) == {
        "zero_allocation_on_meta": HELD,
        "eager_values_after_reset_parameters": HELD,
        "eager_values_after_to_empty": HELD,
        "eager_values_after_first_forward": NOT_KEPT,
        "identity_through_materialization": NOT_KEPT,
        "aliases_preserved": HELD,
        "requires_grad_kept": VIOLATED,
        "no_stale_cache_after_replacement": VIOLATED,
        "load_state_dict_assign_into_meta": VIOLATED,
        "deepcopy_keeps_aliases_and_shares_nothing": HELD,
        "checkpoint_round_trip": HELD,
        "checkpoint_round_trip_after_training": HELD,
        **{p: NOT_CHECKED for p in CONVERSION},
        "materializable_from_meta": HELD,
    }
    assert not report.ok
    assert "expected device meta but got" in report["eager_values_after_first_forward"].evidence
    identity = report["identity_through_materialization"].evidence
    assert identity.startswith("reset_parameters: replaced weight (id 0x")
    assert identity.endswith("(PyTorch and TE do not promise that materializing keeps parameter objects: build the "
                             "optimizer after materializing)")
    assert "the optimizer built before holds stale objects for bias, weight" in identity
    stale = report["no_stale_cache_after_replacement"].evidence
    assert "after setattr(weight) the new weight got no grad" in stale
    assert "after setattr(weight) the replaced weight (id 0x" in stale and "got a grad" in stale
    assert "requires_grad became True on weight, bias" in report["requires_grad_kept"].evidence
    with pytest.raises(AssertionError) as raised:
        report.assert_ok()
    message = str(raised.value)
    assert message.startswith(f"SnapshotLinear on {device} violates 3 lifecycle properties:")
    strict = check_lifecycle(lambda d: SnapshotLinear(4, 3, device=d), device=device, inputs=_x(2, 4), strict=True)
    assert [r.name for r in strict.violations] == [
        "eager_values_after_first_forward", "identity_through_materialization", "requires_grad_kept",
        "no_stale_cache_after_replacement", "load_state_dict_assign_into_meta"]
    for result in report.violations:
        assert f"  - {result.name}: {result.evidence}" in message


class ResetDrifts(torch.nn.Module):
    """Constructs its weight at 1 but re-initializes it randomly (TE issue 2528's bug)."""

    def __init__(self, features: int, device=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(features, device=device))
        if self.weight.device.type != "meta":
            torch.nn.init.ones_(self.weight)

    def reset_parameters(self):
        torch.nn.init.normal_(self.weight)

    def forward(self, x):
        return x * self.weight


def test_reset_parameters_that_differs_from_eager_construction_is_a_violation(device):
    report = check_lifecycle(lambda d: ResetDrifts(8, device=d), device=device, inputs=_x(2, 8))
    assert [r.name for r in report.violations] == ["eager_values_after_to_empty"]
    evidence = report["eager_values_after_to_empty"].evidence
    assert evidence.startswith("after to_empty: weight differs (max |diff| ")
    assert report["eager_values_after_reset_parameters"].status is NOT_APPLICABLE
    with pytest.raises(AssertionError) as raised:
        report.assert_ok()
    assert str(raised.value).splitlines() == [
        f"ResetDrifts on {device} violates 1 lifecycle property:",
        f"  - eager_values_after_to_empty: {evidence}",
    ]


def test_report_renders_as_a_table_that_leads_with_the_violations(device):
    report = check_lifecycle(lambda d: ResetDrifts(8, device=d), device=device, inputs=_x(2, 8))
    lines = str(report).splitlines()
    assert lines[0] == (f"lifecycle conformance of ResetDrifts on {device}: VIOLATED (1 of {len(PROPERTIES)} "
                        "properties): 1 violated, 1 not kept, 9 held, 3 not checked, 2 not applicable")
    assert lines[1].split() == ["property", "status", "evidence"]
    assert set(lines[2].replace(" ", "")) == {"-"}
    rows = lines[3:]
    assert len(rows) == len(PROPERTIES)
    order = [VIOLATED, NOT_KEPT, HELD, KEPT, NOT_CHECKED, NOT_APPLICABLE]
    expected = sorted(report, key=lambda r: order.index(r.status))  # stable: property order within a status
    assert expected[0].name == "eager_values_after_to_empty"  # the violation first
    status_column = lines[1].index("status")
    for row, result in zip(rows, expected):
        assert row.startswith(result.name)
        assert row[status_column:].startswith(result.verdict)
        assert result.verdict.endswith("(refops extension)") == (result.kind is Kind.EXTENSION)
        assert row.rstrip().endswith(result.evidence)


# ------------------------------------------------------- ties and composites
class TiedPair(torch.nn.Module):
    """Two refops Linears sharing one weight, re-tied in its own reset_parameters() (a tied-embedding model)."""

    def __init__(self, device=None):
        super().__init__()
        self.fc1 = te.ops.Linear(8, 8, device=device)
        self.fc2 = te.ops.Linear(8, 8, device=device)
        self.fc2.weight = self.fc1.weight

    def forward(self, x):
        return self.fc2(self.fc1(x))


class StaleTiedPair(torch.nn.Module):
    """Tied torch Linears whose forward uses a parameter list cached at construction (the seed's bug)."""

    def __init__(self, device=None):
        super().__init__()
        self.a = torch.nn.Linear(4, 4, device=device)
        self.b = torch.nn.Linear(4, 4, device=device)
        self.b.weight = self.a.weight
        self._cached = [self.a.weight, self.a.bias, self.b.bias]

    def forward(self, x):
        w, a_bias, b_bias = self._cached
        return torch.nn.functional.linear(torch.nn.functional.linear(x, w, a_bias), w, b_bias)


def test_replacing_a_tied_weight_is_no_violation_and_the_report_says_it_retied(device):
    report = check_lifecycle(TiedPair, device=device, inputs=_x(3, 8))
    stale = report["no_stale_cache_after_replacement"]
    assert stale.status is HELD  # before: "the replaced fc1.weight got a grad" (fc2 still held it), a false alarm
    assert "re-tied fc2.weight after setattr" in stale.evidence
    assert "re-tied fc1.weight after register_parameter" in stale.evidence
    assert report["aliases_preserved"].status is HELD
    assert "fc1.basic_ops.0.weight = fc1.weight = fc2.basic_ops.0.weight = fc2.weight" in report["aliases_preserved"].evidence


def test_a_stale_cache_in_a_tied_module_is_still_caught(device):
    report = check_lifecycle(StaleTiedPair, device=device, inputs=_x(3, 4))
    stale = report["no_stale_cache_after_replacement"]
    assert stale.status is VIOLATED
    assert "after setattr(a.weight) the new a.weight got no grad" in stale.evidence
    assert "the replaced a.weight (id 0x" in stale.evidence


class Composite(torch.nn.Module):
    """A plain torch module of refops ops, with no reset_parameters() of its own."""

    def __init__(self, device=None):
        super().__init__()
        self.norm = LayerNorm(8, device=device)
        self.fc1 = te.ops.Linear(8, 16, device=device)
        self.fc2 = te.ops.Linear(16, 8, device=device)

    def forward(self, x):
        return self.fc2(self.fc1(self.norm(x)))


def test_a_composite_module_is_checked_through_its_children(device):
    report = check_lifecycle(Composite, device=device, inputs=_x(3, 8), strict=True)
    assert _statuses(report) == _all_held()  # before: reset_parameters paths "not applicable"
    assert "tensors bit-identical to eager construction" in report["eager_values_after_reset_parameters"].evidence
    assert "reset_parameters: 6 parameter ids unchanged" in report["identity_through_materialization"].evidence


def test_a_composite_with_tied_children_says_why_it_cannot_be_reset_through_them(device):
    report = check_lifecycle(TiedPair, device=device, inputs=_x(3, 8))
    evidence = report["eager_values_after_reset_parameters"].evidence
    assert report["eager_values_after_reset_parameters"].status is NOT_APPLICABLE
    assert "its children share parameters (tied weights)" in evidence and "define reset_parameters() on TiedPair" in evidence


def test_a_mixed_composite_is_not_expected_to_materialize_by_itself(device):
    def mixed(d):
        return torch.nn.Sequential(te.ops.Linear(8, 8, device=d), torch.nn.Linear(8, 8, device=d))

    report = check_lifecycle(mixed, device=device, inputs=_x(3, 8))
    report.assert_ok()
    assert report["eager_values_after_to_empty"].status is HELD
    assert "leaves 1.bias, 1.weight of Sequential on meta" in report["eager_values_after_reset_parameters"].evidence


# ------------------------------------------------------------ quantized weights keep their kind
def _quantized(build, recipe_name="mxfp8"):
    from refops.testing import make_recipe

    def factory(d):
        with te.quantized_model_init(enabled=True, recipe=make_recipe(recipe_name)):
            return build(d)

    return factory


class DequantizesOnMaterialization(BasicLinear):
    """The planted bug: materializing from meta dequantizes the quantized weight, in place (the same object).
    The values are the eager module's bit for bit; only the kind of tensor differs."""

    def _place_parameter_value(self, name, value):
        if self._parameters[name].is_meta and isinstance(value, QuantizedTensor):
            value = value.dequantize()
        super()._place_parameter_value(name, value)


def test_a_quantized_weight_dequantized_in_place_at_materialization_is_a_violation(device):
    report = check_lifecycle(_quantized(lambda d: DequantizesOnMaterialization(64, 32, device=d)), device=device,
                             inputs=_x(32, 64))
    # Before: every property held (the values, the object, the grads are all the eager module's).
    assert [r.name for r in report.violations] == ["eager_values_after_reset_parameters"]
    assert [r.name for r in report.extensions_not_kept] == ["eager_values_after_first_forward"]
    evidence = report["eager_values_after_reset_parameters"].evidence
    assert evidence.startswith("after reset_parameters: weight is a plain float32 tensor, expected MXFP8Tensor (")
    assert "_rowwise_data" in evidence and "_columnwise_scale_inv" in evidence


class DequantizesOnLoad(BasicLinear):
    """Dequantizes its weight, in place, after loading a checkpoint."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_load_state_dict_post_hook(lambda module, keys: module._dequantize_weight())

    def _dequantize_weight(self):
        if isinstance(self.weight, QuantizedTensor):
            self._place_parameter_value("weight", self.weight.dequantize())


def test_a_quantized_weight_must_keep_its_kind_across_the_lifecycle_steps(device):
    report = check_lifecycle(_quantized(lambda d: DequantizesOnLoad(32, 16, device=d), "fp8_current_scaling"),
                             device=device, inputs=_x(16, 32))
    # The next step after training computes with the dequantized values, which are the quantized weight's: it is
    # the same step, so only the comparisons of kind catch this one.
    assert [r.name for r in report.violations] == ["load_state_dict_assign_into_meta", "checkpoint_round_trip"]
    expected = "tensor weight is a plain float32 tensor, expected Float8Tensor (_data, _transpose, _scale_inv)"
    assert expected in report["load_state_dict_assign_into_meta"].evidence
    assert expected in report["checkpoint_round_trip"].evidence


@pytest.mark.parametrize("recipe_name", ["fp8_delayed_scaling", "mxfp8", "fp8_block_scaling", "nvfp4"])
def test_refops_quantized_weights_hold_every_property(recipe_name, device):
    report = check_lifecycle(_quantized(lambda d: te.ops.Linear(64, 32, device=d), recipe_name), device=device,
                             inputs=_x(32, 64), strict=True)
    assert _statuses(report) == _all_held(), str(report)


# ------------------------------------------------------------ false positives found on TransformerEngine
class EmptyStorageFloat8Tensor(Float8Tensor):
    """What TE's quantized tensors do: the wrapper reports an empty storage (data pointer 0); the bytes are
    in its inner tensors."""

    def untyped_storage(self):
        return torch.UntypedStorage(0, device=self.device)


class TELikeQuantizedLinear(torch.nn.Module):
    """An FP8 weight held as an EmptyStorageFloat8Tensor; ``share_on_copy`` plants a deepcopy that shares
    the FP8 bytes with the original."""

    share_on_copy = False

    def __init__(self, device=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(8, 16, device=device))
        if not self.weight.is_meta:
            self.reset_parameters()

    def reset_parameters(self):
        device = torch.get_default_device() if self.weight.is_meta else self.weight.device
        values = torch.nn.init.normal_(torch.empty(8, 16, device=device))
        q = Float8CurrentScalingQuantizer(DType.kFloat8E4M3)(values)
        weight = EmptyStorageFloat8Tensor(q.shape, q.dtype, **q.get_metadata())
        torch.utils.swap_tensors(self.weight, torch.nn.Parameter(weight, requires_grad=self.weight.requires_grad))

    def forward(self, x):
        return x @ self.weight.dequantize().t()

    def __deepcopy__(self, memo):
        cls = type(self)
        clone = cls.__new__(cls)
        memo[id(self)] = clone
        for key, value in self.__dict__.items():
            clone.__dict__[key] = copy.deepcopy(value, memo)
        if self.share_on_copy:
            clone.weight._data = self.weight._data
        return clone


class SharingTELikeQuantizedLinear(TELikeQuantizedLinear):
    share_on_copy = True


def test_a_deepcopied_quantized_weight_with_an_empty_wrapper_storage_shares_nothing(device):
    report = check_lifecycle(TELikeQuantizedLinear, device=device, inputs=_x(4, 16))
    # Before: "the copy shares the storage of weight": both wrappers report data pointer 0.
    result = report["deepcopy_keeps_aliases_and_shares_nothing"]
    assert result.status is HELD, result.evidence
    shared = check_lifecycle(SharingTELikeQuantizedLinear, device=device, inputs=_x(4, 16))
    assert "the copy shares the storage of weight" in shared["deepcopy_keeps_aliases_and_shares_nothing"].evidence


def test_recipe_state_a_meta_build_holds_is_found_and_named(device):
    from refops.testing.lifecycle.materialization import held_state

    with te.quantized_model_init(enabled=True, recipe=te.recipe.DelayedScaling()):
        module = te.ops.Sequential(te.ops.Linear(16, 8, device="meta"))
    state = held_state(module, device)
    assert sorted(state) == [f"0.basic_ops.0._recipe_states['{mode}'].{name}"
                             for mode in ("backward", "forward") for name in ("amax_history", "scale")]
    assert all(p.is_meta for p in module.parameters())


def test_bytes_a_meta_build_allocates_for_recipe_state_are_no_violation_and_others_are(monkeypatch):
    """On a GPU the allocator counts what construction allocates; here a counter stands in for it."""
    from refops.testing.lifecycle import materialization
    from refops.testing.lifecycle.probe import Subject

    def factory(d):
        with te.quantized_model_init(enabled=True, recipe=te.recipe.DelayedScaling()):
            return te.ops.Linear(16, 8, device=d)

    # The recipe state of one Linear: forward amax history (1024, 2) and scale (2,), backward (1024, 1) and (1,).
    state_bytes = 8192 + 512 + 4096 + 512
    counter = iter([0, state_bytes, 0, state_bytes + 4096])
    monkeypatch.setattr(materialization, "MEASURED_DEVICE_TYPES", ("cpu",))
    monkeypatch.setattr(materialization, "_bytes_ever_allocated", lambda device: next(counter))
    subject = Subject(factory, torch.device("cpu"), None, 0)
    evidence = materialization.zero_allocation_on_meta(subject)
    assert f"the {state_bytes} bytes allocated on cpu meanwhile are state held outside parameters and buffers (" \
        in evidence and "_recipe_states['forward'].amax_history (1024, 2)" in evidence
    with pytest.raises(materialization.Violation, match=rf"construction allocated {state_bytes + 4096} bytes on cpu, "
                                                         rf"of which {state_bytes} are held outside parameters"):
        materialization.zero_allocation_on_meta(subject)


def test_a_quantized_op_built_on_meta_holds_zero_allocation_on_the_device(device):
    """On CUDA the allocator is measured: a delayed-scaling op's recipe state is named, not a violation."""
    report = check_lifecycle(_quantized(lambda d: te.ops.Linear(64, 32, device=d), "fp8_delayed_scaling"),
                             device=device)
    result = report["zero_allocation_on_meta"]
    assert result.status is HELD, result.evidence
    if device.type == "cuda":
        assert "state held outside parameters and buffers" in result.evidence


def test_a_stale_transposed_copy_is_cache_not_quantization_state():
    """TE's Float8Tensor marks its transposed copy stale after an in-place update (transpose_invalid=True)
    and rebuilds it when needed: two weights that differ only there hold the same quantization state."""
    from refops.testing.lifecycle.evidence import quantization_differences

    class TELikeFloat8Tensor(Float8Tensor):
        def __tensor_flatten__(self):
            names, context = super().__tensor_flatten__()
            return names, {"nontensor_kwargs": {**context, "transpose_invalid": self.__dict__.get("stale", False)}}

    def weight(stale_transpose: bool):
        q = Float8CurrentScalingQuantizer(DType.kFloat8E4M3)(torch.linspace(-1, 1, 32).reshape(4, 8))
        t = TELikeFloat8Tensor(q.shape, q.dtype, **q.get_metadata())
        if stale_transpose:
            t._transpose = torch.zeros_like(t._transpose)  # old bytes
            t.stale = True
        return t

    assert quantization_differences(weight(True), weight(False)) == []
    fresh_but_wrong = weight(False)
    fresh_but_wrong._transpose = torch.zeros_like(fresh_but_wrong._transpose)
    assert quantization_differences(fresh_but_wrong, weight(False)) == ["_transpose differs in 32 bytes"]


# ------------------------------------------------------------ state that moves between steps
def _under_autocast(build, recipe):
    """``build(d)``, every forward inside ``te.autocast(recipe=recipe)`` (how the conformance CLI runs an op)."""

    def factory(d):
        module = build(d)
        forward = type(module).forward

        def forward_under_autocast(self, *args, **kwargs):
            with te.autocast(enabled=True, recipe=recipe):
                return forward(self, *args, **kwargs)

        module.forward = types.MethodType(forward_under_autocast, module)
        return module

    return factory


@pytest.mark.parametrize("quantized", [False, True], ids=["high_precision", "quantized_init"])
def test_delayed_scaling_moving_the_scales_between_steps_is_no_stale_cache(quantized, device):
    """The amax history moves the scales between two steps, so the grads after a replacement differ from the
    grads before for a correct implementation too; an untouched twin run for the same steps is the control."""
    build = lambda d: te.ops.Linear(64, 32, device=d)  # noqa: E731
    if quantized:
        build = _quantized(build, "fp8_delayed_scaling")
    report = check_lifecycle(_under_autocast(build, te.recipe.DelayedScaling()), device=device, inputs=_x(32, 64))
    stale = report["no_stale_cache_after_replacement"]
    # Before: "after setattr(weight) the grad of weight changed (max |diff| 1.73)", on refops' own Linear.
    assert stale.status is HELD, stale.evidence
    assert "equal to an untouched twin's at the same step" in stale.evidence


def test_a_fuser_that_keeps_its_first_parameters_is_caught_under_delayed_scaling(monkeypatch, device):
    """The planted bug: a Sequential's fuser caches the parameter objects of its first forward and never refreshes
    them (TE before PR 3327): after a replacement it returns grads for the old objects."""
    from refops.ops.fuser import OperationFuser

    refresh = OperationFuser._refresh_parameter_cache

    def refresh_once(self):
        return refresh(self) if self._param_signature is None else False

    monkeypatch.setattr(OperationFuser, "_refresh_parameter_cache", refresh_once)
    factory = _under_autocast(lambda d: te.ops.Sequential(te.ops.Linear(64, 32, device=d)), te.recipe.DelayedScaling())
    report = check_lifecycle(factory, device=device, inputs=_x(32, 64))
    stale = report["no_stale_cache_after_replacement"]
    assert stale.status is VIOLATED
    assert "after setattr(0.weight) the new 0.weight got no grad" in stale.evidence
    assert "after setattr(0.weight) the replaced 0.weight (id 0x" in stale.evidence
