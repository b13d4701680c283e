"""How near the HBM roof do the per-layer path's projections run at 1-256 rows? (issue 44)

    python -m bench.skinny_linear [--rows 1,4,16,64,128,256]

From 3 rows on a step's Talker and code predictor are per-layer kernels, their projections cuBLAS multiplies of
few rows by a weight that is read once (weights dominate the bytes below ~200 rows). Each shape of the 1.7B Talker
and of the code predictor (fused q/k/v and gate/up, as the loader fuses them), bf16, timed as a CUDA graph of 8
multiplies over 8 different weight copies (more than the L2 holds, so each reads its weight from HBM): us a multiply
and the achieved GB/s against the H200's 4.8 TB/s.
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

SHAPES = {   # name: (in, out)
    "talker qkv": (2048, 4096), "talker o": (2048, 2048), "talker gate/up": (2048, 12288), "talker down": (6144, 2048),
    "predictor qkv": (1024, 4096), "predictor o": (2048, 1024), "predictor gate/up": (1024, 6144),
    "predictor down": (3072, 1024), "predictor head": (1024, 2048),
}
COPIES = 8


@triton.jit
def skinny_kernel(x, w, y, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):
    """y[M, N] = x[M, K] @ w[N, K].T for few rows: a program per BN output columns (and BM rows), its weight
    slice streamed through STAGES tiles in flight."""
    pm, pn = tl.program_id(0), tl.program_id(1)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        a = tl.load(x + rm[:, None] * K + (k0 + rk)[None, :], mask=rm[:, None] < M, other=0.0)
        b = tl.load(w + rn[:, None] * K + (k0 + rk)[None, :], mask=rn[:, None] < N, other=0.0)
        acc = tl.dot(a, tl.trans(b), acc)
    tl.store(y + rm[:, None] * N + rn[None, :], acc.to(y.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def skinny(x, w, out, BN, BK, STAGES, warps):
    M, K = x.shape
    N = w.shape[0]
    BM = max(16, min(64, triton.next_power_of_2(M)))
    skinny_kernel[(triton.cdiv(M, BM), triton.cdiv(N, BN))](x, w, out, M, N, K, BM, BN, BK, STAGES, num_warps=warps)
    return out


CONFIGS = [(16, 256, 4, 4), (16, 512, 3, 4), (32, 256, 4, 4), (32, 128, 4, 4), (64, 128, 4, 4), (16, 128, 6, 4),
           (32, 512, 3, 8)]


def time_us(fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        fn()
    g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / reps / COPIES


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1,4,16,64,128,256")
    a = p.parse_args(argv)
    rows = [int(r) for r in a.rows.split(",")]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; us a multiply (GB/s of its weight and "
          f"activations)")
    print("| shape (in -> out) | MB | " + " | ".join(f"{m} rows" for m in rows) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in rows) + " |")
    for name, (k, n) in SHAPES.items():
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(COPIES)]
        cells, best = [], []
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(COPIES)]

            def fn():
                for w, o in zip(ws, outs):
                    torch.mm(x, w.t(), out=o)
            us = time_us(fn)
            gb = (n * k + m * k + m * n) * 2 / 1e9
            cells.append(f"{us:.1f} ({gb / us * 1e6:,.0f})")
            ref = x.float() @ ws[0].float().t()
            found = []
            for cfg in CONFIGS:
                def tfn(cfg=cfg):
                    for w, o in zip(ws, outs):
                        skinny(x, w, o, *cfg)
                try:
                    t = time_us(tfn)
                except Exception as e:                       # a config that does not fit (shared memory)
                    print(f"  {name} {m} rows {cfg}: {type(e).__name__}", flush=True)
                    continue
                err = (outs[0].float() - ref).abs().max().item()
                found.append((t, cfg, err))
            t, cfg, err = min(found)
            best.append(f"{t:.1f} ({gb / t * 1e6:,.0f}) {cfg} err {err:.1e}")
        print(f"| {name} ({k} -> {n}) | {n * k * 2 / 1e6:.1f} | " + " | ".join(cells) + " |", flush=True)
        print(f"| triton skinny | | " + " | ".join(best) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
