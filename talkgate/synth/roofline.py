"""The work of the engine's frame step counted from the model's shapes (issue 44): FLOPs per precision and the
bytes a step must move, per part, and the roofline time of a step at a GPU's peaks.

    roof = StepRoof(tts.config, codec_config, torch.bfloat16, torch.float32, H200)
    roof.step_s(rows=64, position=120, prefill_lens=[16])      # seconds a step of that work takes at the roof

bench/roofline.py times the parts against these counts (its docstring and docs/engine.md "Roofline" have the model:
what is counted, what is not, the precisions); tests/unit/test_roofline.py checks the FLOPs exactly against torch's
FlopCounterMode running the runner's own step functions. The engine adds each step's roofline time to its stats
(step_roof_s): over its step time, the share of the GPU's peak its steps achieve (/metrics, talkgate bench).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

FRAMES = 100                # frames into the utterance at which a step is counted and timed
SAMPLE_OPS_PER_LOGIT = 30   # sampling: hash (2 lowbias32 rounds), 2 logs, scale, compares per logit (estimate)
PARTS = ("prefill", "talker", "code predictor", "sampling", "codec decoder", "host")


@dataclass(frozen=True)
class Peaks:
    """A GPU's datasheet peaks: dense FLOP/s per precision, HBM bytes/s."""
    flops: dict
    bytes_per_s: float


# The GPUs measured here (docs/benchmarks.md), by the vendor's datasheets (SXM, dense), found by a substring of
# torch.cuda.get_device_name. Measured on them: a bf16 matmul ~80% and a copy ~90% of these.
H200 = Peaks({"bf16": 989e12, "fp16": 989e12, "tf32": 495e12, "fp32": 67e12}, 4.8e12)
H100_SXM = Peaks({"bf16": 989e12, "fp16": 989e12, "tf32": 495e12, "fp32": 67e12}, 3.35e12)
GPU_PEAKS = (("H200", H200), ("H100 80GB HBM3", H100_SXM))


def gpu_peaks(device_name: str) -> Peaks | None:
    """The peaks of a GPU by its name (torch.cuda.get_device_name), or None for one not in GPU_PEAKS."""
    return next((peaks for key, peaks in GPU_PEAKS if key in device_name), None)


@dataclass
class Work:
    """What a part does in one step: FLOPs per precision, bytes by kind."""
    flops: dict = field(default_factory=dict)     # precision -> FLOPs
    weight_bytes: float = 0.0
    state_bytes: float = 0.0                        # KV caches, decoder rings and conv tails, read + written
    act_bytes: float = 0.0                          # activations in and out of the counted multiplies

    def times(self, k: int) -> "Work":
        return Work({p: f * k for p, f in self.flops.items()}, k * self.weight_bytes, k * self.state_bytes,
                    k * self.act_bytes)

    def __add__(self, other: "Work") -> "Work":
        flops = dict(self.flops)
        for p, f in other.flops.items():
            flops[p] = flops.get(p, 0) + f
        return Work(flops, self.weight_bytes + other.weight_bytes, self.state_bytes + other.state_bytes,
                    self.act_bytes + other.act_bytes)

    @property
    def total_flops(self) -> float:
        return sum(self.flops.values())

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.state_bytes + self.act_bytes

    def compute_s(self, peaks: Peaks = H200) -> float:
        """Seconds at the peak of each precision (the compute roof)."""
        return sum(f / peaks.flops[p] for p, f in self.flops.items())

    def roof_s(self, peaks: Peaks = H200) -> float:
        """Seconds at the roof: the compute roof or the bytes at the peak bandwidth, whichever is longer."""
        return max(self.compute_s(peaks), self.bytes / peaks.bytes_per_s)


def total(works) -> Work:
    out = Work()
    for w in works:
        out = out + w
    return out


def matmul(tokens: int, n_in: int, n_out: int, prec: str, weight_bytes: int, act_bytes: int,
           weight_reads: int = 1) -> Work:
    """tokens rows times a [n_in, n_out] weight: its weight read weight_reads times, its input and output once."""
    return Work({prec: 2 * tokens * n_in * n_out}, weight_reads * n_in * n_out * weight_bytes, 0,
                tokens * (n_in + n_out) * act_bytes)


