"""Fast-path kernels run on torch's current stream, so they are ordered after the work queued before them."""

from __future__ import annotations

import torch

import refops
from refops.kernels import ReferenceKernels

#: GPU clock cycles of torch.cuda._sleep: tens of milliseconds, far longer than launching the kernels.
SLEEP_CYCLES = 50_000_000


def test_kernels_run_on_the_current_stream(fastpath_backend, cuda):
    """On a side stream, a sleep then a copy fill ``x``; the kernels queued after them on that stream
    must see the copied values. Had they run on another stream, they would read ``x`` still zero."""
    source = torch.randn(512, 256, device=cuda).to(torch.bfloat16)
    reference = ReferenceKernels()
    want_amax = reference.amax(source)
    want_gelu = reference.activation_forward(source, "gelu")
    side = torch.cuda.Stream(cuda)
    x = torch.zeros_like(source)
    torch.cuda.synchronize(cuda)
    with torch.cuda.stream(side), refops.use_backend(fastpath_backend):
        torch.cuda._sleep(SLEEP_CYCLES)
        x.copy_(source)
        amax = fastpath_backend.amax(x)
        gelu = fastpath_backend.activation_forward(x, "gelu")
    side.synchronize()
    assert torch.equal(amax, want_amax), f"amax {amax.item()} vs {want_amax.item()}: not ordered after the copy"
    assert torch.equal(gelu, want_gelu), "gelu read x before the copy on its stream finished"
