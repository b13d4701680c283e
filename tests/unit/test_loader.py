"""Loader and checkpoint writer: official layout, deterministic weights, clear errors, sharding, HF ids."""
from __future__ import annotations

import hashlib
import json
import shutil
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from talkgate.synth import checkpoint
from talkgate.synth.api import ContextParams, UnknownLanguage, UnknownVoice, InvalidParams
from talkgate.synth.checkpoint import CheckpointWriteError, create_checkpoint
from talkgate.synth.loader import CheckpointError, load_tts


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_tiny_checkpoint_loads_with_info(tiny_checkpoint):
    tts = load_tts(tiny_checkpoint)
    info = tts.info
    assert info.untrained and info.size == "tiny" and info.model_type == "custom_voice"
    assert "ryan" in info.voices and "eric" in info.voices
    assert info.languages[0] == "auto" and "english" in info.languages
    assert not any("dialect" in lang for lang in info.languages)
    assert "notice" in info.as_dict()
    assert tts.talker.codec_embedding.weight.dtype == torch.float32
    assert not any(p.is_meta for p in tts.talker.parameters())
    assert json.loads((tiny_checkpoint / "config.json").read_text())["model_type"] == "qwen3_tts"


def test_official_checkpoints_are_not_marked_untrained(tiny_checkpoint, tmp_path):
    d = copy(tiny_checkpoint, tmp_path / "ck")
    config = json.loads((d / "config.json").read_text())
    del config["talkgate"]
    (d / "config.json").write_text(json.dumps(config))
    info = load_tts(d, with_decoder=False).info
    assert not info.untrained and info.size == "0b6"


def test_writer_is_deterministic(tiny_checkpoint, tmp_path):
    again = create_checkpoint(tmp_path / "a", preset="tiny", seed=0)
    other = create_checkpoint(tmp_path / "b", preset="tiny", seed=1)
    for name in ("model.safetensors", "config.json", "tokenizer_config.json", "speech_tokenizer/model.safetensors"):
        assert digest(again / name) == digest(tiny_checkpoint / name), name
    assert digest(other / "model.safetensors") != digest(again / "model.safetensors")
    with pytest.raises(CheckpointWriteError, match="not empty"):
        create_checkpoint(tmp_path / "a", preset="tiny")
    with pytest.raises(CheckpointWriteError, match="preset"):
        create_checkpoint(tmp_path / "c", preset="huge")


def test_sharded_checkpoint_loads_the_same_tensors(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "SHARD_BYTES", 4 << 20)
    sharded = create_checkpoint(tmp_path / "sharded", preset="tiny", seed=0)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1 and not (sharded / "model.safetensors").exists()
    a, b = load_tts(sharded, with_decoder=False), load_tts(tiny_checkpoint, with_decoder=False)
    for (name, p), (_, q) in zip(a.talker.state_dict().items(), b.talker.state_dict().items()):
        assert torch.equal(p, q), name


def test_variants_and_prompt_resolution(tmp_path):
    design = load_tts(create_checkpoint(tmp_path / "vd", preset="tiny", variant="voice_design"), with_decoder=False)
    assert design.info.voices == ()
    with pytest.raises(UnknownVoice, match="no named voices"):
        design.prompts.resolve(ContextParams(voice="ryan"))
    p = design.prompts.resolve(ContextParams(language="English", instructions="A deep voice."))
    assert p.instruction_ids and p.codec_ids == (2154, 2156, 2050, 2157, 2148)
    base = load_tts(create_checkpoint(tmp_path / "base", preset="tiny", variant="base"), with_decoder=False)
    assert base.prompts.resolve(ContextParams()).codec_ids == (2155, 2156, 2157, 2148)
    with pytest.raises(InvalidParams, match="instructions"):
        base.prompts.resolve(ContextParams(instructions="x"))


def test_unknown_voice_and_language_list_what_exists(tiny_checkpoint):
    prompts = load_tts(tiny_checkpoint, with_decoder=False).prompts
    with pytest.raises(UnknownVoice, match="available: serena, vivian"):
        prompts.resolve(ContextParams(voice="bob"))
    with pytest.raises(UnknownLanguage, match="available: auto, chinese"):
        prompts.resolve(ContextParams(language="klingon"))
    with pytest.raises(UnknownLanguage):                   # dialects are chosen through their speakers
        prompts.resolve(ContextParams(language="sichuan_dialect"))
    assert prompts.resolve(ContextParams()).voice == "serena"
    assert prompts.resolve(ContextParams(voice="Dylan", language="chinese")).codec_ids[2] == 2074


def rewrite_weights(d, change):
    path = d / "model.safetensors"
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))
    return path


@pytest.mark.parametrize("change,message", [
    (lambda t: t.pop("talker.model.layers.1.mlp.up_proj.weight"),
     "model.safetensors: missing tensor 'talker.model.layers.1.mlp.up_proj.weight'"),
    (lambda t: t.__setitem__("talker.extra.weight", torch.zeros(2)), "unexpected tensor 'talker.extra.weight'"),
    (lambda t: t.__setitem__("talker.codec_head.weight", torch.zeros(3072, 65)),
     r"'talker.codec_head.weight' has shape \[3072, 65\], expected \[3072, 64\]"),
    (lambda t: t.__setitem__("talker.model.norm.weight", torch.zeros(64, dtype=torch.int32)),
     "'talker.model.norm.weight' has dtype I32"),
])
def test_bad_tensors_are_named(tiny_checkpoint, tmp_path, change, message):
    d = copy(tiny_checkpoint, tmp_path / "ck")
    rewrite_weights(d, change)
    with pytest.raises(CheckpointError, match=message):
        load_tts(d)


