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
Peaks: the GPU's own, by the vendor's datasheet (dense; synth/roofline.py GPU_PEAKS): bf16 / fp16 989 TFLOP/s, TF32
495, fp32 67 on the H200 and the H100 SXM alike, HBM 4.8 TB/s on the H200 and 3.35 on the H100; a GPU not listed
there (and the CPU smoke test) is set against the H200's, and the title says so. Measured on H200 machines here
(KINDS.md): a bf16 8192^3 matmul 770-800 TFLOP/s, a device-to-device copy 4.3 TB/s: the practical ceilings are ~80%
and ~90% of these.
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import time

import torch

from talkgate.synth.roofline import (FRAMES, H200, PARTS, PRECISION, Peaks, Work, count_step, decoder_precisions,
                                     gpu_peaks)


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
        r.main.inputs[0, :B] = torch.arange(B)
        r.main.inputs[1, :B] = prompt_len + FRAMES
        r.main.inputs[2, :B] = r.text_pad
        r.main.inputs[3, :B] = FRAMES
        r.main.inputs[4, :B] = r.talker.page_table[:B, (prompt_len + FRAMES) // r.page_len]   # each slot's own page
        r.dec_state.pos[:B] = FRAMES
        r.min_frames[:B] = 1 << 40               # no eos: every row makes a frame, as mid-utterance
        r.pre_in[0, 0], r.pre_in[0, 1] = B, prompt_len - 1       # the prefill's new context in slot B
        r.pre_in[0, 2 + r.max_prompt:] = r.talker.page_table[B, :r.prompt_pages]    # ... in its own pages
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
        slots, frame = r.main.inputs[0, :B], r.main.inputs[3, :B]
        sampler = FrameSampler(r.sampling, frame, slots)
        cfg = r.talker.cfg
        gen = torch.Generator(device=r.device).manual_seed(0)
        logits0 = torch.randn(B, cfg.vocab_size, device=r.device, generator=gen)
        logits = torch.randn(B, cfg.predictor.vocab_size, device=r.device, generator=gen)
        allow_eos = torch.ones(B, dtype=torch.bool, device=r.device)

        def draws():
            sampler.codebook0(logits0, r.seen, r.talker.suppressed, cfg.codec_eos, allow_eos)
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
def row(part: str, B, ms: float, work: Work | None, peaks: Peaks) -> dict:
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
    compute_s, memory_s = work.compute_s(peaks), work.bytes / peaks.bytes_per_s
    out["pct_flops"] = round(100 * compute_s / s, 2) if s > 0 else None
    out["pct_bw"] = round(100 * memory_s / s, 2) if s > 0 else None
    ridge = (work.total_flops / compute_s) / peaks.bytes_per_s if compute_s else 0.0
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
         "overlaps the GPU's decode). % peak against the GPU's datasheet peaks for the part's precisions; roof ms = "
         "max(FLOPs at peak, bytes at peak HBM bandwidth).")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint")
    p.add_argument("--device", help="cuda (default where there is one) or cpu (smoke test: eager, wall clock)")
    p.add_argument("--batches", default="1,8,64,256,512,1024")
    p.add_argument("--reps", type=int, default=20, help="timed repetitions of each part (the median is kept)")
    p.add_argument("--decoder-dtype", help="codec decoder dtype (default: as the engine chooses, synth/decoder_precision.py)")
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
    gpu = torch.cuda.get_device_name() if cuda else platform.processor()
    known = gpu_peaks(gpu)                     # None for the CPU's processor name and for GPUs not listed
    peaks, peaks_of = (known, gpu) if known else (H200, "the H200 (no peaks of this device in synth/roofline.py)")
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
            rows.append(row(part, "1 new" if part == "prefill" else B, ms[part], work[part], peaks))
        rows.append(row("step (engine loop)", B, ms["step"], None, peaks))
        print(f"batch {B}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items()), flush=True)
    order = {p: i for i, p in enumerate(PARTS + ("step (engine loop)",))}
    rows.sort(key=lambda x: order[x["part"]])
    lin, cnv = decoder_precisions(decoder_dtype, cuda)
    title = (f"### {a.label or a.checkpoint}: {gpu}, torch {torch.__version__}, Talker/predictor {PRECISION[r.dtype]}, "
             f"codec decoder {PRECISION[decoder_dtype]} (linear {lin}, conv {cnv}), compiled {r.compiled}, "
             f"graphs {r.use_graphs}; prompt {P} (prefill {T}), position {P + FRAMES}; median of {a.reps}; "
             f"% peak against {peaks_of}'s")
    print("\n" + title + "\n\n" + markdown(rows) + "\n\n" + NOTES)
    for B, why in sorted(skipped.items()):
        print(f"batch {B}: skipped ({why})")
    if a.json:
        res = {"checkpoint": a.checkpoint, "label": a.label, "gpu": gpu, "torch": torch.__version__,
               "device": device, "dtype": PRECISION[r.dtype], "decoder_dtype": PRECISION[decoder_dtype],
               "decoder_precisions": {"linear": lin, "conv": cnv}, "compiled": r.compiled, "graphs": r.use_graphs,
               "prompt_len": P, "prefill_len": T, "position": P + FRAMES, "frames": FRAMES, "reps": a.reps,
               "peaks": {"of": peaks_of, "flops": peaks.flops, "bytes_per_s": peaks.bytes_per_s},
               "setup_s": round(setup_s, 1),
               "skipped": {str(b): w for b, w in skipped.items()},
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
