"""Codec decoder: streaming == full decode, small steps, bf16, checkpoint I/O (parity with the official reference:
tests/parity/test_parity_codec_decoder.py)."""
import json
import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from talkgate.synth import codec_decoder
from talkgate.synth.codec_decoder import (CausalConv, CausalTransConv, CodecDecoderConfig, ConvHistory, WaveConv,
                                         load_codec_decoder)
from talkgate.synth.random_speech_tokenizer import speech_tokenizer_config, write_random_codec_decoder
from talkgate.synth.speech_tokenizer import CodecCheckpointError

# Tiny but complete: 16 codebooks, the real 72-frame window and the real 1920 samples per frame.
TINY = dict(hidden_size=32, latent_dim=48, codebook_dim=32, codebook_size=64, num_attention_heads=2,
            num_key_value_heads=2, head_dim=16, intermediate_size=64, num_hidden_layers=2, decoder_dim=32)
TOL = 1e-4


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_random_codec_decoder(tmp_path_factory.mktemp("codec") / "speech_tokenizer", TINY, seed=1)


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return load_codec_decoder(tiny_dir)


def random_codes(batch, frames, seed, size=TINY["codebook_size"]):
    return torch.randint(0, size, (batch, 16, frames), generator=torch.Generator().manual_seed(seed))


def run_streams(model, utterances, policy, num_slots, seed):
    """Decode every utterance through decode_step, several at a time in one batch: each call takes a
    random subset of the started utterances in random row order and one n for all rows. Utterances
    start at different calls; a slot is reset and reused when its utterance ends."""
    rng = random.Random(seed)
    state = model.alloc_state(num_slots)
    waiting = list(range(len(utterances)))
    free = list(range(num_slots - 1))  # the last slot is never used: it must stay untouched
    active, done, outputs = {}, {}, {i: [] for i in range(len(utterances))}
    while waiting or active:
        if waiting and free and (not active or rng.random() < 0.3):
            slot = free.pop(0)
            state.reset_slots(torch.tensor([slot]))
            active[waiting.pop(0)] = [slot, 0]
        rows = [u for u in active if rng.random() < 0.7] or list(active)
        rng.shuffle(rows)
        left = min(utterances[u].shape[1] - active[u][1] for u in rows)
        n = min(left, policy(rng))
        codes = torch.stack([utterances[u][:, active[u][1]:active[u][1] + n] for u in rows])
        slots = torch.tensor([active[u][0] for u in rows])
        pcm = model.decode_step(codes, slots, state)
        assert pcm.shape == (len(rows), n * 1920) and pcm.dtype == torch.float32
        for row, u in enumerate(rows):
            outputs[u].append(pcm[row])
            active[u][1] += n
            if active[u][1] == utterances[u].shape[1]:
                free.append(active.pop(u)[0])
                done[u] = True
    assert not state.tails[-1].any() and not state.kv[:, -1].any() and state.pos[-1] == 0
    return [torch.cat(outputs[i]) for i in range(len(utterances))]


@pytest.mark.parametrize("policy", ["1", "2", "3", "5", "random"])
def test_streaming_equals_full_decode(tiny, policy):
    lengths = [100, 83, 9, 40, 75]
    utterances = [random_codes(1, t, seed=10 + i)[0] for i, t in enumerate(lengths)]
    full = [tiny.decode(u[None])[0] for u in utterances]
    chunks = (lambda rng: int(policy)) if policy != "random" else (lambda rng: rng.choice([1, 1, 2, 4, 7, 16, 80]))
    streamed = run_streams(tiny, utterances, chunks, num_slots=4, seed=int(policy) if policy != "random" else 99)
    for got, expected in zip(streamed, full):
        assert got.shape == expected.shape
        assert (got - expected).abs().max() <= TOL


