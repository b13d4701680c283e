"""The persistent kernels (synth/persistent.py) give what the per-layer PyTorch paths give:
- the code predictor's frame: the 15 codes of greedy and of seeded rows with the sub-talker's top-k / top-p /
  temperature, and the embedding sum, with and without small_to_mtp_projection (CodePredictor.predict);
- the Talker's step: the final-normed hidden state and the K/V written at each row's slot and position
  (Talker.forward's per-layer path).
On a CPU machine the kernels run in Triton's interpreter (one program runs every phase); on a GPU they run
compiled with one program per SM and grid barriers, against the per-layer paths on the same device."""
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
    return importlib.import_module("talkgate.synth.persistent")


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
        assert kernel.supports(model, B)
        codes, embed_sum = kernel.predict(model, hidden, code0, s.p, s.counter)
        # return_logits forces the per-step path on every device
        want_codes, want_sum, _ = model.predict(hidden, code0, s, return_logits=True)
        assert codes.shape == (B, 15) and codes.dtype == torch.int64
        assert torch.equal(codes, want_codes), (B, codes, want_codes)
        torch.testing.assert_close(embed_sum, want_sum, atol=1e-5, rtol=1e-5)


def test_the_models_dispatch_small_batches_only(kernel):
    model = predictor(32)
    assert kernel.supports(model, kernel.MAX_ROWS) and not kernel.supports(model, kernel.MAX_ROWS + 1)


@pytest.fixture(scope="module")
def talker(tiny_checkpoint):
    from talkgate.synth.loader import load_tts
    return load_tts(str(tiny_checkpoint), device=DEVICE, with_decoder=False).talker


@pytest.mark.parametrize("split", [64, 8])      # 8: positions 17 and 39 attend in 3 and 5 parts, combined
def test_talker_step_equals_the_per_layer_path(kernel, talker, monkeypatch, split):
    S, L = 5, 40
    talker.setup_cache(S, L, DEVICE, torch.float32)
    g = torch.Generator().manual_seed(3)
    talker.kv.copy_(torch.randn(talker.kv.shape, generator=g))
    for B, slots, pos in ((1, [3], [17]), (2, [4, 0], [0, 39])):
        x = torch.randn(B, 1, talker.hidden_size, generator=g).to(DEVICE)
        slots, pos = torch.tensor(slots, device=DEVICE), torch.tensor(pos, device=DEVICE)
        cos, sin = talker.rope(pos[:, None])
        kv = talker.kv.clone()
        got = kernel.talker_step(talker, x[:, 0], cos[:, 0], sin[:, 0], slots, pos, split=split)
        got_kv, _ = talker.kv.clone(), talker.kv.copy_(kv)
        monkeypatch.setattr(kernel, "MAX_ROWS", 0)              # the per-layer path on every device
        want = talker(x, pos[:, None], slots)[:, 0]
        monkeypatch.undo()
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got_kv, talker.kv, atol=1e-5, rtol=1e-5)
        assert not torch.equal(got_kv, kv)                      # the step wrote its K/V


def test_tiles_split_columns_evenly():
    from talkgate.synth.persistent import tiles
    # an H100's 132 SMs: no program gets more than the even share rounded up to a chunk width
    for N, K in ((4096, 1024), (1024, 2048), (3072, 1024), (1024, 3072), (2048, 1024)):
        bn, ch, bk, p = tiles(N, K, 132, 2)
        assert bn * ch * 132 >= N and bn * ch <= 2 * -(-N // 132) and K % bk == 0 and p >= 1
