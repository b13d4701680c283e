"""Code2Wav: the Qwen3-TTS 12 Hz codec decoder (the `speech_tokenizer` decoder), full and incremental.

Codes [B, 16, T] (1 semantic + 15 acoustic codebooks per 80 ms frame) -> 24 kHz waveform, 1920 samples
per frame: split RVQ lookup -> causal pre-conv -> 8-layer causal transformer (sliding window of 72
frames, RoPE, layer scale) -> 2 x (transposed conv + ConvNeXt) -> conv -> 4 x (SnakeBeta, transposed
conv, 3 dilated residual units) -> SnakeBeta -> conv -> clamp to [-1, 1]. Parameter names are the
checkpoint's own, less the `decoder.` prefix (the file also holds the voice-cloning encoder's `encoder.*`
tensors: synth/codec_encoder.py).

Every convolution is causal and attention only looks 71 frames back, so carrying each conv's last
input frames and a 72-frame key/value ring per slot reproduces a full-sequence decode exactly, one
frame (or any number of frames) at a time. API (stable; the streaming engine builds on it):

    dec = load_codec_decoder(speech_tokenizer_dir, device, dtype)   # -> CodecDecoder, eval, no grad
    wav = dec.decode(codes)                   # [B, 16, T] long -> [B, T * 1920] float32 (offline)
    state = dec.alloc_state(num_slots)        # DecoderState: zeroed pools for num_slots contexts
    pcm = dec.decode_step(codes, slots, state)   # codes [B, 16, n], slots [B] long -> [B, n * 1920] float32
    state.reset_slots(slots)                  # a slot starts a new utterance (zero history)

`decode_step` reads and updates only the state of `slots` (distinct within a call, except padding
rows, which may share one scratch slot whose state is then garbage). Concatenating the pcm of
successive calls for a slot equals `decode` of the concatenated codes. With n == 1 and a fixed B the
step has static shapes, no host sync and no branching on tensor values, so it can be captured in a
CUDA graph (slots, codes and the state tensors are read in place; copy new inputs into the captured
tensors before replay; give each captured batch size its own graph). Its PyTorch path also traces whole
under torch.compile(fullgraph=True). Codes must lie in [0, codebook_size): the step does not check them.
State per slot at the released size: 135k conv-tail values + 8 x 72 x 2 x 1024 K/V values (5.3 MB
fp32, 2.6 MB bf16/fp16).

A one-frame step (n == 1) on CUDA runs each layer's attention, from the fused q/k/v projection to
o_proj, as one Triton kernel (synth/window_attention.py: RoPE from the position, the ring write and
attention over the row's own ring), without the per-step RoPE tables and mask of `_window`; each
layer-scaled residual add is fused with the norm after it (one kernel each once compile_hot_functions
has compiled RMSNorm.residual and Mlp.forward). At batch 1 the step is bound by its number of kernels:
the transformer's went from about 155 to 67 (8 a layer: q/k/v, attention, o_proj, add + norm, gate/up,
silu * up, down, add + norm). Several frames per row, and the CPU, keep the PyTorch path
(`KERNEL_ON_CPU` runs the kernel on CPU tensors in Triton's interpreter, for tests).

The conv stack after the transformer works on [B, n, C] (channels last, as the transformer's output is): on
cuDNN as height-1 NHWC convolutions, without layout conversions or transposes between blocks (CausalConv).

Derived tensors (codebooks divided by their usage, exp of the Snake parameters, RoPE frequencies,
q/k/v and gate/up weights concatenated, the convs' weights channels-last and the transposed convs' in their
multiply's layout: about 87 M values at the released size) are buffers computed by `prepare()` from the
parameters; the loader calls it, and whoever changes weights calls it again.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from talkgate.synth.sampling import kernel_module
from talkgate.synth.speech_tokenizer import CONFIG_FILE, CodecCheckpointError, check_model_type, read_codec_config, read_half

PREFIX = "decoder."  # decoder tensors in model.safetensors; encoder.* is the voice-cloning encoder


@dataclass(frozen=True)
class CodecDecoderConfig:
    """`decoder_config` of speech_tokenizer/config.json. Defaults are the reference config class's, so a
    file that omits a key means what it means to the reference (the released files set them all)."""

    codebook_dim: int
    codebook_size: int = 2048
    hidden_size: int = 1024
    latent_dim: int = 1024
    max_position_embeddings: int = 8000
    rope_theta: float = 10000.0
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 0  # 0: hidden_size // num_attention_heads, as in the reference
    attention_bias: bool = False
    sliding_window: int = 72
    intermediate_size: int = 3072
    hidden_act: str = "silu"
    layer_scale_initial_scale: float = 0.01
    rms_norm_eps: float = 1e-5
    num_hidden_layers: int = 8
    num_quantizers: int = 16
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    decoder_dim: int = 1536
    sample_rate: int = 24000  # top-level output_sample_rate

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def frame_samples(self) -> int:
        return math.prod(self.upsample_rates) * math.prod(self.upsampling_ratios)

    @classmethod
    def from_dict(cls, config: dict, source: str = CONFIG_FILE) -> "CodecDecoderConfig":
        """Parse a whole speech_tokenizer config (top level with `decoder_config`)."""
        check_model_type(config, source)
        dec = config.get("decoder_config")
        if not isinstance(dec, dict) or "codebook_dim" not in dec:
            raise CodecCheckpointError(f"{source}: decoder_config with codebook_dim is required")
        names = {f.name for f in fields(cls)}
        kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in dec.items() if k in names}
        kw["head_dim"] = kw.get("head_dim") or 0
        kw["sample_rate"] = config.get("output_sample_rate", 24000)
        cfg = cls(**kw)
        problems = []
        if cfg.hidden_act != "silu":
            problems.append(f"hidden_act {cfg.hidden_act!r} (only 'silu')")
        if dec.get("num_semantic_quantizers", 1) != 1:
            problems.append("num_semantic_quantizers != 1")
        if (dec.get("rope_scaling") or {}).get("rope_type", "default") != "default":
            problems.append(f"rope_scaling {dec['rope_scaling']!r} (only default RoPE)")
        if dec.get("partial_rotary_factor", 1.0) != 1.0:
            problems.append("partial_rotary_factor != 1")
        if cfg.num_attention_heads % cfg.num_key_value_heads or cfg.num_quantizers < 2:
            problems.append("num_attention_heads must be a multiple of num_key_value_heads, num_quantizers >= 2")
        if config.get("decode_upsample_rate", cfg.frame_samples) != cfg.frame_samples:
            problems.append(f"decode_upsample_rate {config['decode_upsample_rate']} != "
                            f"prod(upsample_rates + upsampling_ratios) = {cfg.frame_samples}")
        if problems:
            raise CodecCheckpointError(f"{source}: unsupported decoder_config: " + "; ".join(problems))
        return cfg


# ---------------------------------------------------------------------------------------------------
# Causal state. Each stateful conv owns a slice of one flat per-slot vector (`DecoderState.tails`):
# the last `context` input frames it saw. The transformer owns a key/value ring per layer.

class _Stateful(nn.Module):
    """A conv whose step needs its last `context` input frames of `in_channels` channels."""

    in_channels: int
    context: int
    state_offset: int = 0


class ConvHistory:
    """The carried frames of one call's stateful convs: each conv reads its slice of the rows' gathered state
    `tails` [B, S] and leaves its new last input frames here; `carried()` gives them back as one tensor, which
    decode_step writes to the slots' state. `tails` itself is never written: a compiled part that wrote slices of
    its input copied the whole input again at each write (Inductor's functionalization: 0.6 ms of the 1.7B decode
    at 256 rows on an H200, docs/benchmarks.md)."""

    def __init__(self, tails: torch.Tensor):
        self.tails = tails
        self.new: list[tuple[int, torch.Tensor]] = []

    def prefixed(self, conv: _Stateful, x: torch.Tensor, pad: int = 0) -> torch.Tensor:
        """[B, n, C] -> [B, context + n + pad, C]: conv's carried frames, x, then pad zero frames (in the same cat: a
        pad of the cat's result kept Inductor from computing x in the kernel that writes it); keeps its new last
        ones."""
        B, n, C = x.shape
        size = conv.in_channels * conv.context
        tail = self.tails[:, conv.state_offset:conv.state_offset + size].view(-1, conv.context, conv.in_channels)
        x = torch.cat([tail, x] + ([x.new_zeros(B, pad, C)] if pad else []), dim=1)
        self.new.append((conv.state_offset, x[:, n:n + conv.context].reshape(B, size)))
        return x

    def carried(self) -> torch.Tensor:
        """The new frames of every conv that ran, in the state's order: [B, the span of their slices] ([B, 0] where
        none carries frames)."""
        return torch.cat([self.tails[:, :0]] + [t for _, t in sorted(self.new, key=lambda item: item[0])], dim=1)


# A one-row convolution of at most this many multiply-adds runs as one matrix multiply of its input windows (a
# one-row step's took less than cuDNN's kernels on the H100). The bound is high enough for a one-row decode of
# up to 64 frames (decode's chunks; an ICL voice's decoder priming, which runs under cuDNN's heuristics:
# runner.plain_functions): those heuristics pick channels-last kernels up to 100x slower than its search finds
# for some shapes (docs/benchmarks.md). Every convolution of a step of several rows runs on cuDNN: with more
# rows the multiply gained nothing (2 to 256 rows). Deciding by rows, not by the rows' multiply-adds, also
# keeps the compiled step (compile_hot_functions) to two versions: one row, and any number of rows.
MATMUL_MACS = 1 << 34


@torch.library.custom_op("talkgate::conv_addmm", mutates_args=())
def conv_addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """bias + a @ b where the product is a convolution (CausalConv's one-row path, CausalTransConv), at the
    precision PyTorch runs convolutions at: torch.backends.cudnn.allow_tf32, TF32 by default on CUDA, as
    cuDNN runs the reference's Conv1d and ConvTranspose1d (matrix multiplies default to exact float32).
    On the H100 TF32 made the batch-1 decoder's convolutions up to 3.4x faster, most 1.4-1.8x
    (docs/benchmarks.md). An opaque op, so that torch.compile calls it as it is and the setting applies
    when it runs (the CPU ignores the setting)."""
    matmul = torch.backends.cuda.matmul
    saved, matmul.allow_tf32 = matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        return torch.addmm(bias, a, b)
    finally:
        matmul.allow_tf32 = saved


@conv_addmm.register_fake
def _(bias, a, b):
    return a.new_empty(a.shape[0], b.shape[1])


class CausalConv(_Stateful):
    """Stride-1 conv padded on the left only (the reference pads zeros; a fresh state is zeros), on [B, n, C].

    On cuDNN it runs as a 2-D convolution of height 1 on channels-last memory: [B, n, C] contiguous is the NHWC
    layout of [B, C, 1, n], the layout of cuDNN's fastest kernels, so that it converts neither the input nor the
    output (with [B, C, n] it wrapped every call in nchwToNhwc / nhwcToNchw); `weight_nhwc` is the weight in that
    layout. A one-row one of at most MATMUL_MACS multiply-adds is one multiply of its input windows [n, K * C_in]
    by the same weight read as taps [K * C_in, C_out] (channels-last memory of [C_out, C_in, 1, K] is
    [C_out, K, C_in]: no second copy). A dilated one on cuDNN runs undilated over its phases (_phases)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, groups=groups)
        self.in_channels = in_channels
        self.context = (kernel_size - 1) * dilation
        weight = torch.zeros(out_channels, in_channels // groups, 1, kernel_size)
        self.register_buffer("weight_nhwc", weight.contiguous(memory_format=torch.channels_last), persistent=False)

    def prepare(self):  # a copy of the weight [C_out, C_in / groups, K] in the layout forward takes
        self.weight_nhwc = self.conv.weight.detach()[:, :, None].contiguous(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor, history: ConvHistory) -> torch.Tensor:
        """x [B, n, C_in] -> [B, n, C_out]"""
        B, n, _ = x.shape
        w = self.weight_nhwc
        c_out, c_in, _, k = w.shape
        dilation = self.conv.dilation[0]
        on_cudnn = B > 1 or self.conv.groups > 1 or c_out * c_in * k * n > MATMUL_MACS
        phases = on_cudnn and dilation > 1 and self.conv.groups == 1
        if self.context:
            x = history.prefixed(self, x, -n % dilation if phases else 0)
        if phases:
            return self._phases(x, n)
        if on_cudnn:
            y = F.conv2d(x.transpose(1, 2)[:, :, None], w, self.conv.bias, dilation=(1, dilation),
                         groups=self.conv.groups)                        # [B, C_out, 1, n], channels-last
            return y[:, :, 0].transpose(1, 2)
        _, st, sc = x.stride()
        windows = x.as_strided((n, k, c_in), (st, dilation * st, sc)).reshape(n, k * c_in)
        taps = w.permute(0, 2, 3, 1).reshape(c_out, k * c_in).T          # [K * C_in, C_out], rows as the windows'
        return conv_addmm(self.conv.bias, windows, taps)[None]

    def _phases(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """The dilated convolution as an undilated one over its d phases: x [B, L, C] with L a multiple of d (zero
        frames after the last, whose outputs are dropped: prefixed's pad) is the NHWC memory of [B, C, L / d, d],
        and a (K, 1) kernel down its height reaches frames t, t + d, ... of phase t % d: the dilated conv's taps.
        cuDNN ran the dilated (1, K) kernels on an older, about twice slower kernel than the undilated ones (the
        1.7B decode at 256 rows on an H200, docs/benchmarks.md)."""
        B, L, c_in = x.shape
        d = self.conv.dilation[0]
        pad = L - self.context - n
        w = self.weight_nhwc.transpose(2, 3)                             # [C_out, C_in, K, 1], channels-last
        y = F.conv2d(x.view(B, L // d, d, c_in).permute(0, 3, 1, 2), w, self.conv.bias)   # [B, C_out, (n + pad) / d, d]
        return y.permute(0, 2, 3, 1).reshape(B, n + pad, -1)[:, :n]


class WaveConv(_Stateful):
    """The stack's last conv, C_in channels -> 1 (the waveform), as a multiply and a shifted sum: every input frame
    times all K taps' weights at once ([B, context + n, C_in] x [C_in, K], K padded to 8 columns so that the
    product's rows stay 16-byte aligned for the tensor cores), then sample t = bias + sum over k of the product at
    frame t + k * dilation, tap k, summed in float32. cuDNN ran this one-output-channel convolution on channels-last
    input as a conversion to NCHW and back around its kernel: 0.2 ms of the 1.7B decode at 256 rows (H200)."""

    def __init__(self, in_channels: int, kernel_size: int, dilation: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, 1, kernel_size, dilation=dilation)
        self.in_channels = in_channels
        self.context = (kernel_size - 1) * dilation
        self.register_buffer("taps", torch.zeros(in_channels, -(-kernel_size // 8) * 8), persistent=False)

    def prepare(self):  # the weight [1, C_in, K] as [C_in, K] and zero columns
        w = self.conv.weight.detach()[0]
        self.taps = F.pad(w, (0, self.taps.shape[1] - w.shape[1]))

    def forward(self, x: torch.Tensor, history: ConvHistory) -> torch.Tensor:
        """x [B, n, C_in] -> [B, n] float32"""
        n = x.shape[1]
        if self.context:
            x = history.prefixed(self, x)
        product = x @ self.taps                                          # [B, context + n, 8]
        k, dilation = self.conv.kernel_size[0], self.conv.dilation[0]
        # a sum of the shifted slices (not a stack and its sum, which Inductor wrote out as a [K, B, n] buffer first)
        return sum((product[:, j * dilation:j * dilation + n, j].float() for j in range(k)), self.conv.bias.float())


class CausalTransConv(_Stateful):
    """Transposed conv trimmed on the right: output block t (stride samples) depends on inputs <= t.

    Run as one matrix multiply: output phase j of block t is sum over s of W[:, :, j + (context - s) *
    stride] . x[t + s] (x with the carried frames in front), so `taps` [stride * C_out, (context + 1) *
    C_in] times the windows of x stacked [(context + 1) * C_in, B * n] gives every row's blocks at once
    (computed transposed, rows first, phases before channels, so that the result is already the output
    [B, n * stride, C_out]). cuDNN's transposed convolution (a data-gradient kernel) took 3.4 ms for one of them
    at 256 rows. With several rows and carried frames the same multiply runs on cuDNN as a forward convolution of
    `context + 1` taps to stride * C_out channels (`taps` is that weight's channels-last memory), which reads the
    windows where they lie instead of a copy of them (twice the input) made for the multiply."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.in_channels = in_channels
        self.stride = stride
        self.context = -(-kernel_size // stride) - 1  # earlier inputs whose kernel still reaches block t
        windows = self.context + 1
        self.register_buffer("taps", torch.zeros(stride * out_channels, windows * in_channels), persistent=False)
        self.register_buffer("taps_bias", torch.zeros(stride * out_channels), persistent=False)

    def prepare(self):  # a copy of the weight in the multiply's layout
        w = self.conv.weight.detach()                                   # [C_in, C_out, K]
        c_in, c_out, k = w.shape
        windows, r = self.context + 1, self.stride
        w = F.pad(w, (0, windows * r - k)).view(c_in, c_out, windows, r).flip(2)   # [C_in, C_out, s, j]
        self.taps = w.permute(3, 1, 2, 0).reshape(r * c_out, windows * c_in)
        self.taps_bias = self.conv.bias.detach().repeat(r)

    def forward(self, x: torch.Tensor, history: ConvHistory) -> torch.Tensor:
        """x [B, n, C_in] -> [B, n * stride, C_out]"""
        B, n, _ = x.shape
        if self.context:
            x = history.prefixed(self, x)
        if B > 1 and self.context:
            # the bias after the reshape: on CUDA Inductor peels a conv's bias into a pointwise add, and the reshape of
            # that add's [B, stride * C_out, 1, n] node (not of the channels-last conv output) slowed its readers 2.5x
            w = self.taps.view(self.taps.shape[0], self.context + 1, -1).transpose(1, 2)[:, :, None]
            y = F.conv2d(x.transpose(1, 2)[:, :, None], w)                       # [B, stride * C_out, 1, n]
            return y[:, :, 0].transpose(1, 2).reshape(B, n * self.stride, -1) + self.conv.bias
        windows = x.unfold(1, n, 1).permute(0, 3, 1, 2).reshape(B * n, -1)    # [B * n, (context+1) * C_in]
        y = conv_addmm(self.taps_bias, windows, self.taps.T)             # [B * n, stride * C_out], bias fused
        return y.view(B, n * self.stride, -1)


class SnakeBeta(nn.Module):
    """x + sin(x * e^alpha)^2 / (e^beta + 1e-9), per channel (the last dim)."""

    def __init__(self, dim: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))
        self.register_buffer("freq", torch.ones(dim), persistent=False)
        self.register_buffer("inv_beta", torch.ones(dim), persistent=False)

    def prepare(self):
        self.freq = self.alpha.detach().float().exp()
        self.inv_beta = 1.0 / (self.beta.detach().float().exp() + 1e-9)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(x, self.inv_beta, torch.sin(x * self.freq).square())


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, history: ConvHistory) -> torch.Tensor:
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(self.dwconv(x, history)))))
        return torch.addcmul(x, self.gamma, h)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: torch.Tensor, history: ConvHistory) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x), history)), history)


class DecoderBlock(nn.Module):
    """SnakeBeta, transposed conv (x rate, channels / 2), residual units with dilation 1, 3, 9."""

    def __init__(self, in_dim: int, out_dim: int, rate: int):
        super().__init__()
        self.block = nn.ModuleList([SnakeBeta(in_dim), CausalTransConv(in_dim, out_dim, 2 * rate, rate)]
                                   + [ResidualUnit(out_dim, d) for d in (1, 3, 9)])

    def forward(self, x: torch.Tensor, history: ConvHistory) -> torch.Tensor:
        x = self.block[1](self.block[0](x), history)
        for unit in self.block[2:]:
            x = unit(x, history)
        return x


# ---------------------------------------------------------------------------------------------------
# Split residual vector quantizer (decode only).

class _Codebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))


class _VectorQuantization(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = _Codebook(size, dim)


class _Layers(nn.Module):
    def __init__(self, layers: list[nn.Module]):
        super().__init__()
        self.layers = nn.ModuleList(layers)


class ResidualVQ(nn.Module):
    """Codebooks of `dim`, summed, then a 1x1 projection to codebook_dim (input_proj is the encoder's)."""

    def __init__(self, num_quantizers: int, size: int, dim: int, out_dim: int):
        super().__init__()
        self.input_proj = nn.Conv1d(out_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, out_dim, 1, bias=False)
        self.vq = _Layers([_VectorQuantization(size, dim) for _ in range(num_quantizers)])


class SplitResidualVQ(nn.Module):
    """Codebook 0 (semantic) and codebooks 1.. (acoustic) have their own output projections."""

    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        dim = cfg.codebook_dim // 2
        self.rvq_first = ResidualVQ(1, cfg.codebook_size, dim, cfg.codebook_dim)
        self.rvq_rest = ResidualVQ(cfg.num_quantizers - 1, cfg.codebook_size, dim, cfg.codebook_dim)
        self.codebook_size = cfg.codebook_size
        self.register_buffer("table", torch.zeros(cfg.num_quantizers * cfg.codebook_size, dim), persistent=False)
        self.register_buffer("offsets", torch.zeros(cfg.num_quantizers, 1, dtype=torch.long), persistent=False)

    def prepare(self):
        books = [vq._codebook for rvq in (self.rvq_first, self.rvq_rest) for vq in rvq.vq.layers]
        self.table = torch.cat([b.embedding_sum.detach().float() / b.cluster_usage.detach().float().clamp(min=1e-5)[:, None]
                                for b in books])
        self.offsets = torch.arange(len(books), device=self.table.device)[:, None] * self.codebook_size

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, Q, n] -> [B, n, codebook_dim]"""
        e = F.embedding(codes + self.offsets, self.table)  # [B, Q, n, dim]
        first = F.linear(e[:, 0], self.rvq_first.output_proj.weight[:, :, 0])
        return first + F.linear(e[:, 1:].sum(1), self.rvq_rest.output_proj.weight[:, :, 0])


# ---------------------------------------------------------------------------------------------------
# Sliding-window causal transformer with a per-slot key/value ring of `sliding_window` frames.

# One-frame steps take synth/window_attention.py's kernel on CUDA, and every step synth/row_copy.py's for its
# state's write-back; tests set this to run them on CPU tensors too, in Triton's interpreter.
KERNEL_ON_CPU = False


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # one fused kernel where torch has one (it accumulates in fp32, like the reference)
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)

    def residual(self, x: torch.Tensor, scale: torch.Tensor,
                 delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + scale * delta, its norm): a layer-scaled residual add and the norm that follows it, one
        kernel when compiled (compile_hot_functions in synth/runner.py)."""
        x = torch.addcmul(x, scale, delta)
        return x, self(x)


class LayerScale(nn.Module):
    def __init__(self, dim: int, scale: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), scale))


@dataclass
class _Window:
    """Per-step attention bookkeeping shared by the layers."""

    slots: torch.Tensor   # [B] cache rows
    cos: torch.Tensor     # [B, n, 1, head_dim]
    sin: torch.Tensor     # [B, n, 1, head_dim], sign of rotate_half folded in: (-sin, +sin) halves
    bias: torch.Tensor    # [B, 1, n, keys] additive mask: 0 or -inf
    write: torch.Tensor   # [B, m] ring indices for the last m new frames


class Attention(nn.Module):
    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        hd, bias = cfg.attn_head_dim, cfg.attention_bias
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * hd, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.heads * hd, cfg.hidden_size, bias=bias)
        self.register_buffer("qkv_weight", torch.zeros((self.heads + 2 * self.kv_heads) * hd, cfg.hidden_size),
                             persistent=False)
        self.register_buffer("qkv_bias", torch.zeros((self.heads + 2 * self.kv_heads) * hd) if bias else None,
                             persistent=False)

    def prepare(self):  # one projection instead of three (a copy of the weights: 3 x hidden^2 per layer)
        projs = (self.q_proj, self.k_proj, self.v_proj)
        self.qkv_weight = torch.cat([p.weight.detach() for p in projs])
        if self.qkv_bias is not None:
            self.qkv_bias = torch.cat([p.bias.detach() for p in projs])

    def forward(self, x: torch.Tensor, win: _Window, cache: torch.Tensor) -> torch.Tensor:
        """x [B, n, hidden]; cache [num_slots, ring, 2, kv_heads, head_dim] (this layer's K and V)."""
        B, n, _ = x.shape
        H, Hkv, D = self.heads, self.kv_heads, self.head_dim
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias).view(B, n, H + 2 * Hkv, D)
        qk = qkv[:, :, :H + Hkv]
        half = qk.unflatten(-1, (2, D // 2)).flip(-2).flatten(-2)  # rotate_half without the sign
        qk = torch.addcmul(qk * win.cos, half, win.sin)              # RoPE on q and k at once
        q = qk[:, :, :H]
        kv = torch.cat([qk[:, :, H:], qkv[:, :, H + Hkv:]], dim=2).view(B, n, 2, Hkv, D)
        m = win.write.shape[1]
        rows = win.slots[:, None].expand(B, m)
        if n == 1:  # the ring holds the window including this frame once it is written
            cache.index_put_((rows, win.write), kv)
            keys = cache[win.slots]                                  # [B, ring, 2, Hkv, D]
        else:       # attend over the ring as it was plus the new frames, then keep the last m
            keys = torch.cat([cache[win.slots], kv], dim=1)
            cache.index_put_((rows, win.write), kv[:, n - m:])
        o = F.scaled_dot_product_attention(q.transpose(1, 2), keys[:, :, 0].transpose(1, 2),
                                           keys[:, :, 1].transpose(1, 2), attn_mask=win.bias,
                                           enable_gqa=H != Hkv)
        return self.o_proj(o.transpose(1, 2).reshape(B, n, H * D))

    def one_frame(self, x: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, cache: torch.Tensor,
                  inv_freq: torch.Tensor, kernel) -> torch.Tensor:
        """forward for one frame per row: x [B, 1, hidden] at positions pos [B] -> [B, 1, hidden]; RoPE,
        the ring write and attention over the window in one kernel (synth/window_attention.py's
        window_attention)."""
        qkv = F.linear(x[:, 0], self.qkv_weight, self.qkv_bias)
        return self.o_proj(kernel(qkv, pos, slots, cache, inv_freq, self.heads))[:, None]


class Mlp(nn.Module):
    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.register_buffer("gate_up_weight", torch.zeros(2 * cfg.intermediate_size, cfg.hidden_size),
                             persistent=False)

    def prepare(self):  # one projection instead of two (a copy of those weights)
        self.gate_up_weight = torch.cat([self.gate_proj.weight.detach(), self.up_proj.weight.detach()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.gate_up_weight).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class TransformerLayer(nn.Module):
    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = Mlp(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, x: torch.Tensor, normed: torch.Tensor, cache: torch.Tensor, attention,
                following: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """x the residual stream, normed its input norm; attention(self_attn, normed, cache) -> the
        attention output. -> (x after the layer, `following`'s norm of it: the next layer's input norm
        or the final norm), each residual add fused with the norm after it."""
        a = attention(self.self_attn, normed, cache)
        x, normed = self.post_attention_layernorm.residual(x, self.self_attn_layer_scale.scale, a)
        return following.residual(x, self.mlp_layer_scale.scale, self.mlp(normed))


class Transformer(nn.Module):
    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.layers = nn.ModuleList([TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        self.window = cfg.sliding_window
        self.rope_theta = cfg.rope_theta
        self.register_buffer("inv_freq", torch.ones(cfg.attn_head_dim // 2), persistent=False)
        # synth/window_attention.py's kernel (None without Triton), looked up here rather than in
        # forward: dynamo cannot trace the import
        kernels = kernel_module("window_attention")
        self.window_kernel = kernels.window_attention if kernels is not None else None

    def prepare(self):
        dim = self.inv_freq.shape[0] * 2
        exponent = torch.arange(0, dim, 2, dtype=torch.int64, device=self.input_proj.weight.device).float() / dim
        self.inv_freq = 1.0 / (self.rope_theta ** exponent)

    def _window(self, pos: torch.Tensor, n: int, slots: torch.Tensor, dtype: torch.dtype) -> _Window:
        """pos [B]: frames this slot decoded before. Query i sits at pos + i and sees keys at
        positions p with p <= pos + i and pos + i - p < window (the reference's sliding mask)."""
        ring = self.window
        t = pos[:, None] + torch.arange(n, device=pos.device)              # [B, n]
        freqs = t.float()[..., None] * self.inv_freq.float()                # fp32 like the reference
        cos, sin = freqs.cos(), freqs.sin()
        cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)
        slot = torch.arange(ring, device=pos.device)
        if n == 1:  # ring entry j holds the latest position <= pos congruent to j
            p = pos[:, None] - torch.remainder(pos[:, None] - slot, ring)    # [B, ring]
            allowed = (p >= 0)[:, None, None, :]
        else:       # ring entry j holds the latest position < pos congruent to j, then the new frames
            p = (pos[:, None] - 1) - torch.remainder(pos[:, None] - 1 - slot, ring)
            kp = torch.cat([p, t], dim=1)[:, None, :]                         # [B, 1, ring + n]
            q = t[:, :, None]
            allowed = ((kp >= 0) & (kp <= q) & (kp > q - self.window))[:, None]
        bias = torch.zeros(allowed.shape, dtype=dtype, device=pos.device).masked_fill_(~allowed, float("-inf"))
        m = min(n, ring)
        return _Window(slots, cos.to(dtype)[:, :, None], sin.to(dtype)[:, :, None], bias,
                       torch.remainder(t[:, n - m:], ring))

    def forward(self, x: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """x [B, n, latent] -> [B, n, latent]; kv [layers, num_slots, ring, 2, kv_heads, head_dim]."""
        if x.shape[1] == 1 and (x.is_cuda or KERNEL_ON_CPU) and self.window_kernel is not None:
            # one frame per row: no window tables, one kernel per layer between q/k/v and o_proj
            def attention(attn, h, cache):
                return attn.one_frame(h, pos, slots, cache, self.inv_freq, self.window_kernel)
        else:
            win = self._window(pos, x.shape[1], slots, x.dtype)

            def attention(attn, h, cache):
                return attn(h, win, cache)
        h = self.input_proj(x)
        normed = self.layers[0].input_layernorm(h)
        norms = [layer.input_layernorm for layer in self.layers[1:]] + [self.norm]
        for layer, cache, following in zip(self.layers, kv, norms):
            h, normed = layer(h, normed, cache, attention, following)
        return self.output_proj(normed)


# ---------------------------------------------------------------------------------------------------

@dataclass
class DecoderState:
    """Causal state of `num_slots` decode contexts. A zeroed row is a fresh utterance."""

    tails: torch.Tensor  # [num_slots, S] last input frames of every causal conv, packed
    kv: torch.Tensor     # [layers, num_slots, window, 2, kv_heads, head_dim] RoPE'd keys and values (rings)
    pos: torch.Tensor    # [num_slots] long: frames decoded so far

    @property
    def num_slots(self) -> int:
        return self.pos.shape[0]

    def reset_slots(self, slots: torch.Tensor):
        self.tails.index_fill_(0, slots, 0)
        self.kv.index_fill_(1, slots, 0)
        self.pos.index_fill_(0, slots, 0)


def _index_copy(pool: torch.Tensor, rows: torch.Tensor, src: torch.Tensor):
    """pool[rows[i]] = src[i] in PyTorch: synth/row_copy.py's copy_rows where its kernel does not run."""
    pool.index_copy_(0, rows, src)


EARLY_BLOCKS = 2         # decoder blocks in early_convs (of 4): with the upsampling, about half the kernels


class CodecDecoder(nn.Module):
    """Qwen3TTSTokenizerV2Decoder for inference: codes -> waveform, in one call or frame by frame."""

    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.config = cfg
        self.quantizer = SplitResidualVQ(cfg)
        self.pre_conv = CausalConv(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = Transformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransConv(cfg.latent_dim, cfg.latent_dim, r, r), ConvNeXtBlock(cfg.latent_dim)])
            for r in cfg.upsampling_ratios)
        dims = [cfg.decoder_dim // 2 ** i for i in range(len(cfg.upsample_rates) + 1)]
        self.decoder = nn.ModuleList(
            [CausalConv(cfg.latent_dim, cfg.decoder_dim, 7)]
            + [DecoderBlock(dims[i], dims[i + 1], r) for i, r in enumerate(cfg.upsample_rates)]
            + [SnakeBeta(dims[-1]), WaveConv(dims[-1], 7)])
        # The state's slices in the order the convs run, so that each part (codes_in, early_convs, late_convs)
        # owns one span of it: the span its ConvHistory.carried() returns and decode_step writes back.
        parts = ([self.quantizer, self.pre_conv], [self.upsample, *self.decoder[:1 + EARLY_BLOCKS]],
                 list(self.decoder[1 + EARLY_BLOCKS:]))
        offset, self.tail_spans = 0, []
        for part in parts:
            start = offset
            for m in (m for root in part for m in root.modules()):
                if isinstance(m, _Stateful) and m.context:
                    m.state_offset = offset
                    offset += m.in_channels * m.context
            self.tail_spans.append(slice(start, offset))
        self.tail_size = offset
        # synth/row_copy.py's kernel (None without Triton) for decode_step's write-back, looked up here rather than
        # in decode_step: dynamo cannot trace the import
        kernels = kernel_module("row_copy")
        self.row_kernel = kernels.copy_rows if kernels is not None else None

    @torch.no_grad()
    def prepare(self) -> "CodecDecoder":
        """Recompute the derived buffers from the parameters (after loading or changing weights)."""
        for m in self.modules():
            if m is not self and hasattr(m, "prepare"):
                m.prepare()
        return self

    def alloc_state(self, num_slots: int, device=None, dtype=None) -> DecoderState:
        w = self.pre_conv.conv.weight
        device = w.device if device is None else device
        dtype = w.dtype if dtype is None else dtype
        cfg = self.config
        return DecoderState(
            tails=torch.zeros(num_slots, self.tail_size, device=device, dtype=dtype),
            kv=torch.zeros(cfg.num_hidden_layers, num_slots, cfg.sliding_window, 2, cfg.num_key_value_heads,
                           cfg.attn_head_dim, device=device, dtype=dtype),
            pos=torch.zeros(num_slots, device=device, dtype=torch.long))

    @torch.no_grad()
    def decode_step(self, codes: torch.Tensor, slots: torch.Tensor, state: DecoderState) -> torch.Tensor:
        """codes [B, Q, n] long, slots [B] long -> pcm [B, n * frame_samples] float32; advances the slots."""
        B, _, n = codes.shape
        pos = state.pos[slots]
        tails = state.tails[slots]  # the rows' carried frames, gathered (read only: each part returns its new ones)
        h, carried_in = self.codes_in(codes, tails)                     # [B, n, latent]
        h = self.pre_transformer(h, pos, slots, state.kv)
        h, carried_early = self.early_convs(h, tails)
        wav, carried_late = self.late_convs(h, tails)
        on_kernel = (codes.is_cuda or KERNEL_ON_CPU) and self.row_kernel is not None
        write_rows = self.row_kernel if on_kernel else _index_copy
        for span, carried in zip(self.tail_spans, (carried_in, carried_early, carried_late)):
            write_rows(state.tails[:, span], slots, carried)
        state.pos.index_copy_(0, slots, pos + n)
        return wav

    # The parts before and after the transformer read only the gathered `tails`, never a per-slot pool, and write
    # nothing in place: compile_hot_functions (synth/runner.py) compiles each whole. Each returns its output and its
    # convs' new carried frames (its span of the state, `tail_spans`).
    def codes_in(self, codes: torch.Tensor, tails: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """codes [B, Q, n] -> the transformer's input [B, n, latent]: RVQ lookup and the causal pre-conv."""
        history = ConvHistory(tails)
        return self.pre_conv(self.quantizer(codes), history), history.carried()

    # The upsampling and the decoder's conv stack run in two halves that compile apart (runner.compile_hot_functions:
    # one took a compile helper 52 s on an H100, the longest of a fresh start). A half ends at a block's output,
    # which a convolution writes to memory either way.
    def early_convs(self, h: torch.Tensor, tails: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The transformer's output [B, n, latent] -> the output of the first EARLY_BLOCKS decoder blocks
        [B, samples, C]."""
        history = ConvHistory(tails)
        for trans_conv, convnext in self.upsample:
            h = convnext(trans_conv(h, history), history)
        h = self.decoder[0](h, history)
        for block in self.decoder[1:1 + EARLY_BLOCKS]:
            h = block(h, history)
        return h, history.carried()

    def late_convs(self, h: torch.Tensor, tails: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """early_convs' output -> pcm [B, n * frame_samples] float32: the other blocks and the output conv."""
        history = ConvHistory(tails)
        for block in self.decoder[1 + EARLY_BLOCKS:-2]:
            h = block(h, history)
        wav = self.decoder[-1](self.decoder[-2](h), history)            # [B, n * frame_samples]
        return wav.clamp(-1, 1), history.carried()

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, chunk_frames: int = 64) -> torch.Tensor:
        """Whole utterances: codes [B, Q, T] long -> wav [B, T * frame_samples] float32. Runs the
        step over chunks of `chunk_frames` (exact; bounds the activation memory)."""
        cfg = self.config
        if codes.dim() != 3 or codes.shape[1] != cfg.num_quantizers or codes.dtype != torch.long:
            raise ValueError(f"codes must be long [B, {cfg.num_quantizers}, T], got {codes.dtype} {list(codes.shape)}")
        if codes.numel() and (codes.min() < 0 or codes.max() >= cfg.codebook_size):
            raise ValueError(f"codes must lie in [0, {cfg.codebook_size})")
        B, _, T = codes.shape
        state = self.alloc_state(B, codes.device)
        slots = torch.arange(B, device=codes.device)
        out = [self.decode_step(codes[..., i:i + chunk_frames], slots, state) for i in range(0, T, chunk_frames)]
        return torch.cat(out, dim=1) if out else codes.new_zeros(B, 0, dtype=torch.float32)


# ---------------------------------------------------------------------------------------------------
# Loading (speech_tokenizer/config.json + model.safetensors: synth/speech_tokenizer.py).

def load_codec_decoder(speech_tokenizer_dir: str | Path, device="cpu", dtype: torch.dtype = torch.float32) -> CodecDecoder:
    """Load the decoder half of a speech_tokenizer directory (weights cast to `dtype` on `device`)."""
    root = Path(speech_tokenizer_dir)
    path = root / CONFIG_FILE
    cfg = CodecDecoderConfig.from_dict(read_codec_config(path), str(path))
    with torch.device("meta"):
        model = CodecDecoder(cfg)
    state = read_half(root, model, PREFIX, "decoder")
    # Derived buffers are computed in fp32 from the weights as stored, then everything is cast.
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True, assign=True)
    model.prepare()  # replaces the meta buffers
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)
