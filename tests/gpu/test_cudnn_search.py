"""cudnn_heuristics (synth/voice.py) against PyTorch's cache of cuDNN plans: a convolution first run under the
heuristics must not stand in for the search of its shape later (the warm-up runs the largest batch's decode under the
heuristics first, then captures its graph after the search). A search runs cuDNN's candidate kernels, so it shows as
many kernels in the profile of the call that makes it; a cached plan runs a few (the convolution, cuDNN's layout
conversions around it and its workspace's initialization: at most PLAN_KERNELS)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from talkgate.synth.voice import cudnn_heuristics

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (not on this machine)")
PLAN_KERNELS = 6


def kernels_of(fn) -> int:
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def conv(channels: int):
    # a residual unit's dilated convolution of the decoder (kernel 7, dilation 9), at a shape no other test meets
    x = torch.randn(48, channels, 160 + 54, device="cuda", dtype=torch.float16)
    w = torch.randn(channels, channels, 7, device="cuda", dtype=torch.float16) / 50
    return lambda: F.conv1d(x, w, dilation=9)


def test_a_shape_met_under_the_heuristics_is_searched_later():
    cudnn = torch.backends.cudnn
    saved = cudnn.benchmark, cudnn.deterministic
    try:
        cudnn.benchmark, cudnn.deterministic = True, False
        f = conv(328)
        with cudnn_heuristics():
            assert (cudnn.benchmark, cudnn.deterministic) == (False, True)
            assert kernels_of(f) <= PLAN_KERNELS            # the heuristics' plan, no search
        assert (cudnn.benchmark, cudnn.deterministic) == (True, False)
        searched = kernels_of(f)
        assert searched > 2 * PLAN_KERNELS, f"the first call with the search on ran {searched} kernels: no search"
        assert kernels_of(f) <= PLAN_KERNELS                # the searched plan, cached
    finally:
        cudnn.benchmark, cudnn.deterministic = saved


def test_without_the_key_apart_the_heuristics_plan_would_stay():
    """What the deterministic flag keeps apart (PyTorch's behavior, which the test above relies on being needed)."""
    cudnn = torch.backends.cudnn
    saved = cudnn.benchmark, cudnn.deterministic
    try:
        cudnn.deterministic = False
        f = conv(344)
        cudnn.benchmark = False
        kernels_of(f)
        cudnn.benchmark = True
        assert kernels_of(f) <= PLAN_KERNELS
    finally:
        cudnn.benchmark, cudnn.deterministic = saved
