"""Would the codec decoder of step t beside step t + 1's Talker and code predictor pay at large batch? (issue 44)

    python -m bench.decode_overlap /tmp/ck-1.7b --batches 16,64,128,256,512

A frame's decode does not feed the next frame: step t + 1's Talker needs step t's codes, not its PCM. The runner
runs the three graphs of a step one after the other on one stream, so a step costs their sum. Tried before at
one row only (docs/benchmarks.md, 2026-11-22/23), where the persistent kernels hold every SM and the decoder had
nowhere to run. From 3 rows on the parts are the per-layer kernels, and the code predictor's many small kernels
leave most of the GPU idle between them. This times, on the engine's own captured graphs of B rows (bench/roofline.py's
runner, its rows mid-utterance):
  serial      talker, codes, decode of each step on one stream (today)
  pipelined   talker and codes on the main stream, the decode of the same step on a second stream behind an event,
              the main stream's step t + 1 waiting for decode t - 1 (one decode in flight beside one step: the
              decoder's inputs are double-buffered in a real pipeline, not more)
ms a step, the mean over --steps steps after a warm-up. Timing only: the pipelined decode is the decode graph
captured again into a memory pool of its own, but it reads the step buffers the next step writes, so its PCM is
not meaningful; a real pipeline gives the decode inputs of its own.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from bench.roofline import build, capture_buckets, prompt_length, time_parts


def steps_ms(fn, steps: int) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint")
    p.add_argument("--batches", default="16,64,128,256,512")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--json")
    a = p.parse_args(argv)
    batches = sorted({int(b) for b in a.batches.split(",")})
    t0 = time.perf_counter()
    engine = build(a.checkpoint, "cuda", batches[-1], None, True, 64)
    r = engine.runner
    capture_buckets(r, set(batches))
    P = prompt_length(r)
    T = next(t for t in r.prefill_lens if t >= P)
    print(f"setup {time.perf_counter() - t0:.1f} s; {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    main_s = torch.cuda.current_stream()
    rows = []
    for prio in (0, -1):
        side = torch.cuda.Stream(priority=prio)
        for B in batches:
            parts = time_parts(engine, B, P, T, 20)            # also sets the B rows' inputs
            talker, codes, decode = (r.graphs[(part, B)].replay for part in ("talker", "codes", "decode"))
            # the pipelined decode: the same graph captured into a pool of its own (in the shared pool its
            # intermediates would alias the Talker's and code predictor's running beside it)
            r._capture(("overlap decode", B), r._parts["decode"], B, pool=torch.cuda.graph_pool_handle())
            side_decode = r.graphs.pop(("overlap decode", B)).replay

            def serial():
                talker(), codes(), decode()

            made = [torch.cuda.Event() for _ in range(2)]
            decoded = [torch.cuda.Event() for _ in range(2)]
            state = {"i": 0}

            def pipelined():
                i = state["i"]
                state["i"] += 1
                if i >= 2:
                    main_s.wait_event(decoded[i % 2])      # decode t - 2's inputs free again
                talker(), codes()
                made[i % 2].record(main_s)
                side.wait_event(made[i % 2])
                with torch.cuda.stream(side):
                    side_decode()
                decoded[i % 2].record(side)

            s_ms = steps_ms(serial, a.steps)
            p_ms = steps_ms(pipelined, a.steps)
            main_s.wait_stream(side)
            torch.cuda.synchronize()
            row = {"batch": B, "side_priority": prio, "talker": parts["talker"], "codes": parts["code predictor"],
                   "decode": parts["codec decoder"], "serial": s_ms, "pipelined": p_ms}
            rows.append(row)
            print(f"B {B:4d} side priority {prio:2d}: talker {row['talker']:.3f} codes {row['codes']:.3f} "
                  f"decode {row['decode']:.3f} | serial {s_ms:.3f} ms/step, pipelined {p_ms:.3f} "
                  f"({100 * (1 - p_ms / s_ms):.1f}% less)", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "checkpoint": a.checkpoint,
                       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
