"""bench/decoder_convs.py: its three ways of a residual unit's convolution compute the same thing (on the CPU here;
the tool times them on a GPU)."""
import pytest
import torch

from bench.decoder_convs import ways


@pytest.mark.parametrize("B, C, n, d", [(2, 16, 8, 1), (3, 8, 20, 3), (2, 8, 5, 9)])
def test_the_three_ways_agree(B, C, n, d):
    torch.manual_seed(0)
    f = ways(B, C, n, d, torch.float32, torch.device("cpu"))
    ref = f["ncl"]()
    assert ref.shape == (B, C, n)
    torch.testing.assert_close(f["nlc"]()[:, :, 0], ref)
    torch.testing.assert_close(f["gemm"]().view(B, n, C).transpose(1, 2), ref, rtol=1e-5, atol=1e-5)
