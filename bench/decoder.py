"""Time CodecDecoder.decode_step (n=1 frame per row) at real size: eager and CUDA graph, per batch size.

Usage (from the repository root, on a GPU machine):
    python -m bench.decoder
Options: --batches 1,8,32,128,256  --precisions bf16,fp16,fp32-tf32,fp32,fp32-engine  --iters 30  --compile
         --frames 1,2,4  (frames per row a step: several frames of one context in one call, the chunk-size lever)
         --cudnn-search  (cuDNN's algorithm search, as the engine's decode graphs run: torch.backends.cudnn.benchmark)
         --matmul-macs 0,1073741824  (synth.codec_decoder.MATMUL_MACS values to time, default: as shipped)
         --engine-compile  (compile what the engine compiles, as it runs the decoder)

Random weights in the released layout (speech tokenizer weights cannot be downloaded here). Rows use
scattered slots of a 256+1-slot pool whose windows are full (positions > 72). Also checks that a
graph replay equals the eager step, that frame-by-frame decoding equals a full decode on the GPU, and
how far bf16, fp16 and TF32 are from exact fp32; prints a kernel profile of one bf16 step.
"""
import argparse
import tempfile
import time
import traceback

import torch

from talkgate.synth import codec_decoder
from talkgate.synth.codec_decoder import load_codec_decoder
from talkgate.synth.decoder_precision import snr_db
from talkgate.synth.random_speech_tokenizer import write_random_codec_decoder

# fp32-engine: torch's defaults, which the engine keeps (TF32 convolutions, the convolutions computed as a
# multiply too: codec_decoder.conv_addmm; exact float32 matmuls)
PRECISIONS = {"bf16": (torch.bfloat16, False), "fp16": (torch.float16, False), "fp32-tf32": (torch.float32, True),
              "fp32": (torch.float32, False), "fp32-engine": (torch.float32, "convolutions")}


def set_tf32(on):
    torch.backends.cuda.matmul.allow_tf32 = on is True
    torch.backends.cudnn.allow_tf32 = bool(on)


def fill_state(state, gen):
    """Every slot well past the 72-frame window, with non-zero history (timing does not depend on values)."""
    state.pos.copy_(torch.randint(100, 1000, state.pos.shape, generator=gen))
    for t, scale in ((state.tails, 0.1), (state.kv, 1.0)):  # a fixed pattern: no GPU RNG near graph captures
        t.view(-1).copy_(torch.arange(t.numel(), device=t.device, dtype=torch.float32).mul_(0.37).sin_().mul_(scale))


def timed(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e3


def snapshot(state):
    return state.tails.clone(), state.kv.clone(), state.pos.clone()


def restore(state, snap):
    state.tails.copy_(snap[0]), state.kv.copy_(snap[1]), state.pos.copy_(snap[2])


def bench_precision(name, path, batches, iters, gen, engine_compile=False, frames=(1,)):
    dtype, tf32 = PRECISIONS[name]
    set_tf32(tf32)
    model = load_codec_decoder(path, "cuda", dtype)
    if engine_compile:
        import tempfile

        from talkgate.synth.runner import compile_hot_functions
        compile_hot_functions(model, folder=tempfile.mkdtemp(prefix="talkgate-bench-functions-"))
    cfg = model.config
    slots_total = max(batches) + 1
    state = model.alloc_state(slots_total)
    fill_state(state, gen)
    rows = []
    for B, n in [(B, n) for B in sorted(batches, reverse=True) for n in frames]:
        codes = torch.randint(0, cfg.codebook_size, (B, cfg.num_quantizers, n), generator=gen).cuda()
        slots = torch.randperm(slots_total, generator=gen)[:B].cuda()
        t = time.perf_counter()
        model.decode_step(codes, slots, state)
        torch.cuda.synchronize()
        print(f"{name} B={B} n={n}: first step {time.perf_counter() - t:.1f} s (compiles, if any)", flush=True)
        eager_ms = timed(lambda: model.decode_step(codes, slots, state), iters)

        snap = snapshot(state)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up off the capture stream, as CUDA graphs want
            for _ in range(2):
                model.decode_step(codes, slots, state)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # own pool per graph (a graph_pool_handle() pool hit an allocator assert in torch 2.11)
            out = model.decode_step(codes, slots, state)
        restore(state, snap)
        expected = model.decode_step(codes, slots, state).clone()
        after_eager = snapshot(state)
        restore(state, snap)
        graph.replay()
        torch.cuda.synchronize()
        diff = (out - expected).abs().max().item()
        state_diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(snapshot(state), after_eager))
        graph_ms = timed(graph.replay, iters)
        rows.append((name, B, n, eager_ms, graph_ms, diff, state_diff))
        del graph
    peak = torch.cuda.max_memory_allocated() / 2**30
    del model, state
    torch.cuda.empty_cache()
    return rows, peak


