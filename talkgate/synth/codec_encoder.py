"""The 12 Hz speech tokenizer's encoder (the `speech_tokenizer` encoder): 24 kHz audio -> codes [T, 16].

A Mimi encoder (Kyutai's codec, as transformers' MimiModel builds it; the reference keeps its encoder half):
SEANet convolutions (a causal conv, then for each stride of reversed(upsampling_ratios) = 4, 5, 6, 8 a
residual block, ELU and a strided causal conv doubling the channels; ELU and a last conv to hidden_size:
25 frames a second) -> a causal transformer (LayerNorm, RoPE, sliding window of `sliding_window` frames,
layer scale, GELU MLP) -> a strided conv with replicate padding (12.5 frames a second) -> split residual
vector quantization: codebook 0 from the semantic quantizer, codebooks 1..15 from the first 15 layers of the
acoustic quantizer, each on its own projection of the same embedding. Nearest codebook entry by Euclidean
distance (torch.cdist in float32, as the reference). The reference encodes all `num_quantizers` (32) and
keeps the first `encoder_valid_num_quantizers` (16); residual quantization makes the first 16 independent
of the rest, so only those are built. A clip of N samples gives ceil(N / 1920) frames.

Causal convs pad on the left by (kernel - 1) * dilation + 1 - stride and on the right by what completes the
last stride (zeros; the downsample conv repeats the edge value), as MimiConv1d does. Tensor names are the
file's, less the `encoder.` prefix; the file's quantizer output projections, `initialized` flags and
codebooks past the 16th are known and skipped.

    enc = load_codec_encoder(speech_tokenizer_dir, device, dtype)
    codes = enc.encode(wav_24k)                 # float32 [N] in [-1, 1] -> long [ceil(N / 1920), 16]
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from talkgate.synth.speech_tokenizer import (
    CONFIG_FILE, CodecCheckpointError, check_model_type, digest, read_codec_config, read_half,
)

PREFIX = "encoder."
FRAME_SAMPLES = 1920

@dataclass(frozen=True)
class CodecEncoderConfig:
    """`encoder_config` of speech_tokenizer/config.json (defaults: MimiConfig's) plus the top-level
    `encoder_valid_num_quantizers`."""

    hidden_size: int = 512
    num_filters: int = 64
    num_residual_layers: int = 1
    upsampling_ratios: tuple[int, ...] = (8, 6, 5, 4)
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    compress: int = 2
    pad_mode: str = "constant"
    codebook_size: int = 2048
    codebook_dim: int = 256
    num_quantizers: int = 32
    vector_quantization_hidden_dimension: int = 256
    num_hidden_layers: int = 8
    intermediate_size: int = 2048
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int = 0                   # 0: hidden_size // num_attention_heads
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int = 250
    sampling_rate: int = 24000
    valid_quantizers: int = 16          # top-level encoder_valid_num_quantizers

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, config: dict, source: str = CONFIG_FILE) -> "CodecEncoderConfig":
        """Parse a whole speech_tokenizer config (top level with `encoder_config`)."""
        check_model_type(config, source)
        enc = config.get("encoder_config")
        if not isinstance(enc, dict):
            raise CodecCheckpointError(f"{source}: encoder_config is required (the voice-cloning encoder)")
        names = {f.name for f in fields(cls)}
        kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in enc.items() if k in names and v is not None}
        kw["head_dim"] = kw.get("head_dim") or 0
        rope = enc.get("rope_parameters") or enc.get("rope_scaling") or {}
        kw["rope_theta"] = float(enc.get("rope_theta", rope.get("rope_theta", 10000.0)))
        kw["valid_quantizers"] = int(config.get("encoder_valid_num_quantizers", 16))
        cfg = cls(**kw)
        problems = []
        for key, want in (("audio_channels", 1), ("use_causal_conv", True), ("use_conv_shortcut", False),
                          ("hidden_act", "gelu"), ("num_semantic_quantizers", 1), ("attention_bias", False),
                          ("normalize", False)):
            if enc.get(key, want) != want:
                problems.append(f"{key} {enc[key]!r} (only {want!r})")
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            problems.append("rope_type (only default RoPE)")
        stride = math.prod(cfg.upsampling_ratios) * 2
        if config.get("encode_downsample_rate", FRAME_SAMPLES) != FRAME_SAMPLES or stride != FRAME_SAMPLES:
            problems.append(f"prod(upsampling_ratios) * 2 = {stride} samples a frame (expected {FRAME_SAMPLES})")
        if float(enc.get("frame_rate", 12.5)) * FRAME_SAMPLES != cfg.sampling_rate or cfg.sampling_rate != 24000:
            problems.append("frame_rate / sampling_rate (expected 12.5 frames a second at 24 kHz)")
        if not 2 <= cfg.valid_quantizers <= cfg.num_quantizers:
            problems.append(f"encoder_valid_num_quantizers {cfg.valid_quantizers} (2..num_quantizers)")
        if cfg.vector_quantization_hidden_dimension not in (cfg.codebook_dim, cfg.hidden_size) or (
                cfg.vector_quantization_hidden_dimension == cfg.hidden_size and cfg.codebook_dim != cfg.hidden_size):
            problems.append("codebook_dim must equal vector_quantization_hidden_dimension")
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            problems.append("num_attention_heads must be a multiple of num_key_value_heads")
        if cfg.pad_mode not in ("constant", "replicate"):
            problems.append(f"pad_mode {cfg.pad_mode!r}")
        if problems:
            raise CodecCheckpointError(f"{source}: unsupported encoder_config: " + "; ".join(problems))
        return cfg


class CausalConv(nn.Module):
    """MimiConv1d with causal padding: (kernel - 1) * dilation + 1 - stride on the left, on the right what
    completes the last stride, so that N inputs give ceil(N / stride) outputs."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1, dilation: int = 1, bias: bool = True,
                 pad_mode: str = "constant"):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, stride, dilation=dilation, bias=bias)
        self.stride, self.left, self.pad_mode = stride, (kernel - 1) * dilation + 1 - stride, pad_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-1]
        right = -(-n // self.stride) * self.stride - n
        return self.conv(F.pad(x, (self.left, right), mode=self.pad_mode))


class ResnetBlock(nn.Module):
    """x + conv(ELU(conv(ELU(x)))): kernel residual_kernel_size to dim / compress, then 1 back to dim."""

    def __init__(self, cfg: CodecEncoderConfig, dim: int, dilation: int):
        super().__init__()
        hidden = dim // cfg.compress
        self.block = nn.ModuleList([nn.ELU(), CausalConv(dim, hidden, cfg.residual_kernel_size, dilation=dilation,
                                                         pad_mode=cfg.pad_mode),
                                    nn.ELU(), CausalConv(hidden, dim, 1, pad_mode=cfg.pad_mode)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for layer in self.block:
            h = layer(h)
        return x + h


class SEANet(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig):
        super().__init__()
        f, mode = cfg.num_filters, cfg.pad_mode
        layers: list[nn.Module] = [CausalConv(1, f, cfg.kernel_size, pad_mode=mode)]
        scale = 1
        for ratio in reversed(cfg.upsampling_ratios):
            dim = scale * f
            layers += [ResnetBlock(cfg, dim, cfg.dilation_growth_rate ** j) for j in range(cfg.num_residual_layers)]
            layers += [nn.ELU(), CausalConv(dim, 2 * dim, 2 * ratio, stride=ratio, pad_mode=mode)]
            scale *= 2
        layers += [nn.ELU(), CausalConv(scale * f, cfg.hidden_size, cfg.last_kernel_size, pad_mode=mode)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig):
        super().__init__()
        hd = cfg.attn_head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * hd, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.heads * hd, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), 0.01))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn_layer_scale.scale * self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp_layer_scale.scale * self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    """Causal, sliding window of `sliding_window` frames (the query's own frame included), RoPE from 0."""

    def __init__(self, cfg: CodecEncoderConfig):
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.window, self.theta, self.head_dim = cfg.sliding_window, cfg.rope_theta, cfg.attn_head_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        pos = torch.arange(T, dtype=torch.float32)
        angle = (pos[:, None] * inv_freq[None]).to(x.device)
        angle = torch.cat([angle, angle], dim=-1)
        cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
        q, k = torch.arange(T, device=x.device)[:, None], torch.arange(T, device=x.device)[None]
        mask = (k <= q) & (k > q - self.window)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return x


class Codebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embed_sum", torch.zeros(size, dim))
        self.register_buffer("embed", torch.zeros(size, dim), persistent=False)

    def prepare(self):
        self.embed = self.embed_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class VectorQuantization(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.codebook = Codebook(size, dim)


class ResidualVQ(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig, layers: int):
        super().__init__()
        dim = cfg.vector_quantization_hidden_dimension
        self.input_proj = nn.Conv1d(cfg.hidden_size, dim, 1, bias=False) if dim != cfg.hidden_size else None
        self.layers = nn.ModuleList(VectorQuantization(cfg.codebook_size, cfg.codebook_dim) for _ in range(layers))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, hidden, T] -> codes [layers, B, T]: each layer takes the residual's nearest entry."""
        residual = self.input_proj(x) if self.input_proj is not None else x
        codes = []
        for layer in self.layers:
            flat = residual.permute(0, 2, 1)                                   # [B, T, dim]
            embed = layer.codebook.embed
            ids = torch.cdist(flat.reshape(-1, flat.shape[-1])[None].float(), embed[None].float(), p=2)[0].argmin(-1)
            ids = ids.view(flat.shape[:-1])
            residual = residual - F.embedding(ids, embed).permute(0, 2, 1)
            codes.append(ids)
        return torch.stack(codes)


