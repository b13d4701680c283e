"""bench/cudnn_fusion.py: today's way of a decoder block's three residual units (its Triton kernels in the
interpreter here) computes what plain PyTorch does, carried frames and the next unit's SnakeBeta in place included
and the engine's own residual units given the block's weights compute today's x (the tool checks its cuDNN ways
against today's on a GPU)."""
import pytest
import torch

pytest.importorskip("triton", reason="triton is part of the test extra (and of torch on CUDA)")

from bench.cudnn_fusion import Block, EngineUnits, error, outputs, reference, today  # noqa: E402


@pytest.mark.parametrize("C, n", [(16, 18), (8, 36)])
def test_today_computes_what_pytorch_does(C, n):
    blk = Block(2, C, n, torch.float32, torch.device("cpu"))
    today(blk)
    got = outputs(blk)
    assert not torch.equal(blk.out, torch.zeros_like(blk.out))
    blk.reset()
    reference(blk)
    assert error(got, outputs(blk)) < 1e-5


def test_the_engine_units_compute_todays_x():
    blk = Block(2, 8, 18, torch.float32, torch.device("cpu"))
    today(blk)
    want = outputs(blk)
    units = EngineUnits(blk, compiled=False)
    units.run()
    assert not torch.equal(units.result, blk.x0)
    assert error([units.result], want) < 1e-5
