"""The codec decoder's precision chosen at load (synth/decoder_precision.py): the probe's figure, and the rule
that keeps float32 wherever no probe is due. The CUDA choice itself: tests/gpu/test_engine_gpu.py."""
import math
import types

import pytest
import torch

from talkgate.synth import decoder_precision as dp
from talkgate.synth.api import ModelInfo
from talkgate.synth.codec_decoder import load_codec_decoder
from talkgate.synth.random_speech_tokenizer import write_random_codec_decoder

TINY = dict(hidden_size=32, latent_dim=48, codebook_dim=32, codebook_size=64, num_attention_heads=2,
            num_key_value_heads=2, head_dim=16, intermediate_size=64, num_hidden_layers=2, decoder_dim=32)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_random_codec_decoder(tmp_path_factory.mktemp("codec") / "speech_tokenizer", TINY, seed=1)


def test_snr_db():
    x = torch.sin(torch.arange(1000.0))
    assert dp.snr_db(x, x) == math.inf
    assert dp.snr_db(x, x + 0.01 * torch.cos(torch.arange(1000.0))) == pytest.approx(40.0, abs=0.1)
    assert dp.snr_db(x, torch.full_like(x, math.nan)) == -math.inf
    assert dp.snr_db(x, x.clone().index_fill_(0, torch.tensor([3]), math.inf)) == -math.inf


def test_probe_measures_the_half_decoder(tiny_dir):
    exact = load_codec_decoder(tiny_dir)
    codes = torch.randint(0, TINY["codebook_size"], (dp.PROBE_ROWS, 16, dp.PROBE_FRAMES),
                          generator=torch.Generator().manual_seed(dp.PROBE_SEED))
    half = load_codec_decoder(tiny_dir, dtype=torch.float16)
    expected = dp.snr_db(exact.decode(codes), half.decode(codes))
    assert 20 < expected < 80                       # float16's rounding: finite, far from float32's exactness
    assert dp.probe_snr_db(load_codec_decoder(tiny_dir), torch.float16) == pytest.approx(expected)
    assert dp.probe_snr_db(load_codec_decoder(tiny_dir), torch.float32) == math.inf


def test_probe_fails_a_decoder_out_of_float16_range(tiny_dir):
    decoder = load_codec_decoder(tiny_dir)
    with torch.no_grad():                             # activations past 65504 in float16
        decoder.pre_conv.conv.weight.mul_(1e6)
    decoder.prepare()                                 # its derived weights (weight_nhwc, taps) too
    assert dp.probe_snr_db(decoder, torch.float16) < dp.MIN_SNR_DB


def test_float16_planned_and_probed_only_for_a_half_model_on_cuda():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert dp.planned_dtype(cuda, torch.bfloat16, None) == torch.float16 and dp.probes(cuda, torch.bfloat16, None)
    assert dp.planned_dtype(cpu, torch.bfloat16, None) == torch.float32 and not dp.probes(cpu, torch.bfloat16, None)
    # a float32 model (a parity run) keeps the reference's float32 decoder
    assert dp.planned_dtype(cuda, torch.float32, None) == torch.float32 and not dp.probes(cuda, torch.float32, None)
    for given in (torch.float32, torch.bfloat16, torch.float16):                # serve --decoder-dtype: as given
        assert dp.planned_dtype(cuda, torch.bfloat16, given) == given and not dp.probes(cuda, torch.bfloat16, given)


def loaded(decoder):
    info = ModelInfo(name="tiny", model_type="custom_voice", size="tiny", untrained=True, voices=(), languages=("auto",))
    return types.SimpleNamespace(codec_decoder=decoder, info=info)


def test_settle_casts_a_decoder_that_passes(tiny_dir):
    tts = loaded(load_codec_decoder(tiny_dir))
    dtype, snr = dp.settle(tts)
    assert dtype == torch.float16 and snr >= dp.MIN_SNR_DB and tts.info.decoder_dtype == "float16"
    assert all(p.dtype == torch.float16 for p in tts.codec_decoder.parameters())
    codes = torch.randint(0, TINY["codebook_size"], (1, 16, 3), generator=torch.Generator().manual_seed(2))
    reference = load_codec_decoder(tiny_dir, dtype=torch.float16).decode(codes)
    assert torch.equal(tts.codec_decoder.decode(codes), reference)           # as if loaded in float16


def test_settle_keeps_a_failing_decoder_in_float32_untouched(tiny_dir):
    decoder = load_codec_decoder(tiny_dir)
    with torch.no_grad():
        decoder.pre_conv.conv.weight.mul_(1e6)
    decoder.prepare()                                 # its derived weights (weight_nhwc, taps) too
    weights = {k: v.clone() for k, v in decoder.state_dict().items()}
    tts = loaded(decoder)
    dtype, snr = dp.settle(tts)
    assert dtype == torch.float32 and snr < dp.MIN_SNR_DB and tts.info.decoder_dtype == "float32"
    assert all(torch.equal(v, weights[k]) for k, v in tts.codec_decoder.state_dict().items())