class SplitResidualVQ(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig):
        super().__init__()
        self.semantic_residual_vector_quantizer = ResidualVQ(cfg, 1)
        self.acoustic_residual_vector_quantizer = ResidualVQ(cfg, cfg.valid_quantizers - 1)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.semantic_residual_vector_quantizer.encode(x),
                          self.acoustic_residual_vector_quantizer.encode(x)])


class CodecEncoder(nn.Module):
    """Mimi's encoder half, the first `valid_quantizers` codebooks."""

    def __init__(self, cfg: CodecEncoderConfig):
        super().__init__()
        self.config = cfg
        self.encoder = SEANet(cfg)
        self.encoder_transformer = Transformer(cfg)
        self.downsample = CausalConv(cfg.hidden_size, cfg.hidden_size, 4, stride=2, bias=False, pad_mode="replicate")
        self.quantizer = SplitResidualVQ(cfg)

    @torch.no_grad()
    def prepare(self) -> "CodecEncoder":
        for m in self.modules():
            if isinstance(m, Codebook):
                m.prepare()
        return self

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        """wav [B, N] -> codes [B, valid_quantizers, ceil(N / 1920)] long."""
        return self.quantizer.encode(self.embeddings(wav)).transpose(0, 1)

    def embeddings(self, wav: torch.Tensor) -> torch.Tensor:
        """wav [B, N] -> the quantizers' input [B, hidden, ceil(N / 1920)]."""
        h = self.encoder(wav[:, None])
        return self.downsample(self.encoder_transformer(h.transpose(1, 2)).transpose(1, 2))

    @torch.inference_mode()
    def encode(self, wav) -> torch.Tensor:
        """One clip: float32 [N] at 24 kHz -> codes [ceil(N / 1920), valid_quantizers] long, on the CPU."""
        w = self.downsample.conv.weight
        wav = torch.as_tensor(wav).to(device=w.device, dtype=w.dtype)
        return self(wav[None])[0].T.cpu()


# ---------------------------------------------------------------------------------------------------
# Loading (speech_tokenizer/model.safetensors, `encoder.*`)


def unused_tensor_shapes(cfg: CodecEncoderConfig) -> dict[str, tuple[int, ...]]:
    """Names (without the prefix) and shapes of the file's encoder tensors that encoding the first
    `valid_quantizers` codebooks does not read."""
    shapes, dim = {}, cfg.vector_quantization_hidden_dimension
    for rvq, layers in (("semantic", 1), ("acoustic", cfg.num_quantizers - 1)):
        base = f"quantizer.{rvq}_residual_vector_quantizer."
        if dim != cfg.hidden_size:
            shapes[base + "output_proj.weight"] = (cfg.hidden_size, dim, 1)
        used = 1 if rvq == "semantic" else cfg.valid_quantizers - 1
        for i in range(layers):
            shapes[base + f"layers.{i}.codebook.initialized"] = (1,)
            if i >= used:
                shapes[base + f"layers.{i}.codebook.cluster_usage"] = (cfg.codebook_size,)
                shapes[base + f"layers.{i}.codebook.embed_sum"] = (cfg.codebook_size, cfg.codebook_dim)
    return shapes


def load_codec_encoder(speech_tokenizer_dir: str | Path, device="cpu", dtype: torch.dtype = torch.float32) -> CodecEncoder:
    """Load the encoder half of a speech_tokenizer directory (weights cast to `dtype` on `device`)."""
    root = Path(speech_tokenizer_dir)
    path = root / CONFIG_FILE
    cfg = CodecEncoderConfig.from_dict(read_codec_config(path), str(path))
    with torch.device("meta"):
        model = CodecEncoder(cfg)
    state = read_half(root, model, PREFIX, "encoder", set(unused_tensor_shapes(cfg)))
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(state):
        digest(h, name, state[name])
    model.load_state_dict(state, strict=True, assign=True)
    model.weights_digest = h.hexdigest()      # the weights as stored: part of a Base model's voice_key
    for m in model.modules():                        # derived buffers, still on meta: computed by prepare()
        if isinstance(m, Codebook):
            m.embed = torch.empty_like(m.embed_sum)
    return model.to(device=device, dtype=dtype).prepare().eval().requires_grad_(False)
