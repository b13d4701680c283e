"""Deterministic random-weight speech_tokenizer directories, the codec's part of synth/checkpoint.py's checkpoints.

    write_random_codec_decoder(out_dir, decoder_config=None, seed=0, encoder_config=None)

writes config.json as released (speech_tokenizer_config: the published decoder_config and encoder_config, keys
overridden), model.safetensors with random decoder weights (synth/codec_decoder.py's tensors) and, with an
encoder_config, the voice-cloning encoder's (synth/codec_encoder.py's) and preprocessor_config.json.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn as nn

from talkgate.synth import codec_decoder, codec_encoder
from talkgate.synth.codec_decoder import CodecDecoder, CodecDecoderConfig
from talkgate.synth.codec_encoder import CodecEncoder, CodecEncoderConfig, unused_tensor_shapes
from talkgate.synth.speech_tokenizer import CONFIG_FILE, MODEL_TYPE, WEIGHTS_FILE

# decoder_config of the released checkpoints (Qwen/Qwen3-TTS-12Hz-*/speech_tokenizer/config.json).
PUBLISHED_DECODER_CONFIG = {
    "attention_bias": False, "attention_dropout": 0.0, "latent_dim": 1024, "codebook_dim": 512,
    "codebook_size": 2048, "decoder_dim": 1536, "hidden_act": "silu", "hidden_size": 512,
    "intermediate_size": 1024, "layer_scale_initial_scale": 0.01, "max_position_embeddings": 8000,
    "head_dim": 64, "num_attention_heads": 16, "num_hidden_layers": 8, "num_key_value_heads": 16,
    "num_quantizers": 16, "num_semantic_quantizers": 1, "rms_norm_eps": 1e-5, "rope_theta": 10000,
    "semantic_codebook_size": 4096, "sliding_window": 72, "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2], "vector_quantization_hidden_dimension": 512,
}
# encoder_config (a Mimi encoder) of the released checkpoints (synth/codec_encoder.py reads it).
PUBLISHED_ENCODER_CONFIG = {
    "audio_channels": 1, "codebook_dim": 256, "codebook_size": 2048, "compress": 2, "dilation_growth_rate": 2,
    "frame_rate": 12.5, "head_dim": 64, "hidden_act": "gelu", "hidden_size": 512, "intermediate_size": 2048,
    "kernel_size": 7, "last_kernel_size": 3, "layer_scale_initial_scale": 0.01, "max_position_embeddings": 8000,
    "norm_eps": 1e-5, "normalize": False, "num_attention_heads": 8, "num_filters": 64, "num_hidden_layers": 8,
    "num_key_value_heads": 8, "num_quantizers": 32, "num_residual_layers": 1, "num_semantic_quantizers": 1,
    "pad_mode": "constant", "residual_kernel_size": 3, "rope_theta": 10000.0, "sampling_rate": 24000,
    "sliding_window": 250, "trim_right_ratio": 1.0, "upsample_groups": 512, "upsampling_ratios": [8, 6, 5, 4],
    "use_cache": False, "use_causal_conv": True, "use_conv_shortcut": False,
    "vector_quantization_hidden_dimension": 256,
}

# speech_tokenizer/preprocessor_config.json as released (the reference loads it with AutoFeatureExtractor)
PREPROCESSOR_CONFIG = {"chunk_length_s": None, "feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1,
                       "overlap": None, "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True,
                       "sampling_rate": 24000}


def speech_tokenizer_config(decoder_config: dict | None = None, encoder_config: dict | None = None) -> dict:
    """The whole speech_tokenizer/config.json, as released, with decoder_config / encoder_config keys overridden."""
    dec = {**PUBLISHED_DECODER_CONFIG, **(decoder_config or {})}
    frame = math.prod(dec["upsample_rates"]) * math.prod(dec["upsampling_ratios"])
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": MODEL_TYPE,
        "encoder_valid_num_quantizers": 16,
        "input_sample_rate": 24000,
        "output_sample_rate": 24000,
        "decode_upsample_rate": frame,
        "encode_downsample_rate": 1920,
        "encoder_config": {**PUBLISHED_ENCODER_CONFIG, **(encoder_config or {})},
        "decoder_config": dec,
        "transformers_version": "4.57.3",
    }


@torch.no_grad()
def _randomize(model: CodecDecoder, gen: torch.Generator):
    """Weights that make every part of the decoder matter (layer scales and ConvNeXt gammas near 0.3
    rather than the training init near 0), with roughly unit-variance activations."""
    def normal(shape, std):
        return torch.randn(shape, generator=gen) * std

    for name, p in model.named_parameters():
        leaf = name.rpartition(".")[2]
        if leaf == "cluster_usage":
            value = torch.rand(p.shape, generator=gen) + 0.5
        elif leaf == "embedding_sum":
            value = normal(p.shape, 0.5)
        elif leaf in ("alpha", "beta"):
            value = normal(p.shape, 0.3)
        elif leaf in ("scale", "gamma"):
            value = 0.3 + normal(p.shape, 0.05)
        elif leaf == "bias":
            value = normal(p.shape, 0.02)
        elif p.dim() == 1:  # RMSNorm / LayerNorm weights
            value = 1.0 + normal(p.shape, 0.1)
        else:
            owner = model.get_submodule(name.rpartition(".")[0])
            if isinstance(owner, nn.ConvTranspose1d):  # [in, out, k]: each output sums in * k / stride terms
                fan_in = p.shape[0] * p.shape[2] / owner.stride[0]
            else:
                fan_in = p[0].numel()
            # residual-unit branches small, so activations do not grow block after block
            value = normal(p.shape, fan_in ** -0.5 * (0.3 if ".conv2." in name else 1.0))
        p.copy_(value)
    model.prepare()


@torch.no_grad()
def random_encoder_tensors(encoder_config: dict, valid_quantizers: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic random weights for an encoder_config, every tensor of the official layout (with the
    `encoder.` prefix). Convolutions and projections are drawn with std fan_in^-0.5 (residual branches
    smaller) so that activations keep their scale, and each quantizer's codebook entries are random directions
    at the scale of its input on a probe signal: the codes then vary with the audio, as a trained encoder's do."""
    cfg = CodecEncoderConfig.from_dict({"model_type": MODEL_TYPE, "encoder_config": encoder_config,
                                        "encoder_valid_num_quantizers": valid_quantizers})
    gen = torch.Generator().manual_seed(seed + 7919)
    model = CodecEncoder(cfg).eval()
    for name, p in model.named_parameters():
        if name.endswith("scale"):
            p.fill_(0.3)
        elif p.dim() == 1:
            p.copy_((torch.randn(p.shape, generator=gen) * 0.02) if name.endswith("bias") else
                    1.0 + torch.randn(p.shape, generator=gen) * 0.1)
        else:
            gain = 0.3 if ".block.3." in name else 1.0
            p.copy_(torch.randn(p.shape, generator=gen) * gain * p[0].numel() ** -0.5)
    probe = torch.randn(1, codec_encoder.FRAME_SAMPLES * 12, generator=gen) * 0.1
    h = model.embeddings(probe)
    for rvq in (model.quantizer.semantic_residual_vector_quantizer, model.quantizer.acoustic_residual_vector_quantizer):
        x = rvq.input_proj(h) if rvq.input_proj is not None else h
        for layer in rvq.layers:
            book = layer.codebook
            # entries of one norm: with random norms the smallest ones would win whatever the audio (in 256
            # dimensions the norms' spread outweighs the directions')
            entries = torch.randn(book.embed_sum.shape, generator=gen)
            entries *= float(x.std()) * entries.shape[1] ** 0.5 / entries.norm(dim=1, keepdim=True)
            book.embed_sum.copy_(entries)
            book.cluster_usage.copy_(torch.rand(book.cluster_usage.shape, generator=gen) + 0.5)
            book.embed_sum.mul_(book.cluster_usage[:, None])
    tensors = {codec_encoder.PREFIX + k: v.contiguous() for k, v in model.state_dict().items()}
    for name, shape in unused_tensor_shapes(cfg).items():
        tensors[codec_encoder.PREFIX + name] = (torch.ones(shape) if name.endswith(("initialized", "cluster_usage")) else
                                  torch.randn(shape, generator=gen) * 0.02)
    return tensors


