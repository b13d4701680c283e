"""Plain dataclasses parsed from a checkpoint's config.json and generation_config.json.

The official config.json (model_type "qwen3_tts") nests `talker_config`, which nests
`code_predictor_config`. RoPE settings appear as `rope_scaling` + `rope_theta` (files written by
transformers 4.x, as published) or as `rope_parameters` (files written by transformers 5.x): both
are read. A talkgate-generated checkpoint carries a `talkgate` block ({"random_weights": true,
"preset": ...}); official checkpoints do not.
"""
from __future__ import annotations

from dataclasses import dataclass, field


class ConfigError(ValueError):
    """config.json / generation_config.json is not a Qwen3-TTS 12 Hz config talkgate can run."""


MODEL_TYPE = "qwen3_tts"
VARIANTS = ("custom_voice", "base", "voice_design")


def _need(d: dict, key: str, where: str):
    if key not in d:
        raise ConfigError(f"{where}: missing key {key!r}")
    return d[key]


def _rope(d: dict, where: str) -> tuple[float, dict]:
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ConfigError(f"{where}: rope_type {rope_type!r} is not supported (only 'default')")
    return float(theta), rope


@dataclass(frozen=True)
class DecoderDims:
    """One Qwen3 decoder stack (q/k RMSNorm, GQA, SwiGLU MLP)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float

    @classmethod
    def parse(cls, d: dict, where: str) -> "DecoderDims":
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"{where}: hidden_act {act!r} is not supported (only 'silu')")
        if d.get("attention_bias", False):
            raise ConfigError(f"{where}: attention_bias=true is not supported")
        if d.get("use_sliding_window", False):
            raise ConfigError(f"{where}: use_sliding_window=true is not supported")
        hidden = int(_need(d, "hidden_size", where))
        heads = int(_need(d, "num_attention_heads", where))
        theta, _ = _rope(d, where)
        return cls(hidden_size=hidden, intermediate_size=int(_need(d, "intermediate_size", where)),
                   num_layers=int(_need(d, "num_hidden_layers", where)), num_heads=heads,
                   num_kv_heads=int(d.get("num_key_value_heads") or heads),
                   head_dim=int(d.get("head_dim") or hidden // heads),
                   rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)), rope_theta=theta)


@dataclass(frozen=True)
class PredictorConfig:
    dims: DecoderDims
    vocab_size: int            # 2048 codes per acoustic codebook
    num_code_groups: int       # 16: the predictor has num_code_groups - 1 embeddings and heads


@dataclass(frozen=True)
class TalkerConfig:
    dims: DecoderDims
    mrope_section: tuple[int, ...]
    mrope_interleaved: bool
    vocab_size: int            # 3072: codebook 0 (2048) + control ids, languages, speakers
    text_vocab_size: int
    text_hidden_size: int
    num_code_groups: int
    codec_bos: int
    codec_eos: int
    codec_pad: int
    codec_think: int
    codec_nothink: int
    codec_think_bos: int
    codec_think_eos: int
    speakers: dict[str, int]           # spk_id, names lower-case, config order
    speaker_dialect: dict[str, str]    # speaker -> dialect language name (only dialect speakers)
    languages: dict[str, int]          # codec_language_id, dialects included
    predictor: PredictorConfig

    @classmethod
    def parse(cls, d: dict) -> "TalkerConfig":
        where = "config.json talker_config"
        dims = DecoderDims.parse(d, where)
        _, rope = _rope(d, where)
        section = tuple(int(x) for x in rope.get("mrope_section", ()))
        if not section:
            raise ConfigError(f"{where}: rope mrope_section is missing")
        if 2 * sum(section) != dims.head_dim:
            raise ConfigError(f"{where}: mrope_section {list(section)} does not cover head_dim {dims.head_dim}")
        cp = _need(d, "code_predictor_config", where)
        cp_where = where + ".code_predictor_config"
        predictor = PredictorConfig(dims=DecoderDims.parse(cp, cp_where),
                                    vocab_size=int(cp.get("vocab_size", 2048)),
                                    num_code_groups=int(cp.get("num_code_groups", d.get("num_code_groups", 16))))
        speakers = {str(k).lower(): int(v) for k, v in (d.get("spk_id") or {}).items()}
        dialects = {str(k).lower(): str(v) for k, v in (d.get("spk_is_dialect") or {}).items() if v}
        languages = {str(k).lower(): int(v) for k, v in (d.get("codec_language_id") or {}).items()}
        for spk, dialect in dialects.items():
            if dialect not in languages:
                raise ConfigError(f"{where}: speaker {spk!r} has dialect {dialect!r}, not in codec_language_id")
        cfg = cls(dims=dims, mrope_section=section, mrope_interleaved=bool(rope.get("interleaved", False)),
                  vocab_size=int(_need(d, "vocab_size", where)),
                  text_vocab_size=int(_need(d, "text_vocab_size", where)),
                  text_hidden_size=int(_need(d, "text_hidden_size", where)),
                  num_code_groups=int(d.get("num_code_groups", 16)),
                  codec_bos=int(_need(d, "codec_bos_id", where)), codec_eos=int(_need(d, "codec_eos_token_id", where)),
                  codec_pad=int(_need(d, "codec_pad_id", where)), codec_think=int(_need(d, "codec_think_id", where)),
                  codec_nothink=int(_need(d, "codec_nothink_id", where)),
                  codec_think_bos=int(_need(d, "codec_think_bos_id", where)),
                  codec_think_eos=int(_need(d, "codec_think_eos_id", where)),
                  speakers=speakers, speaker_dialect=dialects, languages=languages, predictor=predictor)
        if cfg.num_code_groups != predictor.num_code_groups:
            raise ConfigError(f"{where}: num_code_groups {cfg.num_code_groups} != code predictor's "
                              f"{predictor.num_code_groups}")
        return cfg


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    """`speaker_encoder_config` of a Base checkpoint (the ECAPA-TDNN x-vector encoder). The published files
    give only enc_dim and sample_rate; the rest are the reference config class's defaults."""

    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000

    @classmethod
    def parse(cls, d: dict, talker_hidden: int) -> "SpeakerEncoderConfig":
        where = "config.json speaker_encoder_config"
        kw = {}
        for name, f in cls.__dataclass_fields__.items():
            if d.get(name) is not None:
                kw[name] = tuple(int(x) for x in d[name]) if isinstance(f.default, tuple) else type(f.default)(d[name])
        cfg = cls(**kw)
        lists = (cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations)
        if len({len(x) for x in lists}) != 1 or len(cfg.enc_channels) < 3:
            raise ConfigError(f"{where}: enc_channels, enc_kernel_sizes and enc_dilations must have one length (>= 3)")
        if any(c % cfg.enc_res2net_scale for c in cfg.enc_channels[1:-1]):
            raise ConfigError(f"{where}: the SE-Res2Net channels must be multiples of enc_res2net_scale "
                              f"{cfg.enc_res2net_scale}")
        if cfg.mel_dim != 128 or cfg.sample_rate != 24000:
            raise ConfigError(f"{where}: mel_dim {cfg.mel_dim} / sample_rate {cfg.sample_rate}: the speaker "
                              "encoder's front end is a 128-band log-mel at 24 kHz")
        if cfg.enc_dim != talker_hidden:
            raise ConfigError(f"{where}: enc_dim {cfg.enc_dim} != talker hidden_size {talker_hidden} (the x-vector "
                              "is a Talker input embedding)")
        return cfg