def bench_compiled(path, batches, iters, gen):
    """torch.compile'd step (bf16, default mode, no CUDA graph): how much fusing the elementwise ops would save."""
    set_tf32(False)
    model = load_codec_decoder(path, "cuda", torch.bfloat16)
    state = model.alloc_state(max(batches) + 1)
    fill_state(state, gen)
    step = torch.compile(model.decode_step, fullgraph=True, dynamic=False)
    for B in batches:
        codes = torch.randint(0, 2048, (B, 16, 1), generator=gen).cuda()
        slots = torch.randperm(state.num_slots, generator=gen)[:B].cuda()
        try:
            t = time.perf_counter()
            step(codes, slots, state)
            compile_s = time.perf_counter() - t
            print(f"compiled bf16 B={B}: {timed(lambda: step(codes, slots, state), iters):.3f} ms/step eager "
                  f"(compile {compile_s:.0f} s)", flush=True)
        except Exception as e:  # report and go on
            print(f"compile failed for B={B}: {type(e).__name__}: {str(e)[:500]}")


def profile(path, batches, gen):
    """Which kernels an eager step launches and where the GPU time goes (float32 as the engine runs it)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    set_tf32("convolutions")
    model = load_codec_decoder(path, "cuda", torch.float32)
    state = model.alloc_state(max(batches) + 1)
    fill_state(state, gen)
    for B in batches:
        codes = torch.randint(0, 2048, (B, 16, 1), generator=gen).cuda()
        slots = torch.randperm(state.num_slots, generator=gen)[:B].cuda()
        for _ in range(3):
            model.decode_step(codes, slots, state)
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            model.decode_step(codes, slots, state)
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
        busy = sum(e.device_time for e in kernels) / 1e3
        print(f"fp32-engine B={B}: {len(kernels)} kernels per step, {busy:.3f} ms of kernel time")
        print(prof.key_averages().table(sort_by="device_time_total", row_limit=12, max_name_column_width=60))


def accuracy(path, gen):
    """Max / RMS error of bf16 and TF32 against exact fp32 on the same random codes, and frame-by-frame
    decoding against a full decode (fp32, exact)."""
    codes = torch.randint(0, 2048, (2, 16, 90), generator=gen).cuda()
    set_tf32(False)
    exact_model = load_codec_decoder(path, "cuda", torch.float32)
    exact = exact_model.decode(codes)
    state = exact_model.alloc_state(2)
    slots = torch.arange(2, device="cuda")
    stepped = torch.cat([exact_model.decode_step(codes[..., i:i + 1], slots, state) for i in range(90)], dim=1)
    print(f"fp32 on GPU: frame-by-frame vs full decode, 90 frames: max abs err {(stepped - exact).abs().max().item():.2e}")
    for name in ("fp32-tf32", "bf16", "fp16"):
        dtype, tf32 = PRECISIONS[name]
        set_tf32(tf32)
        got = load_codec_decoder(path, "cuda", dtype).decode(codes)
        err = got - exact
        snr = snr_db(exact, got)
        print(f"{name} vs exact fp32: max abs err {err.abs().max().item():.3e}, rms err {err.pow(2).mean().sqrt().item():.3e}, "
              f"signal rms {exact.pow(2).mean().sqrt().item():.3e}, SNR {snr:.1f} dB")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,32,128,256")
    ap.add_argument("--precisions", default="bf16,fp16,fp32-tf32,fp32")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile'd eager steps (bf16; B=1, max B)")
    ap.add_argument("--engine-compile", action="store_true",
                    help="torch.compile the parts the engine compiles (synth.runner.compile_hot_functions) first")
    ap.add_argument("--frames", default="1", help="frames per row a step, several: each timed")
    ap.add_argument("--cudnn-search", action="store_true", help="torch.backends.cudnn.benchmark on, as the engine's")
    ap.add_argument("--no-accuracy", action="store_true", help="skip the accuracy checks (four more models)")
    ap.add_argument("--matmul-macs", default=str(codec_decoder.MATMUL_MACS),
                    help="convolutions of at most this many multiply-adds run as one multiply; several: each timed")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    frames = [int(n) for n in args.frames.split(",")]
    torch.backends.cudnn.benchmark = args.cudnn_search
    gen = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        path = write_random_codec_decoder(tmp, None, seed=0)
        print(f"random real-size checkpoint written in {time.perf_counter() - t:.1f} s")
        if not args.no_accuracy:
            accuracy(path, gen)
        print("| precision | B | frames a row | eager ms/step | CUDA graph ms/step | graph us/frame "
              "| graph-vs-eager max diff (pcm, state) |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for name in args.precisions.split(","):
            for macs in [int(c) for c in args.matmul_macs.split(",")]:
                codec_decoder.MATMUL_MACS = macs
                try:
                    rows, peak = bench_precision(name, path, batches, args.iters, gen, args.engine_compile, frames)
                except Exception:
                    traceback.print_exc()
                    continue
                label = f"{name}, multiply <= 2^{macs.bit_length() - 1 if macs else '-inf'} MACs"
                for _, B, n, eager, graph, diff, sdiff in sorted(rows, key=lambda r: (r[1], r[2])):
                    print(f"| {label} | {B} | {n} | {eager:.3f} | {graph:.3f} | {graph / (B * n) * 1e3:.1f} | "
                          f"{diff:.1e}, {sdiff:.1e} |")
                print(f"| {label} peak GPU memory {peak:.2f} GiB (state pool of {max(batches) + 1} slots included) |")
        try:
            profile(path, [1, max(batches)], gen)
        except Exception:
            traceback.print_exc()
        if args.compile:
            bench_compiled(path, [1, max(batches)], args.iters, gen)


if __name__ == "__main__":
    main()
