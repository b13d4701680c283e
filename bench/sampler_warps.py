"""The sample kernels' launch size at 1-512 rows (issue 44): at 256 rows the 1.7B codes graph's 15 draws took 11.7 us
each and codebook 0's draw 43 us (bench/decoder_kernels.py, an H100, 2026-12-07): one program a row, latency-bound.
The kernels launch with 8 warps, chosen at 2026-11-22 for an earlier form of the search (docs/experiments/README.md,
"Triton kernels' launch sizes"). Each kernel here at each warp count, with the engine's sampling (top-k 50, top-p 1,
temperature 0.9, seeded) on bf16 logits of the model's widths (the code predictor's 2,048, the Talker's 3,072), the
ids of every warp count checked equal to the engine's launch.

    python3 -m bench.sampler_warps [--rows 1,8,64,256,512] [--warps 2,4,8,16]

Each figure: us a call, REPS calls back to back in a CUDA graph, the median of 7 replays (bench/persistent.py graph_ms).
"""
from __future__ import annotations

import argparse

import torch

from bench.persistent import graph_ms
from talkgate.synth import sample_kernel as sk

REPS = 20


def timed(fn) -> float:
    return 1e3 * graph_ms(fn, reps=1, rounds=7, calls=REPS)


def rows(B: int, V: int, device):
    g = torch.Generator().manual_seed(B)
    logits = (torch.randn(B, V, generator=g) * 2).to(device, torch.bfloat16)
    full = lambda value, dtype: torch.full((B,), value, dtype=dtype, device=device)   # noqa: E731
    seed = torch.randint(0, 1 << 56, (B,), generator=g).to(device)
    return logits, full(0.9, torch.float32), full(50, torch.int64), full(1.0, torch.float32), \
        full(0, torch.uint8), seed, full(7, torch.int64)


def draws(B: int, warps: int, device):
    """The code predictor's draw (sample_kernel, V 2,048) and codebook 0's (codebook0_kernel, V 3,072), each a
    function of no arguments writing its ids into a tensor it returns."""
    logits, temp, top_k, top_p, greedy, seed, counter = rows(B, 2048, device)
    out = torch.empty(B, dtype=torch.int64, device=device)

    def sample():
        sk.sample_kernel[(B,)](logits, logits.stride(0), temp, top_k, top_p, greedy, seed, counter, out, 2048,
                               0x2545F491, BLOCK=sk.block(2048), num_warps=warps)
        return out
    logits0 = rows(B, 3072, device)[0]
    slots = torch.arange(B, device=device)
    seen = torch.zeros(B, 3072, dtype=torch.uint8, device=device)
    seen[:, ::7] = 1
    suppressed = torch.zeros(3072, dtype=torch.uint8, device=device)
    suppressed[2048:] = 1
    suppressed[2150] = 0                                            # eos
    allow = torch.ones(B, dtype=torch.uint8, device=device)
    penalty = torch.full((B,), 1.05, device=device)
    out0 = torch.empty(B, dtype=torch.int64, device=device)

    def codebook0():
        # each call marks its drawn id in seen, as the engine's does (the penalty then grows: a timing, not a draw)
        sk.codebook0_kernel[(B,)](logits0, logits0.stride(0), slots, seen, seen.stride(0), suppressed, allow, 2150,
                                  penalty, temp, top_k, top_p, greedy, seed, counter, out0, 3072,
                                  BLOCK=sk.block(3072), num_warps=warps)
        return out0
    return {"sample": sample, "codebook0": codebook0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,8,64,256,512")
    ap.add_argument("--warps", default="2,4,8,16")
    a = ap.parse_args()
    device = torch.device("cuda")
    warps = [int(w) for w in a.warps.split(",")]
    print(f"# {torch.cuda.get_device_name()}, us a call; ids equal to 8 warps' in brackets where they differ")
    print("| kernel | rows | " + " | ".join(f"{w} warps" for w in warps) + " |")
    print("| --- | --- |" + " --- |" * len(warps))
    for B in (int(b) for b in a.rows.split(",")):
        want = {name: fn().clone() for name, fn in draws(B, 8, device).items()}
        cells = {name: [] for name in want}
        for w in warps:
            for name, fn in draws(B, w, device).items():
                same = torch.equal(fn(), want[name])
                cells[name].append(f"{timed(fn):.2f}" + ("" if same else " [ids differ]"))
        for name, row in cells.items():
            print(f"| {name} | {B} | " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