@pytest.mark.parametrize("kernel, dilation", [(7, 3), (3, 1), (1, 1)])
def test_small_steps_convolve_as_one_multiply(monkeypatch, kernel, dilation):
    """A one-row step's convolution on [1, n, C] (windows times `taps`) gives what the channels-last convolution
    and the official Conv1d on [1, C, n] give, carried frames included, for a non-contiguous input too."""
    torch.manual_seed(0)
    conv = CausalConv(6, 5, kernel, dilation=dilation)
    conv.prepare()
    x = torch.randn(1, 6, 4).transpose(1, 2)                      # [1, n, C], not contiguous
    tails = torch.randn(1, 6 * conv.context)
    history = tails.view(1, conv.context, 6)
    official = conv.conv(torch.cat([history, x], dim=1).transpose(1, 2)).transpose(1, 2)
    outs = []
    for macs in (0, 1 << 20):                                     # the convolution, then the multiply
        monkeypatch.setattr(codec_decoder, "MATMUL_MACS", macs)
        carried = ConvHistory(tails)
        outs.append((conv(x, carried), carried.carried()))
    assert outs[0][0].shape == outs[1][0].shape == (1, 4, 5)
    for out, carried in outs:
        assert (out - official).abs().max() <= 1e-6
        assert torch.equal(carried.view(1, conv.context, 6), torch.cat([history, x], dim=1)[:, 4:])


@pytest.mark.parametrize("dilation, n", [(3, 6), (3, 4), (9, 5), (9, 32), (2, 1)])
def test_dilated_convs_run_over_their_phases(monkeypatch, dilation, n):
    """Several rows' dilated convolution (undilated over its phases, zero frames after the last where n is not a
    multiple of the dilation) gives what the official dilated Conv1d gives on the carried and new frames, and the
    one-row multiply and the whole-conv path (a one-row conv over MATMUL_MACS) give it too."""
    torch.manual_seed(2)
    conv = CausalConv(6, 5, 7, dilation=dilation)
    conv.prepare()
    phases, real = [], CausalConv._phases
    monkeypatch.setattr(CausalConv, "_phases", lambda self, x, n: phases.append(x.shape) or real(self, x, n))
    for rows, macs in ((3, codec_decoder.MATMUL_MACS), (1, 0), (1, codec_decoder.MATMUL_MACS)):
        monkeypatch.setattr(codec_decoder, "MATMUL_MACS", macs)
        x = torch.randn(rows, n, 6)
        tails = torch.randn(rows, 6 * conv.context)
        prefixed = torch.cat([tails.view(rows, conv.context, 6), x], dim=1)
        official = conv.conv(prefixed.transpose(1, 2)).transpose(1, 2)
        history = ConvHistory(tails)
        got = conv(x, history)
        assert got.shape == (rows, n, 5) and got.stride()[1:] == (5, 1)
        assert (got - official).abs().max() <= 1e-5
        assert torch.equal(history.carried().view(rows, conv.context, 6), prefixed[:, n:])
    assert len(phases) == 2                                       # three rows, and the one row over MATMUL_MACS


