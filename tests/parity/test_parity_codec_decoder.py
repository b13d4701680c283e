"""The codec decoder (synth/codec_decoder.py) against the official reference's (tests/reference.py), on random weights:
every sample within TOL, the attention window sliding, for grouped and plain key-value heads."""
import json

import pytest
import torch
from safetensors.torch import load_file

from talkgate.synth.codec_decoder import load_codec_decoder
from talkgate.synth.random_speech_tokenizer import write_random_codec_decoder
from tests.unit.test_codec_decoder import TINY, TOL, random_codes


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_matches_reference(tmp_path, kv_heads):
    torch.manual_seed(0)
    path = write_random_codec_decoder(tmp_path, {**TINY, "num_key_value_heads": kv_heads}, seed=2)
    from tests.reference import ref as reference
    ref = reference.Decoder(reference.DecoderConfig(**json.loads((path / "config.json").read_text())["decoder_config"])).eval()
    weights = load_file(str(path / "model.safetensors"))
    assert not [k for k in weights if not k.startswith("decoder.")]
    ref.load_state_dict({k.removeprefix("decoder."): v for k, v in weights.items()}, strict=True)

    ours = load_codec_decoder(path)
    codes = random_codes(2, 100, seed=3)  # > 72 frames: the attention window slides
    with torch.no_grad():
        expected = ref(codes)[:, 0]
    assert expected.std() > 0.02 and (expected.abs() >= 1).float().mean() < 0.01  # not trivially flat/clamped
    for chunk in (64, 100):
        got = ours.decode(codes, chunk_frames=chunk)
        assert got.dtype == torch.float32 and got.shape == (2, 100 * 1920)
        assert (got - expected).abs().max() <= TOL
    one = ours.decode(codes[1:])                 # one row: its convolutions are multiplies (codec_decoder.MATMUL_MACS)
    assert (one - expected[1:]).abs().max() <= TOL
