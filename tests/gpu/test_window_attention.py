"""The codec decoder's one-frame attention kernel (synth/window_attention.py) equals its PyTorch path
(Transformer._window + Attention.forward): directly on random rings, and through whole decode steps past
the 72-frame window. In Triton's interpreter on a CPU machine (conftest.py), compiled on a GPU."""
from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from talkgate.synth import codec_decoder
from talkgate.synth.codec_decoder import CodecDecoderConfig, Transformer, load_codec_decoder
from talkgate.synth.random_speech_tokenizer import speech_tokenizer_config, write_random_codec_decoder

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# tests/unit/test_codec_decoder.py's tiny decoder: 16 codebooks, the real 72-frame window
TINY = dict(hidden_size=32, latent_dim=48, codebook_dim=32, codebook_size=64, num_attention_heads=2,
            num_key_value_heads=2, head_dim=16, intermediate_size=64, num_hidden_layers=2, decoder_dim=32)


@pytest.fixture(scope="module")
def kernel():
    pytest.importorskip("triton", reason="triton is part of the test extra (and of torch on CUDA)")
    return importlib.import_module("talkgate.synth.window_attention")


# bf16: SDPA rounds its probabilities and output to bf16, the kernel keeps them in float32
@pytest.mark.parametrize("kv_heads", [2, 1])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("block", [16, 8])                 # ring entries a block: below and from 256 rows
def test_kernel_matches_the_pytorch_attention(kernel, monkeypatch, kv_heads, dtype, tol, block):
    torch.manual_seed(0)
    monkeypatch.setattr(kernel, "ring_block", lambda rows: block)
    cfg = CodecDecoderConfig.from_dict(speech_tokenizer_config({**TINY, "num_key_value_heads": kv_heads}))
    transformer = Transformer(cfg)
    attn = transformer.layers[0].self_attn
    transformer.prepare()
    attn.prepare()
    transformer.to(DEVICE, dtype)
    pos = torch.tensor([0, 5, 71, 72, 200], device=DEVICE)      # first frame, filling, full, wrapped
    slots = torch.tensor([6, 0, 3, 5, 1], device=DEVICE)
    B, window, D = len(pos), cfg.sliding_window, cfg.attn_head_dim
    # every entry random: those outside a row's window (j > pos while pos < 71) must not count
    cache = torch.randn(7, window, 2, kv_heads, D, device=DEVICE, dtype=dtype)
    x = torch.randn(B, 1, cfg.hidden_size, device=DEVICE, dtype=dtype)

    want_cache = cache.clone()
    want = attn(x, transformer._window(pos, 1, slots, dtype), want_cache)[:, 0].float()
    got_cache = cache.clone()
    out = kernel.window_attention(F.linear(x[:, 0], attn.qkv_weight), pos, slots, got_cache, transformer.inv_freq,
                                  attn.heads)
    assert out.shape == (B, cfg.num_attention_heads * D) and out.dtype == dtype
    got = attn.o_proj(out).float()
    assert ((got - want).norm() / want.norm()).item() < tol
    for b in range(B):
        assert ((got[b] - want[b]).norm() / want[b].norm()).item() < 2 * tol, b

    # the frame's k and v went to entry pos % window of the row's slot, and nothing else changed
    written = torch.zeros(cache.shape[:2], dtype=torch.bool, device=DEVICE)
    written[slots, pos % window] = True
    assert torch.equal(got_cache[~written], cache[~written])
    new, ref = got_cache[written].float(), want_cache[written].float()
    assert torch.equal(new[:, 1], ref[:, 1])                     # values: copied
    # keys: the interpreter's cos/sin (numpy's) may differ from torch's in the last float32 bit; in bf16
    # that bit can round cos/sin a step the other way, a key two steps
    step = 1e-6 if dtype == torch.float32 else 2 ** -6
    assert (new[:, 0] - ref[:, 0]).abs().max() <= step * ref[:, 0].abs().max()


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_decode_steps_match_the_pytorch_path(kernel, tmp_path, monkeypatch, kv_heads):
    """Frame by frame past the window (the ring wraps), two rows in slots 3 and 1 of five: the kernel's
    path gives the PyTorch path's PCM and state."""
    model = load_codec_decoder(write_random_codec_decoder(tmp_path, {**TINY, "num_key_value_heads": kv_heads}, seed=1),
                               DEVICE)
    monkeypatch.setattr(codec_decoder, "KERNEL_ON_CPU", True)
    # exact float32 on a GPU too: cuDNN's TF32 convolutions would turn last-bit differences into ~1e-3
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    frames, slots = 76, torch.tensor([3, 1], device=DEVICE)
    codes = torch.randint(0, TINY["codebook_size"], (2, 16, frames), generator=torch.Generator().manual_seed(3))
    codes = codes.to(DEVICE)
    window_kernel = model.pre_transformer.window_kernel
    calls = []

    def counted(*args):
        calls.append(args)
        return window_kernel(*args)

    runs = []
    for path_kernel in (counted, None):                          # the kernel's path, then PyTorch's
        monkeypatch.setattr(model.pre_transformer, "window_kernel", path_kernel)
        state = model.alloc_state(5)
        pcm = torch.cat([model.decode_step(codes[..., i:i + 1], slots, state) for i in range(frames)], dim=1)
        runs.append((pcm, state))
    (got, got_state), (want, want_state) = runs
    assert len(calls) == frames * TINY["num_hidden_layers"]
    assert (got - want).abs().max() <= 1e-4
    assert torch.equal(got_state.pos, want_state.pos) and got_state.pos.tolist() == [0, frames, 0, frames, 0]
    # the rings hold the same keys and values, up to the last bits of RoPE's cos/sin and of the attention
    assert (got_state.kv - want_state.kv).abs().max() <= 1e-5 * want_state.kv.abs().max()
    assert not got_state.kv[:, [0, 2, 4]].any()
