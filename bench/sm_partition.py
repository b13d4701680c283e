"""Should the codec decoder run on SMs of its own, beside the next frame's Talker and code predictor?
Batch-1 graphs of the engine's runner, first on the whole GPU, then on two CUDA green contexts (disjoint
SM partitions, made through the driver API): the decoder on the first `dec_sms`, the Talker and code
predictor (their persistent kernels launched with one program per SM of their partition) on the rest.
Prints each graph alone, a step run serially, and steps pipelined (frame t's decode beside frame t + 1's
Talker and codes). Measured as a loss (docs/benchmarks.md), so the engine does not do this.

    python3 bench/sm_partition.py /tmp/ck-0.6b 16,24      # a checkpoint, decoder partition sizes
"""
import ctypes
import sys
import time

import torch

from talkgate.bench.engine import batch1_runner
from talkgate.synth import persistent

cu = ctypes.CDLL("libcuda.so.1")
for name in ("cuDeviceGetDevResource", "cuDevSmResourceSplitByCount", "cuDevResourceGenerateDesc",
             "cuGreenCtxCreate", "cuGreenCtxStreamCreate"):
    getattr(cu, name).restype = ctypes.c_int


def check(r, what):
    if r:
        raise RuntimeError(f"{what}: CUresult {r}")


def partitions(dec_sms):
    dev = ctypes.c_int(torch.cuda.current_device())
    whole = ctypes.create_string_buffer(512)
    check(cu.cuDeviceGetDevResource(dev, whole, ctypes.c_int(1)), "getdevresource")
    part, rest = ctypes.create_string_buffer(512), ctypes.create_string_buffer(512)
    n = ctypes.c_uint(1)
    check(cu.cuDevSmResourceSplitByCount(part, ctypes.byref(n), whole, rest, ctypes.c_uint(0), ctypes.c_uint(dec_sms)),
          "split")
    out = []
    for r in (part, rest):
        desc, g, s = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        check(cu.cuDevResourceGenerateDesc(ctypes.byref(desc), r, ctypes.c_uint(1)), "desc")
        check(cu.cuGreenCtxCreate(ctypes.byref(g), desc, dev, ctypes.c_uint(1)), "greenctx")
        check(cu.cuGreenCtxStreamCreate(ctypes.byref(s), g, ctypes.c_uint(1), ctypes.c_int(0)), "stream")
        count = ctypes.c_uint.from_buffer(r, 96).value
        out.append((count, torch.cuda.get_stream_from_external(s.value)))
    return out   # [(dec count, dec stream), (gen count, gen stream)]


def timed(fn, reps, stream=None):
    s = stream or torch.cuda.current_stream()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record(s)
    for _ in range(reps):
        fn()
    b.record(s)
    torch.cuda.synchronize()
    return round(a.elapsed_time(b) / reps, 3)


def main():
    ck = sys.argv[1]
    sizes = [int(x) for x in sys.argv[2].split(",")]
    r = batch1_runner(ck)
    with torch.inference_mode():
        g = {p: r.graphs[(p, 1)] for p in ("talker", "codes", "decode")}
        for p in g:
            print(f"full GPU {p} alone {timed(g[p].replay, 100)} ms", flush=True)
        seq = lambda: [g[p].replay() for p in ("talker", "codes", "decode")]
        print(f"full GPU sequential step {timed(seq, 200)} ms", flush=True)
        for dec_sms in sizes:
            (nd, ds), (ng, gs) = partitions(dec_sms)
            print(f"--- partitions: decoder {nd} SMs, talker+codes {ng} SMs", flush=True)
            persistent.programs = lambda dev, n=ng: n
            pool = torch.cuda.graph_pool_handle()
            pg = {}
            for p, fn, s in (("talker", r._talker_step, gs), ("codes", r._codes_step, gs),
                             ("decode", r._decode_step, ds)):
                s.wait_stream(torch.cuda.current_stream())
                t1 = time.time()
                with torch.cuda.stream(s):
                    fn(1)
                torch.cuda.synchronize()
                print(f"  {p} warm on its partition {time.time() - t1:.1f} s", flush=True)
                pg[p] = torch.cuda.CUDAGraph()
                with torch.cuda.graph(pg[p], pool=pool, stream=s):
                    fn(1)
                torch.cuda.synchronize()
            for p, s in (("talker", gs), ("codes", gs), ("decode", ds)):
                def rep(p=p, s=s):
                    with torch.cuda.stream(s):
                        pg[p].replay()
                print(f"  {p} alone on its partition {timed(rep, 100, s)} ms", flush=True)

            def one_step():   # latency of a whole step on the partitions (first PCM's path)
                with torch.cuda.stream(gs):
                    pg["talker"].replay(); pg["codes"].replay()
                ds.wait_stream(gs)
                with torch.cuda.stream(ds):
                    pg["decode"].replay()
                gs.wait_stream(ds)
            print(f"  one step, talker+codes then decode, serial: {timed(one_step, 100, gs)} ms", flush=True)
            evs = [torch.cuda.Event() for _ in range(2)]
            dec_done = [torch.cuda.Event() for _ in range(2)]
            for i in range(2):
                dec_done[i].record(ds)
            state = [0]

            def pipelined():
                t = state[0]
                state[0] += 1
                with torch.cuda.stream(gs):
                    pg["talker"].replay()
                    gs.wait_event(dec_done[(t - 1) % 2])    # codes buffer free: the last decode read it
                    pg["codes"].replay()
                    evs[t % 2].record(gs)
                with torch.cuda.stream(ds):
                    ds.wait_event(evs[t % 2])
                    pg["decode"].replay()
                    dec_done[t % 2].record(ds)
            for n in (50, 200):
                torch.cuda.synchronize()
                t1 = time.perf_counter()
                for _ in range(n):
                    pipelined()
                torch.cuda.synchronize()
                print(f"  pipelined: {n} steps, {(time.perf_counter() - t1) * 1000 / n:.3f} ms a step (wall)",
                      flush=True)
            # host-clock free: events across both streams
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            a.record(gs)
            for _ in range(200):
                pipelined()
            ds.wait_stream(gs)
            b.record(ds)
            torch.cuda.synchronize()
            print(f"  pipelined, events: {a.elapsed_time(b) / 200:.3f} ms a step", flush=True)


if __name__ == "__main__":
    main()
