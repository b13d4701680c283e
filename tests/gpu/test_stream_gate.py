"""The stream gate (synth/stream_gate.py) on a real GPU: a stream that waits at it goes on only once the other stream
has lowered it, and passes at once where it is down; and the engine's lane has one.

Skipped where there is no GPU (CI); run on the GPU machine: pytest tests/gpu/test_stream_gate.py"""
from __future__ import annotations

import time

import pytest
import torch

from talkgate.synth.stream_gate import StreamGate

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (not on this machine)")


def test_a_stream_waits_at_the_gate_while_another_holds_it_up():
    dev = torch.device("cuda")
    gate = StreamGate.on(dev)
    assert gate is not None
    side, main = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    x = torch.zeros(1, device=dev)
    x.add_(0)                   # its kernel loaded now: a lazy load while the stream is held would wait for it
    torch.cuda.synchronize()
    done = torch.cuda.Event()
    gate.up(side)
    side.synchronize()
    gate.wait(main)
    with torch.cuda.stream(main):
        x.add_(1)
        done.record()
    time.sleep(0.2)
    assert not done.query() and float(x.cpu()) == 0.0         # held
    gate.down(side)
    done.synchronize()
    assert float(x.cpu()) == 1.0
    gate.wait(main)                                             # down: passes at once
    with torch.cuda.stream(main):
        x.add_(1)
    main.synchronize()
    assert float(x.cpu()) == 2.0


def test_the_lane_of_a_gpu_runner_has_a_gate():
    from talkgate.synth.lane import Lane
    lane = Lane.on(torch.device("cuda"), None, [], [])
    assert lane.gate is not None and int(lane.gate.flag) == 0
