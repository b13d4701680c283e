"""Deterministic random-weight checkpoints in the official Qwen3-TTS 12 Hz layout.

    create_checkpoint(out_dir, preset="mini", variant="custom_voice", seed=0)

writes config.json (model_type qwen3_tts, plus a {"talkgate": {"random_weights": true, ...}} block:
that is how talkgate knows a model is untrained), generation_config.json, model.safetensors
(sharded with model.safetensors.index.json above SHARD_BYTES), the Qwen text tokenizer files
(vocab.json, merges.txt, tokenizer_config.json with the audio/TTS added tokens 151669..151675) and
speech_tokenizer/ (synth/random_speech_tokenizer.py: decoder and voice-cloning encoder, as every
published variant ships both). Base checkpoints also get the speaker encoder (`speaker_encoder.*` and
`speaker_encoder_config`; tiny and mini write the whole config, as their widths are not the defaults).

Every tensor is drawn from its own generator seeded by (seed, tensor name), so the values do not
depend on the shard layout, and a shard is written and freed before the next is drawn: a 1.7B
checkpoint never holds more than one shard in memory. Init: normal(0, 0.02) for matrices and
embeddings (the reference's initializer_range), zero biases, unit norm weights; the speaker encoder's
convolutions std fan_in^-0.5 (see random_tensor).

Presets: tiny (tests), mini (the `talkgate serve` default), 0.6b and 1.7b (the published shapes,
bf16 like the published files). mini: Talker 24 M parameters (19 M of them the text embedding
lookup), code predictor 12 M, decoder 2 M. Measured on this project's 2-core CPU machine
(2026-11-22, torch 2.13 CPU, `talkgate synthesize`, 150 frames, sampling): Talker + code predictor
14.8 ms per 80 ms frame and full decode 1.1 ms per frame with one torch thread; end to end 12 s of
audio in 2.4 s (1 thread) or 2.8 s (2 threads), real-time factor 0.20-0.23. One thread is the
faster setting for it: these matrices are too small to gain from two, and on a busy machine
OpenMP's waiting made two threads several times slower.
"""
from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path

import torch

from talkgate.synth.config import VARIANTS
from talkgate.synth.random_speech_tokenizer import write_random_codec_decoder
from talkgate.synth.tokenizer import qwen_tokenizer_dir

SHARD_BYTES = 2 << 30


class CheckpointWriteError(ValueError):
    """Bad preset / variant, or an output directory that is not empty."""


PRESETS = ("tiny", "mini", "0.6b", "1.7b")

# Ids of the published checkpoints (shared/reference/qwen3-tts.md "Ids").
LANGUAGES = {"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
             "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
             "beijing_dialect": 2074, "sichuan_dialect": 2062}
SPEAKERS = {"serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861, "ono_anna": 2873,
            "sohee": 2864, "eric": 2875, "dylan": 2878}
SPEAKER_DIALECT = {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}
CODEC_IDS = dict(codec_bos_id=2149, codec_eos_token_id=2150, codec_pad_id=2148, codec_think_id=2154,
                 codec_nothink_id=2155, codec_think_bos_id=2156, codec_think_eos_id=2157)
# Qwen3 added tokens for audio and TTS, after </think> (151668); the text vocabulary stays 151936.
AUDIO_TOKENS = {151669: "<|audio_start|>", 151670: "<|audio_end|>", 151671: "<tts_pad>", 151672: "<tts_text_bos>",
                151673: "<tts_text_eod>", 151674: "<tts_text_bos_single>", 151675: "<|audio_pad|>"}

GENERATION_CONFIG = {"do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0, "top_k": 50,
                     "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_p": 1.0,
                     "subtalker_top_k": 50, "max_new_tokens": 8192}

_TALKER_06B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                   num_key_value_heads=8, head_dim=128, text_hidden_size=2048, mrope_section=[24, 20, 20])
_PREDICTOR = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=5, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128)
# (talker dims, code predictor dims, decoder_config overrides or None for the published one, dtype, size tag)
_PRESETS = {
    "tiny": (dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, text_hidden_size=32, mrope_section=[2, 3, 3]),
             dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8),
             dict(hidden_size=32, latent_dim=48, codebook_dim=32, num_attention_heads=2, num_key_value_heads=2,
                  head_dim=16, intermediate_size=64, num_hidden_layers=2, decoder_dim=32),
             torch.float32, "0b6"),
    "mini": (dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, text_hidden_size=128, mrope_section=[12, 10, 10]),
             dict(hidden_size=128, intermediate_size=384, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32),
             dict(hidden_size=128, latent_dim=128, codebook_dim=64, num_attention_heads=4, num_key_value_heads=4,
                  head_dim=32, intermediate_size=256, num_hidden_layers=2, decoder_dim=64),
             torch.bfloat16, "0b6"),
    "0.6b": (_TALKER_06B, _PREDICTOR, None, torch.bfloat16, "0b6"),
    "1.7b": ({**_TALKER_06B, "hidden_size": 2048, "intermediate_size": 6144}, _PREDICTOR, None, torch.bfloat16,
             "1b7"),
}