@pytest.mark.parametrize("kernel, dilation, rows", [(7, 1, 1), (7, 1, 3), (3, 2, 2), (9, 1, 2)])
def test_the_wave_conv_is_the_official_one_channel_conv(kernel, dilation, rows):
    """WaveConv (one multiply by every tap, then the shifted sum) gives what the official Conv1d to one channel gives
    on the carried frames and the new ones, in float32, and carries the last frames on."""
    torch.manual_seed(1)
    conv = WaveConv(6, kernel, dilation=dilation)
    conv.prepare()
    assert conv.taps.shape == (6, 8 * -(-kernel // 8))
    x = torch.randn(rows, 5, 6)
    tails = torch.randn(rows, 6 * conv.context)
    prefixed = torch.cat([tails.view(rows, conv.context, 6), x], dim=1)
    official = conv.conv(prefixed.transpose(1, 2))[:, 0]
    history = ConvHistory(tails)
    got = conv(x, history)
    assert got.shape == (rows, 5) and got.dtype == torch.float32
    assert (got - official).abs().max() <= 1e-5
    assert torch.equal(history.carried().view(rows, conv.context, 6), prefixed[:, 5:])


@pytest.mark.parametrize("kernel, stride, rows", [(6, 3, 1), (6, 3, 3), (16, 8, 2), (2, 2, 3)])
def test_the_transposed_conv_is_the_official_one_trimmed(kernel, stride, rows):
    """CausalTransConv (a multiply of its input windows) gives what the official ConvTranspose1d gives on the whole
    input, trimmed on the right, over two calls that carry the last frames on, for one row and several."""
    torch.manual_seed(3)
    conv = CausalTransConv(6, 5, kernel, stride)
    conv.prepare()
    x = torch.randn(rows, 5, 6)
    official = conv.conv(x.transpose(1, 2)).transpose(1, 2)[:, :5 * stride]
    tails = torch.zeros(rows, 6 * conv.context)
    got = []
    for part in (x[:, :2], x[:, 2:]):
        history = ConvHistory(tails)
        got.append(conv(part, history))
        assert got[-1].shape == (rows, part.shape[1] * stride, 5) and got[-1].is_contiguous()
        tails = history.carried()
    assert (torch.cat(got, dim=1) - official).abs().max() <= 1e-5


def test_conv_stack_runs_channels_last(tiny, monkeypatch):
    """Every conv of the stack takes [B, n, C_in] and gives [B, n, C_out] in that memory order (the channels-last
    convolution's output read as it is, no transposes between blocks), and several rows decoded together give
    what each row gives frame by frame alone, by the one-row multiplies and by the convolutions."""
    calls = []

    def seen(module, args, out):
        x = args[0]
        assert (x.shape[-1], out.shape[-1]) == (module.in_channels, module.conv.out_channels), (module, x.shape)
        calls.append((x.shape[0], out.shape[0], out.stride()[1:] == (out.shape[-1], 1)))

    convs = [m for m in tiny.modules() if isinstance(m, (codec_decoder.CausalConv, codec_decoder.CausalTransConv))]
    hooks = [m.register_forward_hook(seen) for m in convs]
    codes = random_codes(3, 6, seed=8)
    try:
        state = tiny.alloc_state(4)
        together = torch.cat([tiny.decode_step(codes[..., i:i + 2], torch.tensor([2, 0, 1]), state)
                              for i in range(0, 6, 2)], dim=1)
    finally:
        for h in hooks:
            h.remove()
    assert len(calls) == 3 * len(convs) and set(calls) == {(3, 3, True)}
    for macs in (codec_decoder.MATMUL_MACS, 0):
        monkeypatch.setattr(codec_decoder, "MATMUL_MACS", macs)
        for row in range(3):
            state = tiny.alloc_state(1)
            alone = torch.cat([tiny.decode_step(codes[row:row + 1, :, i:i + 1], torch.tensor([0]), state)
                               for i in range(6)], dim=1)
            assert (alone[0] - together[row]).abs().max() <= TOL


def test_chunks_longer_than_the_window(tiny):
    codes = random_codes(1, 160, seed=7)
    state = tiny.alloc_state(1)
    slot = torch.tensor([0])
    pcm, start = [], 0
    for n in (80, 1, 75, 4):  # a chunk of more than 72 frames keeps only its last 72 keys
        pcm.append(tiny.decode_step(codes[..., start:start + n], slot, state))
        start += n
    assert (torch.cat(pcm, dim=1) - tiny.decode(codes)).abs().max() <= TOL


def test_first_frame_gives_first_pcm(tiny):
    state = tiny.alloc_state(2)
    codes = random_codes(1, 3, seed=5)
    first = tiny.decode_step(codes[..., :1], torch.tensor([1]), state)
    assert first.shape == (1, 1920)
    assert torch.equal(state.pos, torch.tensor([0, 1]))
    assert (first[0] - tiny.decode(codes)[0, :1920]).abs().max() <= TOL


def test_bf16_close_to_fp32(tiny_dir, tiny):
    codes = random_codes(2, 30, seed=6)
    full = tiny.decode(codes)
    half = load_codec_decoder(tiny_dir, dtype=torch.bfloat16)
    assert half.pre_conv.conv.weight.dtype == torch.bfloat16
    got = half.decode(codes)
    assert torch.isfinite(got).all()
    assert (got - full).abs().max() < 0.25 and (got - full).std() < 0.1 * full.std()


def test_writer_is_deterministic_and_official_layout(tmp_path, tiny_dir):
    again = write_random_codec_decoder(tmp_path / "again", TINY, seed=1)
    a, b = load_file(str(tiny_dir / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    other = load_file(str(write_random_codec_decoder(tmp_path / "other", TINY, seed=2) / "model.safetensors"))
    assert not torch.equal(a["decoder.pre_conv.conv.weight"], other["decoder.pre_conv.conv.weight"])
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3_tts_tokenizer_12hz" and config["decode_upsample_rate"] == 1920
    assert config["encoder_config"]["num_quantizers"] == 32  # complete layout, encoder weights not written
    assert config["decoder_config"]["hidden_size"] == 32 and config["decoder_config"]["upsample_rates"] == [8, 5, 4, 3]
    assert not [k for k in a if not k.startswith("decoder.")]
    model = load_codec_decoder(tiny_dir)
    assert all(torch.equal(v, a["decoder." + k]) for k, v in model.state_dict().items())


def test_default_config_is_the_released_one(tmp_path):
    cfg = CodecDecoderConfig.from_dict(speech_tokenizer_config())
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.attn_head_dim, cfg.latent_dim, cfg.codebook_dim) == (512, 1024, 64, 1024, 512)
    assert cfg.frame_samples == 1920 and cfg.sliding_window == 72 and cfg.num_hidden_layers == 8


# -- loader errors: each names the file and, where there is one, the tensor ------------------------

def rewrite(src, dst, edit):
    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    tensors = load_file(str(src / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def test_missing_files(tmp_path, tiny_dir):
    with pytest.raises(CodecCheckpointError, match=r"config\.json: missing"):
        load_codec_decoder(tmp_path)
    (tmp_path / "config.json").write_text((tiny_dir / "config.json").read_text())
    with pytest.raises(CodecCheckpointError, match=r"model\.safetensors: missing"):
        load_codec_decoder(tmp_path)


def test_unknown_model_type(tmp_path, tiny_dir):
    config = json.loads((tiny_dir / "config.json").read_text())
    config["model_type"] = "qwen3_tts_tokenizer_25hz"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CodecCheckpointError, match=r"config\.json: model_type 'qwen3_tts_tokenizer_25hz'"):
        load_codec_decoder(tmp_path)


def test_missing_tensor(tmp_path, tiny_dir):
    name = "decoder.pre_transformer.layers.1.self_attn.k_proj.weight"
    path = rewrite(tiny_dir, tmp_path / "ckpt", lambda t: t.pop(name))
    with pytest.raises(CodecCheckpointError, match=rf"model\.safetensors: missing tensor '{name}'"):
        load_codec_decoder(path)


def test_wrong_shape(tmp_path, tiny_dir):
    name = "decoder.decoder.2.block.1.conv.weight"
    def edit(t):
        t[name] = t[name][:, :-1].contiguous()
    path = rewrite(tiny_dir, tmp_path / "ckpt", edit)
    with pytest.raises(CodecCheckpointError, match=rf"model\.safetensors: tensor '{name}' has shape \[16, 7, 10\], expected \[16, 8, 10\]"):
        load_codec_decoder(path)


def test_wrong_dtype_and_unexpected_tensor(tmp_path, tiny_dir):
    name = "decoder.upsample.0.1.gamma"
    path = rewrite(tiny_dir, tmp_path / "a", lambda t: t.__setitem__(name, t[name].to(torch.int32)))
    with pytest.raises(CodecCheckpointError, match=rf"tensor '{name}' has dtype I32"):
        load_codec_decoder(path)
    path = rewrite(tiny_dir, tmp_path / "b", lambda t: t.__setitem__("decoder.extra.weight", torch.zeros(2)))
    with pytest.raises(CodecCheckpointError, match=r"unexpected decoder tensors \['decoder.extra.weight'\]"):
        load_codec_decoder(path)
    # encoder tensors (voice cloning) are ignored
    path = rewrite(tiny_dir, tmp_path / "c", lambda t: t.__setitem__("encoder.quantizer.weight", torch.zeros(2)))
    load_codec_decoder(path)
