"""Roofline of the engine's frame step, per part, at several batch sizes (issue 44).

    talkgate checkpoint create /tmp/ck17 --preset 1.7b
    python -m bench.roofline /tmp/ck17 --batches 1,8,64,256,512,1024 --json /tmp/roofline-1.7b.json
    python -m bench.roofline /tmp/tiny --device cpu --batches 1,2 --reps 3     # smoke test (tests/unit)

Parts, as the runner (synth/runner.py) runs a step: its CUDA graphs, captured as the engine captures them
(torch.compile'd hot functions, persistent kernels at one or two rows), on B contexts in slots 0..B-1:
  prefill         one new context's prompt through the Talker (the prefill graph of 1 row, padded to its
                  length bucket); the same for every batch, so printed once
  talker          the Talker graph: text embedding + projection, the decoder layers (KV read up to the row's
                  position), final norm
  code predictor  the codes graph: codec head, codebook-0 draw, the code predictor's 15 sequential passes with
                  its 15 heads and draws, the embedding sum for the next step (sampling included)
  sampling        the 16 draws of a frame alone (synth/sample_kernel.py on CUDA), captured in a graph of their
                  own: how much of the code predictor's row is sampling
  codec decoder   the decode graph: one incremental codec-decoder step, 16 codes -> 1920 samples a row
  host            the engine thread's own time in a step (Engine.run_once minus its waits on the GPU:
                  scheduling, the launch, events), bytes = the step's copies between host and GPU
Times: CUDA events around each replay of a part's graph (warm-up first), median of --reps; host: the median of
--reps engine steps on B speaking contexts. On the CPU (--device cpu) the same functions run eagerly, timed by
the wall clock: a smoke test of the bench, not a roofline.

Counting model (analytic, from the checkpoint's config.json and speech_tokenizer/config.json, no weights):
  FLOPs = 2 x the multiply-adds of every matrix multiply, convolution and attention product (QK^T and PV over
  the keys a query sees). Elementwise work (norms, RoPE, SiLU/GELU, SnakeBeta, softmax, the residual adds) is
  not counted: it is a few percent of the FLOPs and it is what torch.utils.flop_counter leaves out too, so that
  tests/unit/test_roofline.py checks these counts exactly against FlopCounterMode on a tiny model. Attention
  within a prefill is counted as the full T x T square (as FlopCounterMode does; a causal kernel skips about
  half of it, a small share of the prefill's FLOPs). Sampling's FLOPs are an estimate, SAMPLE_OPS_PER_LOGIT
  operations per logit (hash, logs, scaling, compares: CUDA cores, fp32), never checked.
  Bytes = the weights a part uses, read once per step from HBM (the code predictor's layers and its input
  projection once per sequential pass: 15 a frame, as its 150+ MB at 1.7B or 0.6B do not stay in the 60 MB L2),
  + KV / decoder state read and written (the Talker's cache up to the row's position, the decoder's 72-frame
  rings and conv tails, gathered and written back), + the input and output activations of every counted
  multiply (elementwise ops assumed fused into them, as the compiled functions mostly are; gathers of
  embedding rows counted as the rows read). So bytes are what a kernel-per-multiply implementation must move
  at least; L2 reuse across kernels is not credited.
  The state: each row at position prompt + FRAMES (a natural utterance: the default voice's prompt then
  FRAMES = 100 frames, 8 s of speech), the decoder 100 frames in (its 72-frame window full).
Precision: the Talker, code predictor and prefill in the runner's dtype (bf16 on CUDA); the codec decoder in
float32 by default, its convolutions in TF32 (torch.backends.cudnn.allow_tf32, as cuDNN and conv_addmm run
them) and its linear layers in exact fp32 (torch.backends.cuda.matmul.allow_tf32 off); sampling in fp32 on CUDA
cores. A part's compute roof is the sum over its precisions of FLOPs / peak; "% peak FLOP" = that time / the
measured time, "% peak BW" = bytes / HBM peak / measured time; the part is memory-bound ("memory") when its
intensity is below the ridge (effective peak FLOP/s / peak bytes/s), else "compute".
Peaks (H200 SXM by the vendor's datasheet, dense, as /work/.library/device/H200.md states them): bf16 / fp16
989 TFLOP/s, TF32 495, fp32 67, HBM3e 4.8 TB/s. Measured on such machines here (KINDS.md): a bf16 8192^3
matmul 770-800 TFLOP/s, a device-to-device copy 4.3 TB/s: the practical ceilings are ~80% and ~90% of these.
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import time
from dataclasses import dataclass, field

import torch

FRAMES = 100                # frames into the utterance at which a step is counted and timed
SAMPLE_OPS_PER_LOGIT = 30   # sampling: hash (2 lowbias32 rounds), 2 logs, scale, compares per logit (estimate)
PEAK_FLOPS = {"bf16": 989e12, "fp16": 989e12, "tf32": 495e12, "fp32": 67e12}     # H200 SXM, dense
PEAK_BYTES = 4.8e12                                                               # H200 HBM3e
PARTS = ("prefill", "talker", "code predictor", "sampling", "codec decoder", "host")


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

    def compute_s(self) -> float:
        """Seconds at the peak of each precision (the compute roof)."""
        return sum(f / PEAK_FLOPS[p] for p, f in self.flops.items())


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
    projection = matmul(tokens, HT, d.hidden_size, prec, nbytes, nbytes, passes) if HT != d.hidden_size else Work()
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
            parts += [conv(B, dims[i + 1], dims[i + 1], 7, n, conv_prec, nbytes, dilation=dilation),
                      conv(B, dims[i + 1], dims[i + 1], 1, n, conv_prec, nbytes)]
    parts.append(conv(B, dims[-1], 1, 7, n, conv_prec, nbytes))
    return total(parts)            # the conv tails' gather and write-back: each conv's state bytes


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


# ----- FlopCounterMode on the real modules (the unit test's cross-check) -----
def flop_counter():
    """torch.utils.flop_counter.FlopCounterMode that also counts the two ops it has no formula for here:
    talkgate::conv_addmm (the decoder's convolutions as a multiply: bias + a @ b) and the CPU's fused attention
    (the formula torch gives its CUDA ones)."""
    from torch.utils import flop_counter as fc

    def addmm_shapes(bias, a, b, *args, out_shape=None, **kwargs) -> int:
        return 2 * a[0] * a[1] * b[1]

    def sdpa_shapes(q, k, v, *args, out_shape=None, **kwargs) -> int:
        return fc.sdpa_flop_count(q, k, v)
    extra = {torch.ops.talkgate.conv_addmm: addmm_shapes}
    cpu_sdpa = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if cpu_sdpa is not None:
        extra[cpu_sdpa] = sdpa_shapes
    return fc.FlopCounterMode(display=False, custom_mapping={op: f for op, f in extra.items()
                                                             if op not in fc.flop_registry})


# ----- timing -----
def median_ms(fn, reps: int, cuda: bool, warmup: int = 3) -> float:
    """Median ms of fn(): CUDA events around each call on CUDA, the wall clock on the CPU."""
    for _ in range(warmup):
        fn()
    times = []
    if cuda:
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) for s, e in events]
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def captured(fn):
    """fn captured in a CUDA graph of its own (warmed on a side stream): its replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def build(checkpoint: str, device: str, top: int, decoder_dtype, compile_: bool, max_prefills: int):
    """The engine's runner for batches up to `top` (top slots of prompt + FRAMES + slack positions), warmed and
    its graphs captured for the batch buckets asked for (set later by capture_buckets), in an Engine."""
    from talkgate.synth.engine import Engine
    from talkgate.synth.runner_build import load_runner
    runner, tokenizers, prompts, info = load_runner(
        checkpoint, device=device, max_contexts=top, max_batch=top, decoder_dtype=decoder_dtype,
        torch_compile=compile_, max_frames_per_context=FRAMES + 60)
    # first audio's graphs only (buckets <= 16, the largest, prefill); capture_buckets adds the others asked for
    runner.warmup(first_audio_only=True)
    return Engine(runner, tokenizers, prompts, info, max_prefills=max_prefills)


def capture_buckets(runner, batches) -> None:
    """Capture the graphs of the batch buckets asked for that warm-up left pending (cuDNN's search included,
    as the engine captures them later), and no others."""
    import collections
    runner.pending = collections.deque(job for job in runner.pending if job[1] in batches)
    while runner.capture_next() is not None:
        pass


def prompt_length(runner) -> int:
    """Positions the default voice's prompt prefills (prompt + text token 0)."""
    from talkgate.synth.api import ContextParams
    prompt = runner.tts.prompts.resolve(ContextParams())
    return runner.tts.prompts.prefills([(prompt, [runner.text_pad])])[0].shape[0]


def time_parts(engine, B: int, prompt_len: int, prefill_len: int, reps: int) -> dict[str, float]:
    """ms of each GPU part at batch B: B rows in slots 0..B-1 at position prompt_len + FRAMES, frame FRAMES."""
    from talkgate.synth.sampling import FrameSampler
    r = engine.runner
    cuda = r.device.type == "cuda"
    with torch.inference_mode():
        r.inputs[0, :B] = torch.arange(B)
        r.inputs[1, :B] = prompt_len + FRAMES
        r.inputs[2, :B] = r.text_pad
        r.inputs[3, :B] = FRAMES
        r.dec_state.pos[:B] = FRAMES
        r.min_frames[:B] = 1 << 40               # no eos: every row makes a frame, as mid-utterance
        r.pre_in[0, 0], r.pre_in[0, 1] = B, prompt_len - 1       # the prefill's new context in slot B
        fns = {}
        if cuda and ("codes", B) not in r.graphs:
            print(f"batch {B} is not a captured bucket ({r.buckets[:6]}..., multiples of 16): its parts run eagerly",
                  flush=True)
        for part in ("talker", "codes", "decode"):
            g = r.graphs.get((part, B)) if cuda else None
            fns[part] = g.replay if g is not None else (lambda p=part: r._parts[p](B))
        g = r.graphs.get(("prefill", 1, prefill_len)) if cuda else None
        fns["prefill"] = g.replay if g is not None else (lambda: r._prefill_step(1, prefill_len))
        if cuda:
            r._run("talker", B)                  # the codes graph reads the Talker's hidden states
        slots, frame = r.inputs[0, :B], r.inputs[3, :B]
        sampler = FrameSampler(r.sampling.index(slots), frame)
        cfg = r.talker.cfg
        gen = torch.Generator(device=r.device).manual_seed(0)
        logits0 = torch.randn(B, cfg.vocab_size, device=r.device, generator=gen)
        logits = torch.randn(B, cfg.predictor.vocab_size, device=r.device, generator=gen)
        seen, banned = r.seen[slots], r.talker.banned_ids(torch.ones(B, dtype=torch.bool, device=r.device))

        def draws():
            sampler.codebook0(logits0, seen, banned)
            for group in range(1, cfg.num_code_groups):
                sampler.acoustic(logits, group)
        fns["sampling"] = captured(draws) if cuda else draws
        names = {"talker": "talker", "codes": "code predictor", "decode": "codec decoder", "prefill": "prefill",
                 "sampling": "sampling"}
        return {names[k]: median_ms(fn, reps, cuda) for k, fn in fns.items()}


def time_host(engine, B: int, reps: int) -> dict[str, float]:
    """The engine loop on B speaking contexts (bench/engine.py's client): per step, the wall time of
    Engine.run_once and the part of it not spent waiting for the GPU (host work); medians of reps steps."""
    from bench.engine import speaking_client
    from talkgate.synth.api import SamplingParams
    client = speaking_client(engine, B, SamplingParams())
    while engine.scheduler.waiting or engine._commands:          # every context prefilled first
        engine.run_once()
    engine.run_once()
    walls, hosts = [], []
    for _ in range(reps):
        wait0 = engine.runner.gpu_wait_s
        t0 = time.perf_counter()
        engine.run_once()
        wall = time.perf_counter() - t0
        walls.append(wall * 1000)
        hosts.append((wall - (engine.runner.gpu_wait_s - wait0)) * 1000)
    engine.disconnect(client)
    engine.run_once()
    return {"host": statistics.median(hosts), "step": statistics.median(walls)}


# ----- the table -----
def row(part: str, B, ms: float, work: Work | None) -> dict:
    out = {"part": part, "batch": B, "ms": round(ms, 4)}
    if work is None:
        return out
    s = ms / 1000
    gflop, gb = work.total_flops / 1e9, work.bytes / 1e9
    out.update(flops=work.total_flops, bytes=work.bytes, gflop=round(gflop, 4), gb=round(gb, 5),
               weight_gb=round(work.weight_bytes / 1e9, 5), state_gb=round(work.state_bytes / 1e9, 5), act_gb=round(work.act_bytes / 1e9, 5),
               flops_by_precision={p: f for p, f in work.flops.items()})
    out["tflops"] = round(gflop / 1e3 / s, 3) if s > 0 else None
    out["gbps"] = round(gb / s, 1) if s > 0 else None
    if part == "host":                                       # PCIe copies and CPU time: no HBM / FLOP roof
        out.update(intensity=None, pct_flops=None, pct_bw=None, bound="host (CPU)", roof_ms=None)
        return out
    out["intensity"] = round(work.total_flops / work.bytes, 2)
    compute_s, memory_s = work.compute_s(), work.bytes / PEAK_BYTES
    out["pct_flops"] = round(100 * compute_s / s, 2) if s > 0 else None
    out["pct_bw"] = round(100 * memory_s / s, 2) if s > 0 else None
    ridge = (work.total_flops / compute_s) / PEAK_BYTES if compute_s else 0.0
    out["ridge"] = round(ridge, 1)
    out["bound"] = "compute" if out["intensity"] and out["intensity"] > ridge else "memory"
    out["roof_ms"] = round(max(compute_s, memory_s) * 1000, 4)
    return out


def markdown(rows: list[dict]) -> str:
    def f(v, fmt):
        return "—" if v is None else format(v, fmt)
    lines = ["| part | batch | ms | GFLOP | GB | TFLOP/s | GB/s | % peak FLOP | % peak BW | FLOP/B | bound | roof ms |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['part']} | {r['batch']} | {r['ms']:.3f} | {f(r.get('gflop'), '.3f')} | "
                     f"{f(r.get('gb'), '.4f')} | {f(r.get('tflops'), '.2f')} | {f(r.get('gbps'), '.0f')} | "
                     f"{f(r.get('pct_flops'), '.1f')} | {f(r.get('pct_bw'), '.1f')} | {f(r.get('intensity'), '.1f')} | "
                     f"{r.get('bound', '')} | {f(r.get('roof_ms'), '.3f')} |")
    return "\n".join(lines)


NOTES = ("code predictor: the whole codes graph, its 16 draws included (sampling: those draws alone, in a graph of "
         "their own); prefill: one new context, the same at every batch; host: the engine thread's time in a step "
         "outside its waits for the GPU, its GB the PCIe copies; step: Engine.run_once's wall time (the host's work "
         "overlaps the GPU's decode). % peak against the H200's datasheet peaks for the part's precisions; roof ms = "
         "max(FLOPs at peak, bytes at peak HBM bandwidth).")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint")
    p.add_argument("--device", help="cuda (default where there is one) or cpu (smoke test: eager, wall clock)")
    p.add_argument("--batches", default="1,8,64,256,512,1024")
    p.add_argument("--reps", type=int, default=20, help="timed repetitions of each part (the median is kept)")
    p.add_argument("--decoder-dtype", help="codec decoder dtype (default float32, as the engine)")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--max-prefills", type=int, default=64, help="new contexts a step prefills (host timing's setup)")
    p.add_argument("--label", default="", help="a name for this model in the output (e.g. 1.7B)")
    p.add_argument("--json", help="write the rows and their setting here")
    a = p.parse_args(argv)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    wanted = sorted({int(b) for b in a.batches.split(",")})
    skipped: dict[int, str] = {}
    engine, t0 = None, time.perf_counter()
    for top in reversed(wanted):                 # the largest batch that fits: a runner sized for it
        try:
            engine = build(a.checkpoint, device, max(top, 2), a.decoder_dtype, not a.no_compile, a.max_prefills)
            break
        except (torch.cuda.OutOfMemoryError, RuntimeError) as e:     # cuDNN reports its failed allocations so
            if not isinstance(e, torch.cuda.OutOfMemoryError) and "out of memory" not in str(e).lower():
                raise
            skipped[top] = f"out of GPU memory building a runner of {top} slots and rows: {str(e).splitlines()[0]}"
            print(f"batch {top} skipped: {skipped[top]}", flush=True)
        gc.collect()                             # the failed runner, once the exception that held it is gone
        torch.cuda.empty_cache()
    if engine is None:
        raise SystemExit("no batch size fits")
    r = engine.runner
    cuda = r.device.type == "cuda"
    batches = [b for b in wanted if b not in skipped]
    if r.use_graphs:
        capture_buckets(r, set(batches))
    setup_s = time.perf_counter() - t0
    cfg, codec_cfg = r.tts.config, r.decoder.config
    decoder_dtype = r.decoder.pre_conv.conv.weight.dtype
    P = prompt_length(r)
    T = next(t for t in r.prefill_lens if t >= P)
    rows = []
    print(f"setup (load, warm-up, captures) {setup_s:.1f} s; prompt {P} positions (prefill graph of {T}); "
          f"rows at position {P + FRAMES}", flush=True)
    for B in batches:
        try:
            ms = time_parts(engine, B, P, T, a.reps)
            ms.update(time_host(engine, B, max(3, a.reps // 2)))
        except torch.cuda.OutOfMemoryError as e:
            skipped[B] = f"out of GPU memory timing it: {str(e).splitlines()[0]}"
            print(f"batch {B} skipped: {skipped[B]}", flush=True)
            continue
        work = count_step(cfg, codec_cfg, B, P, T, r.dtype, decoder_dtype, cuda)
        for part in PARTS:
            if part == "prefill" and B != batches[0]:
                continue
            rows.append(row(part, "1 new" if part == "prefill" else B, ms[part], work[part]))
        rows.append(row("step (engine loop)", B, ms["step"], None))
        print(f"batch {B}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items()), flush=True)
    order = {p: i for i, p in enumerate(PARTS + ("step (engine loop)",))}
    rows.sort(key=lambda x: order[x["part"]])
    gpu = torch.cuda.get_device_name() if cuda else platform.processor()
    lin, cnv = decoder_precisions(decoder_dtype, cuda)
    title = (f"### {a.label or a.checkpoint}: {gpu}, torch {torch.__version__}, Talker/predictor {PRECISION[r.dtype]}, "
             f"codec decoder {PRECISION[decoder_dtype]} (linear {lin}, conv {cnv}), compiled {r.compiled}, "
             f"graphs {r.use_graphs}; prompt {P} (prefill {T}), position {P + FRAMES}; median of {a.reps}")
    print("\n" + title + "\n\n" + markdown(rows) + "\n\n" + NOTES)
    for B, why in sorted(skipped.items()):
        print(f"batch {B}: skipped ({why})")
    if a.json:
        res = {"checkpoint": a.checkpoint, "label": a.label, "gpu": gpu, "torch": torch.__version__,
               "device": device, "dtype": PRECISION[r.dtype], "decoder_dtype": PRECISION[decoder_dtype],
               "decoder_precisions": {"linear": lin, "conv": cnv}, "compiled": r.compiled, "graphs": r.use_graphs,
               "prompt_len": P, "prefill_len": T, "position": P + FRAMES, "frames": FRAMES, "reps": a.reps,
               "peaks": {"flops": PEAK_FLOPS, "bytes_per_s": PEAK_BYTES}, "setup_s": round(setup_s, 1),
               "skipped": {str(b): w for b, w in skipped.items()},
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
