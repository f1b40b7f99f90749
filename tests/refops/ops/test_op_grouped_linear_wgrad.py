"""GroupedLinear weight-grad variants: delayed wgrad compute and accumulation into ``main_grad``."""

from __future__ import annotations

import pytest
import torch

from refops.testing.tolerances import dtype_tols, gemm_tols

from _grouped_linear_cases import IN, OUT, ROWS, bias_grad, close, make_op, reference, splits


@pytest.mark.parametrize("mode", ["discrete", "single"])
def test_delay_wgrad_compute(device, mode):
    torch.manual_seed(11)
    eager = make_op(device, mode=mode)
    torch.manual_seed(11)
    delayed = make_op(device, mode=mode, delay_wgrad_compute=True)
    calls = []
    delayed.register_wgrad_accumulation_and_reduce_hooks(lambda: calls.append(1))
    assert delayed.need_backward_dw() and not eager.need_backward_dw()
    weights = [p for n, p in delayed.named_parameters() if n.startswith("weight")]
    assert all(p.skip_backward_post_hook for p in weights)
    x, dy = torch.randn(ROWS, IN), torch.randn(ROWS, OUT)
    for step in (1, 2):
        for op in (eager, delayed):
            xi = x.clone().requires_grad_()
            op(xi, splits()).backward(dy)
        if step == 1:
            assert all(p.grad is None for p in weights)  # queued, not computed
        pairs = zip(eager.named_parameters(), delayed.named_parameters())
        assert all(torch.equal(p.grad, q.grad) for (name, p), (_, q) in pairs if name.startswith("bias"))
        delayed.backward_dw()
        for (_, p), (_, q) in zip(eager.named_parameters(), delayed.named_parameters()):
            assert torch.equal(p.grad, q.grad)  # step 2: both accumulated twice
        assert calls == [1] * step
    delayed.backward_dw()  # nothing queued: a no-op
    assert calls == [1, 1]


@pytest.mark.parametrize("variant", ["accumulate", "overwrite", "grad_added", "delayed"])
@pytest.mark.parametrize("mode", ["discrete", "single"])
def test_accumulate_into_main_grad(device, mode, variant):
    op = make_op(device, mode=mode, accumulate_into_main_grad=True, delay_wgrad_compute=variant == "delayed")
    weights = [p for n, p in op.named_parameters() if n.startswith("weight")]
    for w in weights:
        w.main_grad = torch.full(w.shape, 0.5)
        if variant == "overwrite":
            w.overwrite_main_grad = True
        if variant == "grad_added":
            w.grad_added_to_main_grad = False
    x, dy = torch.randn(ROWS, IN, requires_grad=True), torch.randn(ROWS, OUT)
    op(x, splits()).backward(dy)
    ref = reference(op, x, dy)
    if variant == "delayed":
        assert all(torch.equal(w.main_grad, torch.full(w.shape, 0.5)) for w in weights)
        op.backward_dw()
    main_grads = torch.cat([w.main_grad.reshape(-1, OUT, IN) for w in weights])
    offset = 0.0 if variant == "overwrite" else 0.5
    close(main_grads - offset, torch.stack(ref.dw), gemm_tols(torch.float32))
    for w in weights:
        if variant == "grad_added":
            assert w.grad_added_to_main_grad and torch.count_nonzero(w.grad) == 0
        else:
            assert w.grad is None
    close(bias_grad(op, 2), ref.db[2], dtype_tols(torch.float32))


def test_accumulate_into_main_grad_requires_main_grad(device):
    op = make_op(device, accumulate_into_main_grad=True)
    with pytest.raises(RuntimeError, match="main_grad"):
        op(torch.randn(ROWS, IN), splits())
