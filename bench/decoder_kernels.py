"""Where the engine's graphs of B rows go, kernel by kernel: a part's replay time, then each kernel of one replay in
order (median duration over 10 replays, the gap before it, grid and block, name), and the kernel time summed by
kind. Loads the checkpoint as the engine does (compiled parts, the CUDA graphs an engine of B slots captures before
it is ready: B's with cuDNN's algorithm search). Parts: the step's three graphs, talker, codes (the Talker's codec
head, the code predictor's 15 passes and the draws), decode (the codec decoder).

    python -m bench.decoder_kernels /tmp/ck-0.6b OUTDIR [B] [PARTS]   # OUTDIR gets the traces; B: 1; PARTS: decode
    python -m bench.decoder_kernels /tmp/ck-1.7b OUTDIR 256 talker,codes,decode

A graph's memory sets and copies are listed among its kernels: a gap between two kernels may be one.
"""
import json
import re
import statistics
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from bench.engine import batch_runner, graph_ms


def main():
    ck, out = sys.argv[1], sys.argv[2]
    B = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    parts = sys.argv[4].split(",") if len(sys.argv) > 4 else ["decode"]
    r = batch_runner(ck, B)
    with torch.inference_mode():
        for part in parts:
            kernels(r.graphs[(part, B)], part, B, out)


def kernels(g: torch.cuda.CUDAGraph, part: str, B: int, out: str) -> None:
    graph_ms(g, 20)                                             # warm
    print(f"\n{part} graph B={B}: {graph_ms(g, 200) * 1000:.0f} us a replay", flush=True)
    N = 10
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(N):
            g.replay()
        torch.cuda.synchronize()
    trace = f"{out}/{part}_trace.json"
    prof.export_chrome_trace(trace)
    ev = [e for e in json.load(open(trace))["traceEvents"] if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    ev.sort(key=lambda e: e["ts"])
    per = len(ev) // N
    print(f"kernels a replay: {per} (of {len(ev)})")
    rows = []
    for i in range(per):
        ds = [ev[j * per + i]["dur"] for j in range(N)]
        e = ev[i]
        gaps = [ev[j * per + i]["ts"] - (ev[j * per + i - 1]["ts"] + ev[j * per + i - 1]["dur"]) for j in range(N) if j * per + i > 0]
        launch = e.get("args", {})                             # a memory set or copy has no grid
        rows.append((i, e["name"][:90], launch.get("grid", "-"), launch.get("block", "-"), statistics.median(ds),
                     statistics.median(gaps) if gaps else 0))
    tot = sum(x[4] for x in rows)
    gap = sum(x[5] for x in rows[1:])
    print(f"kernel time sum {tot:.1f} us, gaps sum {gap:.1f} us")
    for x in rows:
        print(f"{x[0]:4d} {x[4]:7.2f} gap {x[5]:5.2f} grid {x[2]} block {x[3]} {x[1]}")
    by = defaultdict(lambda: [0.0, 0])
    for x in rows:
        n = x[1]
        key = ("gemm/gemv" if any(s in n for s in ("gemm", "gemv", "sgemm", "cutlass", "Kernel2")) else
               re.sub(r"_\d+$", "", n)[:60] if n.startswith("triton") else "cudnn-conv" if ("conv" in n.lower() or "cudnn" in n) else n[:40])
        by[key][0] += x[4]
        by[key][1] += 1
    for k, (v, n) in sorted(by.items(), key=lambda kv: -kv[1][0]):
        print(f"  {v:8.1f} us  {n:5d} kernels  {k}")


if __name__ == "__main__":
    main()
