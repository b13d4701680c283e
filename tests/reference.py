"""Import the official Qwen3-TTS reference (PyPI qwen-tts-compat, package `qwen_tts`) for parity tests.

`qwen_tts` imports its 25 Hz tokenizer, which imports `torchaudio.compliance.kaldi`; the 12 Hz model
never calls it. When torchaudio is absent we register empty stand-in modules before the import
(tests and tools only: talkgate itself never imports qwen_tts).

Use:
    from tests.reference import ref, tiny_config
    model = ref.Qwen3TTSForConditionalGeneration(tiny_config()).eval()
"""
from __future__ import annotations

import copy
import importlib.machinery
import importlib.util
import sys
import types


def _install_torchaudio_standin() -> None:
    if importlib.util.find_spec("torchaudio") is not None or "torchaudio" in sys.modules:
        return
    names = ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi")
    for name in names:
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules[name] = mod
    sys.modules["torchaudio"].compliance = sys.modules["torchaudio.compliance"]
    sys.modules["torchaudio.compliance"].kaldi = sys.modules["torchaudio.compliance.kaldi"]


import transformers  # noqa: E402,F401  (imported before the stand-in is visible to it)

_install_torchaudio_standin()

from qwen_tts.core import models as _models  # noqa: E402
from qwen_tts.core.tokenizer_12hz import configuration_qwen3_tts_tokenizer_v2 as _tok_cfg  # noqa: E402
from qwen_tts.core.tokenizer_12hz import modeling_qwen3_tts_tokenizer_v2 as _tok_model  # noqa: E402


class ref:
    """The reference classes, in one namespace."""

    Qwen3TTSConfig = _models.Qwen3TTSConfig
    Qwen3TTSForConditionalGeneration = _models.Qwen3TTSForConditionalGeneration
    modeling = sys.modules["qwen_tts.core.models.modeling_qwen3_tts"]
    TokenizerV2Config = _tok_cfg.Qwen3TTSTokenizerV2Config
    DecoderConfig = _tok_cfg.Qwen3TTSTokenizerV2DecoderConfig
    Decoder = _tok_model.Qwen3TTSTokenizerV2Decoder
    tokenizer_modeling = _tok_model
    Tokenizer = sys.modules["qwen_tts.inference.qwen3_tts_tokenizer"].Qwen3TTSTokenizer
    TTSModel = sys.modules["qwen_tts.inference.qwen3_tts_model"].Qwen3TTSModel
    Processor = sys.modules["qwen_tts.core.models.processing_qwen3_tts"].Qwen3TTSProcessor


# Control ids as in the real checkpoints (docs: shared/reference/qwen3-tts.md "Ids").
CODEC_IDS = dict(codec_bos_id=2149, codec_eos_token_id=2150, codec_pad_id=2148, codec_think_id=2154,
                 codec_nothink_id=2155, codec_think_bos_id=2156, codec_think_eos_id=2157)
LANGUAGES = {"english": 2050, "german": 2053, "spanish": 2054, "chinese": 2055, "japanese": 2058,
             "french": 2061, "sichuan_dialect": 2062, "korean": 2064, "russian": 2069, "italian": 2070,
             "portuguese": 2071, "beijing_dialect": 2074}
SPEAKERS = {"serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861,
            "ono_anna": 2873, "sohee": 2864, "eric": 2875, "dylan": 2878}
DIALECTS = {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}

_TINY_TALKER = dict(vocab_size=3072, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=1e6,
                    rope_scaling={"interleaved": True, "mrope_section": [2, 3, 3], "rope_type": "default"},
                    text_vocab_size=151936, text_hidden_size=48, num_code_groups=16,
                    max_position_embeddings=4096, pad_token_id=None, **CODEC_IDS)
# A tiny ECAPA speaker encoder (Base); enc_dim is the Talker's hidden size.
TINY_SPEAKER_ENCODER = dict(mel_dim=128, enc_channels=[32, 32, 32, 32, 96], enc_kernel_sizes=[5, 3, 3, 3, 1],
                            enc_dilations=[1, 2, 3, 4, 1], enc_attention_channels=16, enc_res2net_scale=4,
                            enc_se_channels=16, sample_rate=24000)
_TINY_PREDICTOR = dict(vocab_size=2048, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=1e6,
                       num_code_groups=16, max_position_embeddings=4096, pad_token_id=None)


def tiny_config(variant: str = "custom_voice", *, separate_predictor_hidden: bool = True, model_size: str = "0b6",
                talker: dict | None = None, predictor: dict | None = None):
    """A reference Qwen3TTSConfig at toy sizes with the real control ids, speakers and languages.

    With separate_predictor_hidden the code predictor's hidden (32) differs from the Talker's (64),
    so `small_to_mtp_projection` exists as in the 1.7B models.
    """
    t = copy.deepcopy(_TINY_TALKER)
    cp = copy.deepcopy(_TINY_PREDICTOR)
    if not separate_predictor_hidden:
        cp.update(hidden_size=t["hidden_size"])
    t.update(talker or {})
    cp.update(predictor or {})
    t["code_predictor_config"] = cp
    t["codec_language_id"] = dict(LANGUAGES)
    if variant == "custom_voice":
        t["spk_id"] = dict(SPEAKERS)
        t["spk_is_dialect"] = {name: DIALECTS.get(name, False) for name in SPEAKERS}
    else:
        t["spk_id"], t["spk_is_dialect"] = {}, {}
    speaker = dict(TINY_SPEAKER_ENCODER, enc_dim=t["hidden_size"]) if variant == "base" else None
    return ref.Qwen3TTSConfig(talker_config=t, tts_model_type=variant, tts_model_size=model_size,
                              speaker_encoder_config=speaker,
                              tokenizer_type="qwen3_tts_tokenizer_12hz",
                              im_start_token_id=151644, im_end_token_id=151645, tts_pad_token_id=151671,
                              tts_bos_token_id=151672, tts_eos_token_id=151673)


def load_reference_tokenizer(path, **kwargs):
    """The reference's speech tokenizer (Qwen3TTSTokenizer.from_pretrained, kwargs as its: dtype, device_map).

    With transformers 5.17 from_pretrained leaves the decoder's RoPE inverse frequencies (a non-persistent
    buffer) as uninitialized memory on the CPU (the compat fork repairs only all-zero ones), so they are
    recomputed here by a fresh rotary module of the same config: the reference's own values."""
    tokenizer = ref.Tokenizer.from_pretrained(str(path), **kwargs)
    for module in tokenizer.model.modules():
        if "RotatoryEmbedding" in type(module).__name__ or "RotaryEmbedding" in type(module).__name__:
            fresh = type(module)(module.config)
            module.inv_freq = fresh.inv_freq.to(module.inv_freq.device)
            module.original_inv_freq = module.inv_freq
    return tokenizer


def save_reference(model, out_dir) -> None:
    """The reference's own save_pretrained (config.json, generation_config.json, model.safetensors).

    transformers 5.x expects `_tied_weights_keys` to be a dict; the reference declares lists (and ties
    nothing, tie_word_embeddings=False), which makes save_pretrained fail: clear them first."""
    for module in model.modules():
        if isinstance(getattr(module, "_tied_weights_keys", None), list):
            module._tied_weights_keys = None
    model.save_pretrained(str(out_dir))
