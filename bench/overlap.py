"""Can frame t's codec decode run beside frame t + 1's Talker and code predictor on the same SMs?

At 255 registers a thread the persistent kernels (8 warps, one program an SM) take every SM's whole
register file, so a decoder kernel on another stream waits until they end (docs/benchmarks.md). With a
register cap (Triton's maxnreg, added to their launches here) they leave room for the decoder's blocks beside
them. Measured as a loss (docs/benchmarks.md): the engine does not do this. For each variant
(register cap, weights in flight) this recaptures the batch-1 Talker and codes graphs of the engine's runner
and times: each graph alone, a step serially (Talker, codes, decode on one stream), and steps pipelined: the
decode of frame t on a second stream beside frame t + 1, reading its own copy of the codes and slots, which
the main stream refreshes after frame t + 1's codes once frame t's decode is done (no codes wait: the
decode overlaps the Talker and the code predictor).

    python3 bench/overlap.py /tmp/ck-0.6b none:24576 128:16384 168:24576
"""
import sys

import torch

from talkgate.bench.engine import batch1_runner, graph_ms
from talkgate.synth import persistent


KERNELS = {name: getattr(persistent, name) for name in ("talker_kernel", "predictor_kernel")}


class Capped:
    """A persistent kernel launched with a register cap."""
    def __init__(self, kernel, cap):
        self.kernel, self.cap = kernel, cap

    def __getitem__(self, grid):
        return lambda *args, **kw: self.kernel[grid](*args, **kw, maxnreg=self.cap)


def kernel_resources() -> list[str]:
    """Registers, spills and shared memory of each kernel's latest compile (Triton's JIT cache, in order)."""
    out = []
    for name, fn in KERNELS.items():
        for cache in fn.device_caches.values():
            k = list(cache[0].values())[-1]
            out.append(f"{name}: {k.n_regs} registers, {k.n_spills} spilled, {k.metadata.shared} B shared")
    return out


def events_ms(fn, reps, streams):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record(streams[0])
    for _ in range(reps):
        fn()
    for s in streams[1:]:
        streams[0].wait_stream(s)
    b.record(streams[0])
    torch.cuda.synchronize()
    return round(a.elapsed_time(b) / reps, 3)


def main():
    ck, variants = sys.argv[1], sys.argv[2:] or ["none:24576", "128:16384"]
    r = batch1_runner(ck)
    prefetch = persistent.PREFETCH
    main_s = torch.cuda.current_stream()
    with torch.inference_mode():
        # the decoder's own copy of its inputs (codes, slots): frame t + 1's codes graph rewrites the runner's
        dec_codes, dec_inputs = torch.zeros_like(r.codes), torch.zeros_like(r.inputs)

        def refresh():
            dec_codes.copy_(r.codes)
            dec_inputs[0].copy_(r.inputs[0])

        def capture(name, fn, pool):                # the runner's capture (warm on a side stream), under a key of ours
            r._capture((f"overlap-{name}", 1), pool, fn, 1)
            return r.graphs.pop((f"overlap-{name}", 1))

        refresh()
        codes, inputs = r.codes, r.inputs
        r.codes, r.inputs = dec_codes, dec_inputs  # the runner's decode step, captured reading the copy
        dg = capture("decode", r._decode_step, torch.cuda.graph_pool_handle())     # a pool of its own: runs beside
        r.codes, r.inputs = codes, inputs
        print(f"decode graph alone {graph_ms(dg, 100)} ms", flush=True)
        rows = []
        for v in variants:
            regs, inflight = v.split(":")
            for name, k in KERNELS.items():
                setattr(persistent, name, k if regs == "none" else Capped(k, int(regs)))
            persistent.PREFETCH = int(inflight)
            persistent.tiles.cache_clear()
            pool = torch.cuda.graph_pool_handle()
            tg, cg = capture("talker", r._talker_step, pool), capture("codes", r._codes_step, pool)
            torch.cuda.synchronize()
            print(f"--- {v}:", "; ".join(kernel_resources()), flush=True)
            t_ms, c_ms, d_ms = graph_ms(tg, 100), graph_ms(cg, 100), graph_ms(dg, 100)

            def serial():
                tg.replay(); cg.replay(); refresh(); dg.replay()
            s_ms = events_ms(serial, 200, [main_s])
            res = {"variant": v, "talker": t_ms, "codes": c_ms, "decode": d_ms, "serial": s_ms}
            for prio in (0, -1):
                ds = torch.cuda.Stream(priority=prio)
                codes_ready = [torch.cuda.Event() for _ in range(2)]
                dec_done = [torch.cuda.Event() for _ in range(2)]
                for e in dec_done:
                    e.record(ds)
                step = [0]

                def pipelined():
                    t = step[0]
                    step[0] += 1
                    tg.replay()
                    cg.replay()
                    main_s.wait_event(dec_done[(t - 1) % 2])     # frame t - 1's decode has read its inputs
                    refresh()
                    codes_ready[t % 2].record(main_s)
                    ds.wait_event(codes_ready[t % 2])
                    with torch.cuda.stream(ds):
                        dg.replay()
                    dec_done[t % 2].record(ds)
                events_ms(pipelined, 20, [main_s, ds])
                res[f"pipelined_prio{prio}"] = events_ms(pipelined, 300, [main_s, ds])
            rows.append(res)
            print(res, flush=True)
        for name, k in KERNELS.items():
            setattr(persistent, name, k)
        persistent.PREFETCH = prefetch
        persistent.tiles.cache_clear()
        print("\n| variant (cap:in flight) | talker | codes | decode | serial step | pipelined |"
              " pipelined, decode stream high priority |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for x in rows:
            print(f"| {x['variant']} | {x['talker']} | {x['codes']} | {x['decode']} | {x['serial']} | "
                  f"{x['pipelined_prio0']} | {x['pipelined_prio-1']} |")


if __name__ == "__main__":
    main()