# Voice cloning's modules per preset: (speaker_encoder_config written for Base, or None for the published one
# {enc_dim, sample_rate}; speech_tokenizer encoder_config overrides). Tiny and mini keep every structural
# choice of the released modules (strides, 16 of 32 codebooks of 2048, 128 mel bands) at small widths; tiny's
# encoder attention window (16 frames) is short so that 2-second test clips slide it.
_CLONE_PRESETS = {
    "tiny": (dict(enc_channels=[32, 32, 32, 32, 96], enc_kernel_sizes=[5, 3, 3, 3, 1], enc_dilations=[1, 2, 3, 4, 1],
                  enc_attention_channels=16, enc_res2net_scale=4, enc_se_channels=16),
             dict(num_filters=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                  head_dim=16, intermediate_size=64, codebook_dim=8, vector_quantization_hidden_dimension=8,
                  sliding_window=16, upsample_groups=32)),
    "mini": (dict(enc_channels=[64, 64, 64, 64, 192], enc_kernel_sizes=[5, 3, 3, 3, 1], enc_dilations=[1, 2, 3, 4, 1],
                  enc_attention_channels=32, enc_res2net_scale=8, enc_se_channels=32),
             dict(num_filters=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                  head_dim=16, intermediate_size=256, codebook_dim=32, vector_quantization_hidden_dimension=32,
                  upsample_groups=64)),
    "0.6b": (None, {}),
    "1.7b": (None, {}),
}