def test_bad_files_are_named(tiny_checkpoint, tmp_path):
    d = copy(tiny_checkpoint, tmp_path / "ck")
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(CheckpointError, match=r"config.json: .*model_type 'llama'"):
        load_tts(d)
    (d / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json: missing"):
        load_tts(d)
    d = copy(tiny_checkpoint, tmp_path / "ck2")
    shutil.rmtree(d / "speech_tokenizer")
    with pytest.raises(CheckpointError, match="speech_tokenizer: missing"):
        load_tts(d)
    d = copy(tiny_checkpoint, tmp_path / "ck3")
    (d / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors: missing"):
        load_tts(d)
    with pytest.raises(CheckpointError, match="no such checkpoint directory"):
        load_tts(tmp_path / "nope")


def test_hugging_face_id_fails_fast_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")       # nothing listens on the discard port
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    t = time.perf_counter()
    with pytest.raises(CheckpointError, match="Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice: .*unreachable"):
        load_tts("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice")
    assert time.perf_counter() - t < 10


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    return create_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-base", preset="tiny", variant="base")


def test_base_checkpoint_loads_its_encoders(tiny_base, tiny_checkpoint):
    base = load_tts(tiny_base, with_decoder=False)
    assert base.speaker_encoder is not None and base.codec_encoder is not None
    assert base.speaker_encoder.fc.weight.shape == (64, 192, 1)
    assert base.codec_encoder.config.valid_quantizers == 16 and base.codec_encoder.config.num_quantizers == 32
    custom = load_tts(tiny_checkpoint, with_decoder=False)
    assert custom.speaker_encoder is None and custom.codec_encoder is None
    assert (tiny_checkpoint / "speech_tokenizer" / "preprocessor_config.json").is_file()   # every variant: encoder too
    assert "encoder.downsample.conv.weight" in load_file(str(tiny_checkpoint / "speech_tokenizer" / "model.safetensors"))


def rewrite_speech_tokenizer(d, change):
    path = d / "speech_tokenizer" / "model.safetensors"
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


@pytest.mark.parametrize("where,change,message", [
    ("model", lambda t: t.pop("speaker_encoder.blocks.2.se_block.conv2.weight"),
     "model.safetensors: missing tensor 'speaker_encoder.blocks.2.se_block.conv2.weight' "
     r"\(1 missing; a Base checkpoint's speaker encoder\)"),
    ("model", lambda t: t.__setitem__("speaker_encoder.fc.weight", torch.zeros(64, 191, 1)),
     r"'speaker_encoder.fc.weight' has shape \[64, 191, 1\], expected \[64, 192, 1\]"),
    ("model", lambda t: t.__setitem__("speaker_encoder.extra.weight", torch.zeros(2)),
     "unexpected tensor 'speaker_encoder.extra.weight'"),
    ("speech", lambda t: t.pop("encoder.quantizer.acoustic_residual_vector_quantizer.layers.3.codebook.embed_sum"),
     r"speech_tokenizer/model.safetensors: missing tensor "
     r"'encoder.quantizer.acoustic_residual_vector_quantizer.layers.3.codebook.embed_sum' \(the voice-cloning"),
    ("speech", lambda t: t.__setitem__("encoder.encoder_transformer.layers.1.mlp.fc1.weight", torch.zeros(64, 31)),
     r"'encoder.encoder_transformer.layers.1.mlp.fc1.weight' has shape \[64, 31\], expected \[64, 32\]"),
    ("speech", lambda t: t.__setitem__("encoder.quantizer.semantic_residual_vector_quantizer.layers.1.codebook.embed_sum",
                                       torch.zeros(2048, 8)),
     r"unexpected encoder tensors \['encoder.quantizer.semantic_residual_vector_quantizer.layers.1.codebook"),
])
def test_base_encoder_tensors_are_named(tiny_base, tmp_path, where, change, message):
    d = copy(tiny_base, tmp_path / "ck")
    (rewrite_weights if where == "model" else rewrite_speech_tokenizer)(d, change)
    with pytest.raises(CheckpointError, match=message):
        load_tts(d, with_decoder=False)


def test_base_config_errors_are_named(tiny_base, tmp_path):
    d = copy(tiny_base, tmp_path / "ck")
    config = json.loads((d / "config.json").read_text())
    config["speaker_encoder_config"]["enc_dim"] = 32
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="enc_dim 32 != talker hidden_size 64"):
        load_tts(d)
    d = copy(tiny_base, tmp_path / "ck2")
    st = json.loads((d / "speech_tokenizer" / "config.json").read_text())
    del st["encoder_config"]
    (d / "speech_tokenizer" / "config.json").write_text(json.dumps(st))
    with pytest.raises(CheckpointError, match="encoder_config is required"):
        load_tts(d)