# ----- the Qwen3 decoder stacks: Talker, code predictor, prefill -----
def qwen3_layers(d, tokens: int, pairs: int, kv_read: int, kv_written: int, prec: str, nbytes: int,
                 weight_reads: int = 1) -> Work:
    """d.num_layers Qwen3 layers (synth/model.py) over `tokens` tokens in all, `pairs` query-key pairs in all
    (each costs QK^T and PV for every query head), `kv_read` / `kv_written` cache positions read and written
    (K and V, every kv head)."""
    H, hd, nh, nkv, I = d.hidden_size, d.head_dim, d.num_heads, d.num_kv_heads, d.intermediate_size
    layer = total([matmul(tokens, H, (nh + 2 * nkv) * hd, prec, nbytes, nbytes, weight_reads),      # q/k/v
                   matmul(tokens, nh * hd, H, prec, nbytes, nbytes, weight_reads),                  # o_proj
                   matmul(tokens, H, 2 * I, prec, nbytes, nbytes, weight_reads),                    # gate/up
                   matmul(tokens, I, H, prec, nbytes, nbytes, weight_reads)])                       # down
    attention = Work({prec: 4 * nh * hd * pairs}, 0, (kv_read + kv_written) * 2 * nkv * hd * nbytes,
                     2 * tokens * nh * hd * nbytes)                                                  # q in, out
    norms = Work({}, weight_reads * (2 * H + 2 * hd) * nbytes)
    return total([layer, attention, norms]).times(d.num_layers)


def talker_work(cfg, B: int, position: int, prec: str, nbytes: int) -> Work:
    """The talker graph: text embedding row + projection (text_hidden -> text_hidden -> H), the layers with
    each row at `position` (it reads positions 0..position of its cache and writes one), final norm."""
    t, d = cfg.talker, cfg.talker.dims
    th = t.text_hidden_size
    text = total([Work({}, 0, 0, B * th * nbytes),                                       # embedding rows
                  matmul(B, th, th, prec, nbytes, nbytes), matmul(B, th, d.hidden_size, prec, nbytes, nbytes)])
    keys = position + 1
    return text + qwen3_layers(d, B, B * keys, B * keys, B, prec, nbytes) + Work({}, d.hidden_size * nbytes)


def prefill_work(cfg, rows: int, T: int, prec: str, nbytes: int) -> Work:
    """The prefill graph: the text ids of `rows` new contexts of T positions (padded) embedded (the text
    projection at every position), then through the Talker, attention within the T positions (the full square),
    every position's K/V written."""
    t = cfg.talker
    d, th = t.dims, t.text_hidden_size
    text = (Work({}, 0, 0, rows * T * th * nbytes) + matmul(rows * T, th, th, prec, nbytes, nbytes)
            + matmul(rows * T, th, d.hidden_size, prec, nbytes, nbytes))
    return text + qwen3_layers(d, rows * T, rows * T * T, 0, rows * T, prec, nbytes) + Work({}, d.hidden_size * nbytes)


def predictor_pairs(groups: int) -> int:
    """Query-key pairs of one frame's code predictor: its first pass is 2 positions (the Talker's hidden and
    codebook 0's embedding, the 2 x 2 square), then one position p = 2..groups-1 a pass over keys 0..p."""
    return 4 + sum(p + 1 for p in range(2, groups))


def code_predictor_work(cfg, B: int, prec: str, nbytes: int) -> Work:
    """The codes graph without its draws (sampling_work): codec head, codebook-0 embedding, the code
    predictor's passes (the layers' weights read once a pass), its heads and embeddings, the embedding sum."""
    t, p = cfg.talker, cfg.talker.predictor
    HT, d, G = t.dims.hidden_size, p.dims, p.num_code_groups
    passes, tokens = G - 1, B * G
    head = matmul(B, HT, t.vocab_size, prec, nbytes, nbytes)
    # the first pass projects its 2 rows; a later pass's input is a row of a projected table (CodePredictor.setup)
    projection = (matmul(2 * B, HT, d.hidden_size, prec, nbytes, nbytes)
                  + Work({}, 0, 0, (G - 2) * B * d.hidden_size * nbytes) if HT != d.hidden_size else Work())
    pairs = predictor_pairs(G)
    # the first pass reads back its 2 positions, pass p its p + 1
    layers = qwen3_layers(d, tokens, B * pairs, B * (pairs - 2), tokens, prec, nbytes, passes)
    heads = matmul(B * (G - 1), d.hidden_size, p.vocab_size, prec, nbytes, nbytes)     # 15 heads, B rows each
    embeddings = Work({}, 0, 0, (G + 1) * B * HT * nbytes)                             # 16 rows read, the sum written
    norms = Work({}, passes * d.hidden_size * nbytes)
    return total([head, projection, layers, heads, embeddings, norms])


def sampling_work(cfg, B: int) -> Work:
    """The 16 draws of a frame (fp32 logits): codebook 0 over the Talker's vocabulary, its repetition penalty
    and bans (two passes that read and write the logits, seen and banned masks read), then the kernel that
    reads them once; codebooks 1..15 over the code predictor's vocabulary, one read each."""
    V0, V = cfg.talker.vocab_size, cfg.talker.predictor.vocab_size
    G = cfg.talker.predictor.num_code_groups
    logits = B * (V0 + (G - 1) * V)
    return Work({"fp32": SAMPLE_OPS_PER_LOGIT * logits}, 0, 0, 4 * logits + B * V0 * (4 * 4 + 2))


