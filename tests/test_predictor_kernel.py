"""The code predictor's persistent kernel (synth/predictor_kernel.py) gives what its per-step PyTorch path
(CodePredictor.predict) gives: the 15 codes of greedy and of seeded rows with the sub-talker's top-k /
top-p / temperature, and the embedding sum, with and without small_to_mtp_projection.

On a CPU machine the kernel runs in Triton's interpreter (one program runs every phase); on a GPU it runs
compiled with one program per SM and its grid barriers, against the per-step path on the same device."""
from __future__ import annotations

import importlib

import pytest
import torch

from talkgate.synth.api import SamplingParams
from talkgate.synth.config import DecoderDims, GenerationConfig, PredictorConfig
from talkgate.synth.model import CodePredictor, fuse_projections
from talkgate.synth.sampling import FrameSampler, RowSampling

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


@pytest.fixture(scope="module")
def kernel():
    pytest.importorskip("triton", reason="triton is part of the test extra (and of torch on CUDA)")
    return importlib.import_module("talkgate.synth.predictor_kernel")


def predictor(talker_hidden: int, seed: int = 0, dtype=torch.float32) -> CodePredictor:
    dims = DecoderDims(hidden_size=32, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
                       head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0)
    torch.manual_seed(seed)
    model = CodePredictor(PredictorConfig(dims=dims, vocab_size=2048, num_code_groups=16), talker_hidden)
    for name, p in model.named_parameters():
        if "norm" in name:
            p.data = 1.0 + 0.2 * torch.randn(p.shape)
    model = model.to(DEVICE, dtype).eval().requires_grad_(False)
    fuse_projections(model)
    model.setup(DEVICE)
    return model


def sampler(B: int, top_k: int, top_p: float, temperature: float) -> FrameSampler:
    """Row 0 seeded with the given sub-talker parameters, row 1 greedy."""
    rows = RowSampling.build([SamplingParams(seed=7), SamplingParams(greedy=True)][:B], GenerationConfig.parse({}),
                             DEVICE)
    rows.sub_top_k[0], rows.sub_top_p[0], rows.sub_temperature[0] = top_k, top_p, temperature
    return FrameSampler(rows, torch.tensor([1 << 33, 5], device=DEVICE)[:B])


@pytest.mark.parametrize("talker_hidden", [32, 64])        # 64: with small_to_mtp_projection
def test_kernel_equals_the_per_step_path(kernel, talker_hidden):
    model = predictor(talker_hidden)
    for B, top_k, top_p, temperature in ((1, 50, 1.0, 0.9), (2, 0, 0.8, 1.3), (2, 7, 0.95, 0.5)):
        g = torch.Generator().manual_seed(B + top_k)
        hidden = torch.randn(B, talker_hidden, generator=g).to(DEVICE)
        code0 = torch.randn(B, talker_hidden, generator=g).to(DEVICE)
        s = sampler(B, top_k, top_p, temperature)
        assert kernel.supports(model, hidden)
        codes, embed_sum = kernel.predict(model, hidden, code0, s.p, s.counter)
        # return_logits forces the per-step path on every device
        want_codes, want_sum, _ = model.predict(hidden, code0, s, return_logits=True)
        assert codes.shape == (B, 15) and codes.dtype == torch.int64
        assert torch.equal(codes, want_codes), (B, codes, want_codes)
        torch.testing.assert_close(embed_sum, want_sum, atol=1e-5, rtol=1e-5)


def test_the_predictor_dispatches_small_cuda_batches_only(kernel):
    model = predictor(32)
    small, large = torch.zeros(kernel.MAX_ROWS, 32), torch.zeros(kernel.MAX_ROWS + 1, 32)
    assert kernel.supports(model, small) and not kernel.supports(model, large)


def test_tiles_split_columns_evenly():
    from talkgate.synth.predictor_kernel import tiles
    # an H100's 132 SMs: no program gets more than the even share rounded up to a chunk width
    for N, K in ((4096, 1024), (1024, 2048), (3072, 1024), (1024, 3072), (2048, 1024)):
        bn, ch, bk = tiles(N, K, 132, 2)
        assert bn * ch * 132 >= N and bn * ch <= 2 * -(-N // 132) and K % bk == 0