def model_config(preset: str, variant: str) -> dict:
    """config.json of a preset, shaped like the published files (transformers 4.x keys)."""
    if preset not in _PRESETS:
        raise CheckpointWriteError(f"unknown preset {preset!r}; expected one of {', '.join(PRESETS)}")
    if variant not in VARIANTS:
        raise CheckpointWriteError(f"unknown variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    talker_dims, predictor_dims, _, dtype, size = _PRESETS[preset]
    t = dict(talker_dims)
    section = t.pop("mrope_section")
    common = dict(hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1000000, attention_bias=False,
                  attention_dropout=0.0, use_sliding_window=False, sliding_window=None, initializer_range=0.02,
                  max_position_embeddings=32768, use_cache=True, tie_word_embeddings=False)
    predictor = dict(common, **predictor_dims, vocab_size=2048, num_code_groups=16, max_window_layers=28,
                     layer_types=["full_attention"] * predictor_dims["num_hidden_layers"],
                     model_type="qwen3_tts_talker_code_predictor")
    custom = variant == "custom_voice"
    talker = dict(common, **t, vocab_size=3072, text_vocab_size=151936, num_code_groups=16,
                  rope_scaling={"interleaved": True, "mrope_section": section, "rope_type": "default"},
                  code_predictor_config=predictor, codec_language_id=dict(LANGUAGES),
                  spk_id=dict(SPEAKERS) if custom else {},
                  spk_is_dialect={s: SPEAKER_DIALECT.get(s, False) for s in SPEAKERS} if custom else {},
                  model_type="qwen3_tts_talker", **CODEC_IDS)
    config = {"architectures": ["Qwen3TTSForConditionalGeneration"], "model_type": "qwen3_tts",
              "tokenizer_type": "qwen3_tts_tokenizer_12hz", "tts_model_size": size, "tts_model_type": variant,
              "im_start_token_id": 151644, "im_end_token_id": 151645, "tts_pad_token_id": 151671,
              "tts_bos_token_id": 151672, "tts_eos_token_id": 151673, "talker_config": talker,
              "torch_dtype": str(dtype).removeprefix("torch."),
              "talkgate": {"random_weights": True, "preset": preset}}
    if variant == "base":
        speaker = _CLONE_PRESETS[preset][0]
        config["speaker_encoder_config"] = {**(speaker or {}), "enc_dim": talker["hidden_size"], "sample_rate": 24000}
    return config


def tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Official tensor names and shapes of the Talker + code predictor for a config.json dict."""
    t = config["talker_config"]
    p = t["code_predictor_config"]
    shapes: dict[str, tuple[int, ...]] = {}

    def decoder(prefix: str, d: dict):
        h, hd = d["hidden_size"], d["head_dim"]
        for i in range(d["num_hidden_layers"]):
            n = f"{prefix}.layers.{i}."
            shapes[n + "self_attn.q_proj.weight"] = (d["num_attention_heads"] * hd, h)
            shapes[n + "self_attn.k_proj.weight"] = (d["num_key_value_heads"] * hd, h)
            shapes[n + "self_attn.v_proj.weight"] = (d["num_key_value_heads"] * hd, h)
            shapes[n + "self_attn.o_proj.weight"] = (h, d["num_attention_heads"] * hd)
            shapes[n + "self_attn.q_norm.weight"] = (hd,)
            shapes[n + "self_attn.k_norm.weight"] = (hd,)
            shapes[n + "mlp.gate_proj.weight"] = (d["intermediate_size"], h)
            shapes[n + "mlp.up_proj.weight"] = (d["intermediate_size"], h)
            shapes[n + "mlp.down_proj.weight"] = (h, d["intermediate_size"])
            shapes[n + "input_layernorm.weight"] = (h,)
            shapes[n + "post_attention_layernorm.weight"] = (h,)
        shapes[f"{prefix}.norm.weight"] = (h,)

    H, TH = t["hidden_size"], t["text_hidden_size"]
    decoder("talker.model", t)
    shapes["talker.model.codec_embedding.weight"] = (t["vocab_size"], H)
    shapes["talker.model.text_embedding.weight"] = (t["text_vocab_size"], TH)
    shapes["talker.text_projection.linear_fc1.weight"] = (TH, TH)
    shapes["talker.text_projection.linear_fc1.bias"] = (TH,)
    shapes["talker.text_projection.linear_fc2.weight"] = (H, TH)
    shapes["talker.text_projection.linear_fc2.bias"] = (H,)
    shapes["talker.codec_head.weight"] = (t["vocab_size"], H)
    decoder("talker.code_predictor.model", p)
    for g in range(p["num_code_groups"] - 1):
        shapes[f"talker.code_predictor.model.codec_embedding.{g}.weight"] = (p["vocab_size"], H)
        shapes[f"talker.code_predictor.lm_head.{g}.weight"] = (p["vocab_size"], p["hidden_size"])
    if p["hidden_size"] != H:
        shapes["talker.code_predictor.small_to_mtp_projection.weight"] = (p["hidden_size"], H)
        shapes["talker.code_predictor.small_to_mtp_projection.bias"] = (p["hidden_size"],)
    if config["tts_model_type"] == "base":
        from talkgate.synth.config import SpeakerEncoderConfig
        from talkgate.synth.speaker_encoder import SpeakerEncoder
        with torch.device("meta"):
            encoder = SpeakerEncoder(SpeakerEncoderConfig.parse(config["speaker_encoder_config"], H))
        shapes.update({"speaker_encoder." + n: tuple(p.shape) for n, p in encoder.named_parameters()})
    return shapes


def random_tensor(name: str, shape: tuple[int, ...], seed: int, dtype: torch.dtype) -> torch.Tensor:
    if name.endswith(".bias"):
        return torch.zeros(shape, dtype=dtype)
    if "norm" in name.rpartition(".")[0].rpartition(".")[2]:        # *_layernorm, norm, q_norm, k_norm
        return torch.ones(shape, dtype=dtype)
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    # the speaker encoder's convolutions keep their activations' scale (std fan_in^-0.5), so that the x-vector
    # depends on the audio; its last one scales the x-vector to the codec embeddings' 0.02
    std = (torch.Size(shape[1:]).numel() ** -0.5 * (0.02 if name.startswith("speaker_encoder.fc.") else 1.0)
           if name.startswith("speaker_encoder.") else 0.02)
    return (torch.randn(shape, generator=gen) * std).to(dtype)


def _write_weights(out: Path, shapes: dict[str, tuple[int, ...]], seed: int, dtype: torch.dtype) -> None:
    from safetensors.torch import save_file

    itemsize = torch.empty((), dtype=dtype).element_size()
    groups, size = [[]], 0
    for name, shape in shapes.items():
        nbytes = itemsize * int(torch.Size(shape).numel())
        if groups[-1] and size + nbytes > SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    files = (["model.safetensors"] if len(groups) == 1 else
             [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))])
    weight_map, total = {}, 0
    for file, names in zip(files, groups):
        shard = {n: random_tensor(n, shapes[n], seed, dtype) for n in names}
        total += sum(t.numel() * t.element_size() for t in shard.values())
        save_file(shard, str(out / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in names})
        del shard
    if len(files) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _write_tokenizer(out: Path) -> None:
    src = qwen_tokenizer_dir()
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(src / name, out / name)
    config = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    added = config.setdefault("added_tokens_decoder", {})
    for token_id, content in AUDIO_TOKENS.items():
        added[str(token_id)] = {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                                "single_word": False, "special": True}
    config.pop("chat_template", None)      # a chat LLM's template; the TTS prompt is built in code
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def create_checkpoint(out_dir: str | Path, preset: str = "mini", variant: str = "custom_voice",
                            seed: int = 0) -> Path:
    """Write the checkpoint directory; an existing non-empty directory is refused."""
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise CheckpointWriteError(f"{out}: exists and is not empty")
    config = model_config(preset, variant)
    _, _, decoder_config, dtype, _ = _PRESETS[preset]
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(str(out) + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (tmp / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")
    _write_tokenizer(tmp)
    _write_weights(tmp, tensor_shapes(config), seed, dtype)
    # the speech tokenizer's weights are scaled by statistics of forward passes, whose float sums depend on the
    # number of threads torch splits them over: one thread, so that the same seed writes the same bytes
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        write_random_codec_decoder(tmp / "speech_tokenizer", copy.deepcopy(decoder_config), seed,
                                   encoder_config=copy.deepcopy(_CLONE_PRESETS[preset][1]))
    finally:
        torch.set_num_threads(threads)
    for item in tmp.iterdir():
        item.rename(out / item.name)
    tmp.rmdir()
    return out