def write_random_codec_decoder(out_dir: str | Path, decoder_config: dict | None = None, seed: int = 0,
                               encoder_config: dict | None = None) -> Path:
    """Write a speech tokenizer directory (config.json + model.safetensors, official names) with
    deterministic random decoder weights; with `encoder_config` (overrides of the released one) also the
    voice-cloning encoder's (random_encoder_tensors) and preprocessor_config.json, as
    released. `out_dir` is the speech_tokenizer directory itself. The last conv is scaled by a power of two so
    that the waveform of random codes stays well inside [-1, 1] (std near 0.1, little clamping)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = speech_tokenizer_config(decoder_config, encoder_config)
    cfg = CodecDecoderConfig.from_dict(config)
    gen = torch.Generator().manual_seed(seed)
    model = CodecDecoder(cfg).eval()
    _randomize(model, gen)
    codes = torch.randint(0, cfg.codebook_size, (2, cfg.num_quantizers, 6), generator=gen)
    final = model.decoder[-1].conv
    for _ in range(4):
        wav = model.decode(codes)
        std = float(wav.std())
        if wav.abs().max() < 0.99 or std == 0:
            break
        final.weight.data /= 16
        final.bias.data /= 16
        model.prepare()                  # the next decode takes the weights as they are now
    if std > 0:
        gain = 2.0 ** round(math.log2(0.1 / std))
        final.weight.data *= gain
        final.bias.data *= gain
    tensors = {codec_decoder.PREFIX + k: v.contiguous() for k, v in model.state_dict().items()}
    if encoder_config is not None:
        tensors.update(random_encoder_tensors(config["encoder_config"], config["encoder_valid_num_quantizers"], seed))
        (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2) + "\n")
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return out
