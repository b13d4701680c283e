"""The codec decoder's residual-unit kernels (synth/conv_kernel.py) equal PyTorch's convolutions: one causal
convolution with its fused SnakeBeta or residual, directly; and whole decode steps of several rows through the
units' kernel path against the PyTorch path. In Triton's interpreter on a CPU machine (conftest.py), compiled on
a GPU."""
from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from talkgate.synth import codec_decoder
from talkgate.synth.codec_decoder import load_codec_decoder
from talkgate.synth.random_speech_tokenizer import write_random_codec_decoder

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# tests/unit/test_codec_decoder.py's tiny decoder (its units: 16, 8, 4 and 2 channels)
TINY = dict(hidden_size=32, latent_dim=48, codebook_dim=32, codebook_size=64, num_attention_heads=2,
            num_key_value_heads=2, head_dim=16, intermediate_size=64, num_hidden_layers=2, decoder_dim=32)


@pytest.fixture(scope="module")
def kernel():
    pytest.importorskip("triton", reason="triton is part of the test extra (and of torch on CUDA)")
    return importlib.import_module("talkgate.synth.conv_kernel")


def reference(x, tail, weight, bias, dilation, freq=None, inv_beta=None, residual=None):
    """The same convolution in PyTorch: the tail prepended, F.conv1d, then SnakeBeta or the residual, in float32."""
    full = torch.cat([tail, x], -1) if tail is not None else x
    y = F.conv1d(full.float(), weight.permute(1, 2, 0).float(), bias.float(), dilation=dilation)
    if freq is not None:
        y = y + inv_beta.float().view(-1, 1) * torch.sin(y * freq.float().view(-1, 1)) ** 2
    if residual is not None:
        y = y + residual.float()
    return y


# (C_in, C_out, K, dilation, T): channels off the tile sizes; a context longer than the input (every tap of the
# first times in the tail); times over two tiles; a 1x1 convolution
SHAPES = [(24, 40, 7, 3, 5), (16, 16, 7, 9, 150), (96, 72, 7, 1, 130), (40, 24, 1, 1, 70)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("epilogue", ["bias", "snake", "residual"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 3e-3)])
def test_kernel_matches_pytorch_convolution(kernel, shape, epilogue, dtype, tol, monkeypatch):
    if dtype == torch.float16 and DEVICE == "cpu":
        pytest.skip("float16 products on the GPU only")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)     # exact float32: the kernel's "ieee"
    cin, cout, K, dilation, T = shape
    g = torch.Generator().manual_seed(sum(shape))
    rnd = lambda *size: torch.randn(*size, generator=g).to(DEVICE, dtype)
    ctx = (K - 1) * dilation
    # the tail as the decoder holds it: a strided view into a wider per-row state
    state = rnd(3, 11 + cin * ctx + 5)
    tail = state[:, 11:11 + cin * ctx].view(3, cin, ctx) if ctx else None
    x, weight, bias = rnd(3, cin, T), rnd(K, cout, cin) / (cin * K) ** 0.5, rnd(cout)
    extra = {}
    if epilogue == "snake":
        extra = dict(freq=rnd(cout).abs() + 0.5, inv_beta=rnd(cout).abs() + 0.5)
    elif epilogue == "residual":
        extra = dict(residual=rnd(3, cout, T))
    got = kernel.causal_conv(x, tail, weight, bias, dilation, **extra)
    want = reference(x, tail, weight, bias, dilation, **extra)
    assert got.shape == (3, cout, T) and got.dtype == dtype
    assert (got.float() - want).abs().max() <= tol * max(1.0, want.abs().max().item())


def test_decode_steps_through_the_unit_kernels_match_the_pytorch_path(kernel, tmp_path, monkeypatch):
    """Frames one at a time and then three at once, three rows in slots 4, 0 and 2 of five: the units' kernel path
    gives the PyTorch path's PCM and carried state (the dilated convs' tails wider than a frame's input at every
    block; upsampling rates smaller than the released ones, so that the interpreter takes seconds)."""
    model = load_codec_decoder(write_random_codec_decoder(tmp_path, {**TINY, "upsample_rates": [2, 3, 2, 2]}, seed=2),
                               DEVICE)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    slots = torch.tensor([4, 0, 2], device=DEVICE)
    codes = torch.randint(0, TINY["codebook_size"], (3, 16, 6), generator=torch.Generator().manual_seed(5)).to(DEVICE)
    units = [m for m in model.modules() if isinstance(m, codec_decoder.ResidualUnit)]
    calls = []
    fused = codec_decoder.ResidualUnit.fused

    def counted(self, x, tails):
        calls.append(x.shape)
        return fused(self, x, tails)

    monkeypatch.setattr(codec_decoder.ResidualUnit, "fused", counted)
    runs = []
    for kernels in (True, False):                                # the kernels' path, then PyTorch's
        monkeypatch.setattr(codec_decoder, "UNIT_KERNELS_ON_CPU", kernels)
        for unit in units:
            monkeypatch.setattr(unit, "has_kernels", kernels)
        state = model.alloc_state(5)
        pcm = [model.decode_step(codes[..., i:i + 1], slots, state) for i in range(3)]
        pcm.append(model.decode_step(codes[..., 3:], slots, state))
        runs.append((torch.cat(pcm, 1), state))
    (got, got_state), (want, want_state) = runs
    assert len(units) == 12 and len(calls) == 4 * len(units)
    assert got.shape == want.shape == (3, 6 * model.config.frame_samples)
    assert (got - want).abs().max() <= 1e-5
    assert (got_state.tails - want_state.tails).abs().max() <= 1e-5 * want_state.tails.abs().max()
    assert not got_state.tails[[1, 3]].any()
