"""Can a new context's first frame run beside a running step instead of after it? A probe for issue 45.

    python -m bench.first_lane /tmp/ck-1.7b --batches 32,128,256 --reps 20 [--json out.json]

Under load a new context waits for the running step to end (`engine_received` in the latency budget: 3.7 / 7.2 ms
p50 / p95 at 20 req/s of 1.7B on an H200) before its prefill and first frame even start. If its first frame ran on a
second CUDA stream of high priority, with static step buffers and graphs of its own (a "lane"), beside the running
step's kernels, its first audio would cost its own pass, slowed by the sharing, not the rest of a step plus its pass.
This measures that with the engine's own runner and graphs: B running rows (slots 0..B-1, mid-utterance) replayed on
the default stream, and one new row's Talker, code predictor and decoder graphs (1 row: the persistent cooperative
kernels; 4 rows: the general kinds, 3 padding rows) captured a second time with their own buffers and memory pool on
a stream of the highest priority, launched 0 ms or half a step after the running step. Printed per batch: the step
alone, the lane alone, the lane's time from its launch to its last kernel beside the step (against waiting for the
step: what is left of it + the lane alone), and how much longer the step took. Also the warm-up's peak GPU memory
above the runner's own (runner_build.WARMUP_BYTES_PER_ROW budgets 50 MiB a row of the largest step).
Not an engine feature: the engine would also have to notice a command while it waits for the GPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch

from talkgate.synth.runner import StepBuffers

FRAMES = 100                     # the running rows' position: this many frames into their utterance


def capture(fn, b: int, stream, pool) -> torch.cuda.CUDAGraph:
    """fn(b) warmed, then captured on `stream` into `pool` (as Runner._capture, apart from the runner's pool)."""
    g = torch.cuda.CUDAGraph()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(b)
        stream.synchronize()
        g.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            fn(b)
        finally:
            g.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    return g


def lane_graphs(r, rows: int, slot: int, stream) -> list[torch.cuda.CUDAGraph]:
    """The three step graphs of `rows` rows over a second set of the runner's static step buffers (row 0: the new
    context in `slot` at frame 1; the others the dummy slot), captured on `stream`; the runner keeps its own."""
    bufs = StepBuffers(*(getattr(r.main, f.name).clone() for f in dataclasses.fields(StepBuffers)))
    bufs.inputs.zero_()
    bufs.inputs[0] = r.dummy
    bufs.inputs[2] = r.text_pad
    bufs.inputs[0, 0], bufs.inputs[1, 0], bufs.inputs[3, 0] = slot, 10, 1
    bufs.inputs[4, 0] = r.talker.page_table[slot, 10 // r.page_len]          # the slot's own page
    pool = torch.cuda.graph_pool_handle()
    parts = r._parts_of(bufs)
    return [capture(parts[part], rows, stream, pool) for part in ("talker", "codes", "decode")]


def spin_until(t: float) -> None:
    while time.perf_counter() < t:
        pass


def probe(r, B: int, lane: list, stream, reps: int) -> dict:
    main = [r.graphs[(part, B)] for part in ("talker", "codes", "decode")]
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]

    def run(graphs, on, start, end):
        with torch.cuda.stream(on):
            start.record()
            for g in graphs:
                g.replay()
            end.record()

    default = torch.cuda.current_stream()
    alone = {"step": [], "lane": []}
    for _ in range(reps):
        run(main, default, ev[0], ev[1])
        torch.cuda.synchronize()
        run(lane, stream, ev[2], ev[3])
        torch.cuda.synchronize()
        alone["step"].append(ev[0].elapsed_time(ev[1]))
        alone["lane"].append(ev[2].elapsed_time(ev[3]))
    step_ms, lane_ms = (statistics.median(v) for v in alone.values())
    out = {"batch": B, "step_alone_ms": round(step_ms, 3), "lane_alone_ms": round(lane_ms, 3)}
    for frac in (0.0, 0.5):
        beside, step_beside = [], []
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            run(main, default, ev[0], ev[1])
            spin_until(t0 + frac * step_ms / 1000)
            run(lane, stream, ev[2], ev[3])
            torch.cuda.synchronize()
            beside.append(ev[2].elapsed_time(ev[3]))
            step_beside.append(ev[0].elapsed_time(ev[1]))
        key = f"at_{int(frac * 100)}pct"
        out[key] = {"lane_beside_ms": round(statistics.median(beside), 3),
                    "lane_beside_p95_ms": round(sorted(beside)[int(0.95 * (len(beside) - 1))], 3),
                    "waiting_instead_ms": round((1 - frac) * step_ms + lane_ms, 3),
                    "step_beside_ms": round(statistics.median(step_beside), 3)}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--batches", default="32,128,256")
    p.add_argument("--lane-rows", default="1,4")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--json")
    args = p.parse_args(argv)
    from bench.roofline import capture_buckets, prompt_length
    from talkgate.synth.runner_build import load_runner

    batches = [int(b) for b in args.batches.split(",")]
    top = max(batches)
    r, *_ = load_runner(args.checkpoint, device="cuda", max_contexts=top + 2, max_batch=top,
                        max_frames_per_context=FRAMES + 60)
    held = torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    r.warmup(first_audio_only=True)
    capture_buckets(r, batches)
    peak = torch.cuda.max_memory_reserved()
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "decoder_dtype": str(next(r.decoder.parameters()).dtype),
              "warmup_s": round(time.perf_counter() - t0, 1), "held_before_warmup_gib": round(held / 2**30, 2),
              "warmup_peak_gib": round(peak / 2**30, 2),
              "warmup_peak_per_row_mib": round((peak - held) / top / 2**20, 1), "runs": []}
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}), flush=True)
    with torch.inference_mode():
        plen = prompt_length(r)
        r.main.inputs[0, :top] = torch.arange(top)
        r.main.inputs[1, :top] = plen + FRAMES
        r.main.inputs[2, :top] = r.text_pad
        r.main.inputs[3, :top] = FRAMES
        r.main.inputs[4, :top] = r.talker.page_table[:top, (plen + FRAMES) // r.page_len]   # each slot's own page
        r.dec_state.pos[:top] = FRAMES
        r.min_frames[:] = 1 << 40                      # no eos: every row makes a frame
        hi = torch.cuda.Stream(priority=-100)          # mapped to the highest the device has
        for rows in (int(x) for x in args.lane_rows.split(",")):
            lane = lane_graphs(r, rows, top + 1, hi)
            for B in batches:
                run = {"lane_rows": rows, **probe(r, B, lane, hi, args.reps)}
                result["runs"].append(run)
                print(json.dumps(run), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