# ----- the codec decoder (synth/codec_decoder.py), one frame a row -----
def conv(B: int, c_in: int, c_out: int, kernel: int, n_out: int, prec: str, nbytes: int, dilation: int = 1,
         groups: int = 1, context: int | None = None) -> Work:
    """A causal conv of n_out output frames: its input is its carried context + n_out frames (the context read
    from and written back to the row's tail)."""
    context = (kernel - 1) * dilation if context is None else context
    w = c_out * (c_in // groups) * kernel
    return Work({prec: 2 * B * n_out * w}, w * nbytes, 2 * B * c_in * context * nbytes,
                B * (c_in * n_out + c_out * n_out) * nbytes)


def trans_conv(B: int, c_in: int, c_out: int, kernel: int, stride: int, n_in: int, prec: str, nbytes: int) -> Work:
    """CausalTransConv as its multiply: [B * n_in, windows * c_in] x [windows * c_in, c_out * stride]."""
    windows = -(-kernel // stride)
    return Work({prec: 2 * B * n_in * windows * c_in * c_out * stride}, windows * c_in * c_out * stride * nbytes,
             2 * B * c_in * (windows - 1) * nbytes, B * n_in * (c_in + c_out * stride) * nbytes)


def codec_decoder_work(c, B: int, frames_before: int, nbytes: int, linear_prec: str, conv_prec: str) -> Work:
    """One frame per row through CodecDecoder.decode_step: RVQ lookup and its two projections, the causal
    pre-conv, the sliding-window transformer (keys: the frames in the window), the upsampling (transposed conv +
    ConvNeXt), the decoder blocks (SnakeBeta, transposed conv, 3 dilated residual units) and the output conv.
    Linear layers (nn.Linear, F.linear) run at linear_prec, convolutions at conv_prec."""
    half = c.codebook_dim // 2
    parts = [Work({}, 0, 0, B * c.num_quantizers * half * nbytes),                      # codebook rows
             matmul(B, half, c.codebook_dim, linear_prec, nbytes, nbytes),               # rvq_first.output_proj
             matmul(B, half, c.codebook_dim, linear_prec, nbytes, nbytes),               # rvq_rest.output_proj
             conv(B, c.codebook_dim, c.latent_dim, 3, 1, conv_prec, nbytes)]             # pre_conv
    hd, keys = c.attn_head_dim, min(frames_before + 1, c.sliding_window)
    H, nh, nkv, I = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size
    parts.append(matmul(B, c.latent_dim, H, linear_prec, nbytes, nbytes))                # input_proj
    for _ in range(c.num_hidden_layers):
        parts += [matmul(B, H, (nh + 2 * nkv) * hd, linear_prec, nbytes, nbytes),
                  matmul(B, nh * hd, H, linear_prec, nbytes, nbytes),
                  matmul(B, H, 2 * I, linear_prec, nbytes, nbytes), matmul(B, I, H, linear_prec, nbytes, nbytes),
                  Work({linear_prec: 4 * B * nh * hd * keys}, 4 * H * nbytes,            # norms, layer scales
                       B * (keys + 1) * 2 * nkv * hd * nbytes, 2 * B * nh * hd * nbytes)]
    parts.append(matmul(B, H, c.latent_dim, linear_prec, nbytes, nbytes))                # output_proj
    n = 1
    for r in c.upsampling_ratios:
        parts.append(trans_conv(B, c.latent_dim, c.latent_dim, r, r, n, conv_prec, nbytes))
        n *= r
        C = c.latent_dim
        parts += [conv(B, C, C, 7, n, conv_prec, nbytes, groups=C),                     # ConvNeXt dwconv
                  matmul(B * n, C, 4 * C, linear_prec, nbytes, nbytes),                   # pwconv1 (nn.Linear)
                  matmul(B * n, 4 * C, C, linear_prec, nbytes, nbytes)]                   # pwconv2
    dims = [c.decoder_dim // 2 ** i for i in range(len(c.upsample_rates) + 1)]
    parts.append(conv(B, c.latent_dim, dims[0], 7, n, conv_prec, nbytes))
    for i, r in enumerate(c.upsample_rates):
        parts.append(trans_conv(B, dims[i], dims[i + 1], 2 * r, r, n, conv_prec, nbytes))
        n *= r
        for dilation in (1, 3, 9):
            # several rows' dilated convs run over their phases: the work counted is the frames run, pad included
            n_run = n if B == 1 else -(-n // dilation) * dilation
            parts += [conv(B, dims[i + 1], dims[i + 1], 7, n_run, conv_prec, nbytes, dilation=dilation),
                      conv(B, dims[i + 1], dims[i + 1], 1, n, conv_prec, nbytes)]
    parts.append(wave_conv(B, dims[-1], 7, n, linear_prec, nbytes))
    return total(parts)            # the conv tails' gather and write-back: each conv's state bytes


def wave_conv(B: int, c_in: int, kernel: int, n_out: int, prec: str, nbytes: int) -> Work:
    """WaveConv: every input frame (context + n_out) times the taps padded to 8 columns (a multiply, at the
    decoder's linear precision), then the shifted sum to float32 samples."""
    taps, frames = -(-kernel // 8) * 8, kernel - 1 + n_out
    return Work({prec: 2 * B * frames * c_in * taps}, c_in * taps * nbytes, 2 * B * c_in * (kernel - 1) * nbytes,
                B * frames * (c_in + 2 * taps) * nbytes + B * n_out * 4)


def host_work(B: int) -> Work:
    """The step's copies between host and GPU (PCIe, not HBM): the inputs (4 int64 a row) in, the codes (16
    int64) and the PCM (1920 float32) out."""
    return Work({}, 0, 0, B * (4 * 8 + 16 * 8 + 1920 * 4))


def decoder_precisions(decoder_dtype: torch.dtype, cuda: bool = True) -> tuple[str, str]:
    """(linear, convolution) precision of the codec decoder with torch's current settings (TF32 on CUDA only)."""
    if decoder_dtype == torch.bfloat16:
        return "bf16", "bf16"
    if decoder_dtype == torch.float16:
        return "fp16", "fp16"
    if not cuda:
        return "fp32", "fp32"
    return ("tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32",
            "tf32" if torch.backends.cudnn.allow_tf32 else "fp32")


PRECISION = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def count_step(cfg, codec_cfg, B: int, prompt_len: int, prefill_len: int, dtype: torch.dtype,
               decoder_dtype: torch.dtype, cuda: bool = True) -> dict[str, Work]:
    """Every part's Work at batch B: the rows at position prompt_len + FRAMES, one new context's prefill of
    prefill_len positions (its graph's length bucket)."""
    prec, nbytes = PRECISION[dtype], dtype.itemsize
    lin, cnv = decoder_precisions(decoder_dtype, cuda)
    return {"prefill": prefill_work(cfg, 1, prefill_len, prec, nbytes),
            "talker": talker_work(cfg, B, prompt_len + FRAMES, prec, nbytes),
            "code predictor": code_predictor_work(cfg, B, prec, nbytes) + sampling_work(cfg, B),
            "sampling": sampling_work(cfg, B),
            "codec decoder": codec_decoder_work(codec_cfg, B, FRAMES, decoder_dtype.itemsize, lin, cnv),
            "host": host_work(B)}


POSITION_GRAIN = 16         # StepRoof: positions counted to this grain (a bounded cache)


class StepRoof:
    """Roofline seconds of engine steps on one GPU: the talker, code predictor (its draws included) and codec
    decoder of `rows` rows at a mean `position` (the Talker's cache read is linear in it), plus the prefill of each
    new context at its graph's length bucket. The decoder is counted with its window full, as mid-utterance."""

    def __init__(self, cfg, codec_cfg, dtype: torch.dtype, decoder_dtype: torch.dtype, peaks: Peaks,
                 cuda: bool = True):
        self.cfg, self.codec_cfg, self.peaks = cfg, codec_cfg, peaks
        self.prec, self.nbytes = PRECISION[dtype], dtype.itemsize
        self.decoder_nbytes = decoder_dtype.itemsize
        self.decoder_precs = decoder_precisions(decoder_dtype, cuda)

    def step_s(self, rows: int, position: float, prefill_lens=()) -> float:
        """Roofline seconds of one step (0.0 for an empty one): `rows` rows at mean `position`, and a prefill of
        each of `prefill_lens` positions."""
        G = POSITION_GRAIN
        s = self._rows_s(rows, int(position) // G * G) if rows else 0.0
        return s + sum(self._prefill_s(-(-T // G) * G) for T in prefill_lens)

    @functools.lru_cache(maxsize=4096)
    def _rows_s(self, rows: int, position: int) -> float:
        cfg, prec, nbytes = self.cfg, self.prec, self.nbytes
        work = total([talker_work(cfg, rows, position, prec, nbytes), code_predictor_work(cfg, rows, prec, nbytes),
                      sampling_work(cfg, rows),
                      codec_decoder_work(self.codec_cfg, rows, FRAMES, self.decoder_nbytes, *self.decoder_precs)])
        return work.roof_s(self.peaks)

    @functools.lru_cache(maxsize=64)
    def _prefill_s(self, T: int) -> float:
        return prefill_work(self.cfg, 1, T, self.prec, self.nbytes).roof_s(self.peaks)
