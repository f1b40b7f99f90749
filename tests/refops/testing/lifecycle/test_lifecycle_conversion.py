"""check_lifecycle's conversion step (issue #40, item 5 (c)): ``convert=`` must keep freezing, aliases and grads.

The red team's bug: a conversion that re-wraps a frozen weight in a new, trainable Parameter (as a
swap of ``nn.Linear`` for another module can). Each planted conversion stands beside a correct one.
"""

from __future__ import annotations

import torch

import refops as te
from refops.testing import Status, check_lifecycle

HELD, VIOLATED, KEPT, NOT_KEPT = Status.HELD, Status.VIOLATED, Status.KEPT, Status.NOT_KEPT
CONVERSION = ["requires_grad_kept_through_conversion", "aliases_kept_through_conversion", "identity_through_conversion"]


def _x(*shape):
    return lambda device: (torch.randn(*shape, device=device),)


# ------------------------------------------------------------------ conversions
def swap_linears(module: torch.nn.Module, rewrap: str = "") -> torch.nn.Module:
    """Swap every ``torch.nn.Linear`` for a refops ``te.ops.Linear`` holding the same parameter objects, as
    torchao's ``Float8Linear.from_float`` keeps them. ``rewrap`` plants a conversion that wraps each weight in a
    new Parameter: ``"trainable"`` (bug (c): a frozen weight comes back trainable) or ``"keeping_requires_grad"``."""
    for name, child in list(module.named_children()):
        if not isinstance(child, torch.nn.Linear):
            swap_linears(child, rewrap)
            continue
        new = te.ops.Linear(child.in_features, child.out_features, bias=child.bias is not None, device="meta",
                            dtype=child.weight.dtype)
        weight = child.weight
        if rewrap:
            keep = weight.requires_grad if rewrap == "keeping_requires_grad" else True
            weight = torch.nn.Parameter(weight.detach(), requires_grad=keep)
        new.weight = weight
        if child.bias is not None:
            new.bias = child.bias
        setattr(module, name, new)
    return module


def torch_mlp(device):
    return torch.nn.Sequential(torch.nn.Linear(16, 32, device=device), torch.nn.ReLU(),
                               torch.nn.Linear(32, 8, device=device))


def test_a_conversion_that_keeps_the_parameters_holds_every_conversion_property(device):
    report = check_lifecycle(torch_mlp, device=device, inputs=_x(4, 16), convert=swap_linears, strict=True)
    # The converted module is refops': even the extension (identity) is kept.
    assert {p: report[p].status for p in CONVERSION} == {
        "requires_grad_kept_through_conversion": HELD, "aliases_kept_through_conversion": HELD,
        "identity_through_conversion": KEPT}
    assert report["requires_grad_kept_through_conversion"].evidence == (
        "0.weight, 0.bias stayed frozen through the conversion and received no grad; backward put grads on the "
        "converted module's 2 trainable parameters")


def test_a_conversion_that_rewraps_a_frozen_weight_as_trainable_is_caught(device):
    report = check_lifecycle(torch_mlp, device=device, inputs=_x(4, 16),
                             convert=lambda module: swap_linears(module, rewrap="trainable"))
    # Before: there was no conversion step, so nothing could see it.
    result = report["requires_grad_kept_through_conversion"]
    assert result.status is VIOLATED and not report.ok
    assert result.evidence.startswith("requires_grad became True on 0.weight (frozen before the conversion)")
    assert "frozen 0.weight received a grad" in result.evidence
    assert report["identity_through_conversion"].status is NOT_KEPT
    assert "the conversion replaced 0.weight (id 0x" in report["identity_through_conversion"].evidence


def test_a_conversion_that_rewraps_but_keeps_requires_grad_only_loses_the_extension(device):
    report = check_lifecycle(torch_mlp, device=device, inputs=_x(4, 16),
                             convert=lambda module: swap_linears(module, rewrap="keeping_requires_grad"))
    report.assert_ok()
    assert report["requires_grad_kept_through_conversion"].status is HELD
    assert report["identity_through_conversion"].status is NOT_KEPT


class _Computes(torch.nn.Module):
    """Reports the original parameters but computes with copies: grads never reach the parameters."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self._copies = [p.detach().clone().requires_grad_(p.requires_grad) for p in inner.parameters()]

    def forward(self, x):
        w0, b0, w1, b1 = self._copies
        return torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, w0, b0)), w1, b1)


def test_a_converted_module_whose_grads_do_not_reach_its_parameters_is_caught(device):
    report = check_lifecycle(torch_mlp, device=device, inputs=_x(4, 16),
                             convert=lambda module: _renamed(_Computes(module)))
    result = report["requires_grad_kept_through_conversion"]
    assert result.status is VIOLATED
    assert result.evidence.endswith("trainable 2.bias, 2.weight of the converted module received no grad")


def _renamed(wrapper: _Computes) -> torch.nn.Module:
    """The wrapper with the inner module's names (a conversion keeps names)."""
    for name, child in list(wrapper.inner.named_children()):
        wrapper.add_module(name, child)
    del wrapper._modules["inner"]
    return wrapper


class TiedPair(torch.nn.Module):
    def __init__(self, device=None):
        super().__init__()
        self.encoder = torch.nn.Linear(8, 8, bias=False, device=device)
        self.decoder = torch.nn.Linear(8, 8, bias=False, device=device)
        self.decoder.weight = self.encoder.weight

    def reset_parameters(self):
        self.encoder.reset_parameters()

    def forward(self, x):
        return self.decoder(self.encoder(x))


def test_a_conversion_that_unties_weights_is_caught(device):
    def untie(module):
        module.decoder.weight = torch.nn.Parameter(module.decoder.weight.detach().clone())
        return module

    report = check_lifecycle(TiedPair, device=device, inputs=_x(2, 8), convert=untie)
    assert report["aliases_kept_through_conversion"].evidence == "decoder.weight = encoder.weight came apart"
    assert report["aliases_kept_through_conversion"].status is VIOLATED
    kept = check_lifecycle(TiedPair, device=device, inputs=_x(2, 8), convert=swap_linears)
    assert kept["aliases_kept_through_conversion"].status is HELD, kept["aliases_kept_through_conversion"]


def test_a_conversion_in_place_may_return_none(device):
    report = check_lifecycle(torch_mlp, device=device, inputs=_x(4, 16), convert=lambda module: None)
    assert report["identity_through_conversion"].status is KEPT
    assert report["requires_grad_kept_through_conversion"].status is HELD