@dataclass(frozen=True)
class TTSConfig:
    talker: TalkerConfig
    model_type: str            # tts_model_type: custom_voice | base | voice_design
    model_size: str            # tts_model_size: 0b6 | 1b7 | preset name
    im_start: int
    im_end: int
    tts_pad: int
    tts_bos: int
    tts_eos: int
    speaker_encoder: SpeakerEncoderConfig | None = None   # Base checkpoints only
    talkgate: dict = field(default_factory=dict)   # marker of talkgate-generated checkpoints
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def untrained(self) -> bool:
        return bool(self.talkgate.get("random_weights", False))

    @classmethod
    def parse(cls, d: dict) -> "TTSConfig":
        model_type = d.get("model_type")
        if model_type != MODEL_TYPE:
            raise ConfigError(f"config.json: model_type {model_type!r} is not {MODEL_TYPE!r}")
        variant = d.get("tts_model_type")
        if variant not in VARIANTS:
            raise ConfigError(f"config.json: tts_model_type {variant!r} is not one of {', '.join(VARIANTS)}")
        talker = TalkerConfig.parse(_need(d, "talker_config", "config.json"))
        speaker = (SpeakerEncoderConfig.parse(d.get("speaker_encoder_config") or {}, talker.dims.hidden_size)
                   if variant == "base" else None)
        return cls(talker=talker, model_type=variant, speaker_encoder=speaker,
                   model_size=str(d.get("tts_model_size") or ""),
                   im_start=int(d.get("im_start_token_id", 151644)), im_end=int(d.get("im_end_token_id", 151645)),
                   tts_pad=int(d.get("tts_pad_token_id", 151671)), tts_bos=int(d.get("tts_bos_token_id", 151672)),
                   tts_eos=int(d.get("tts_eos_token_id", 151673)), talkgate=dict(d.get("talkgate") or {}), raw=d)


@dataclass(frozen=True)
class GenerationConfig:
    """generation_config.json, with the reference's hard defaults for what it leaves out."""

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker_dosample: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    max_new_tokens: int = 2048

    @classmethod
    def parse(cls, d: dict) -> "GenerationConfig":
        kw = {}
        for name, default in cls.__dataclass_fields__.items():
            if d.get(name) is not None:
                kw[name] = type(default.default)(d[name])
        return cls(**kw)
