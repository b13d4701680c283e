"""The sample kernels of an earlier tree against this one's, at 1-256 rows (issue 44): one program a row, a chain
of dependent reductions across its warps, each a few barriers. Each kernel of each tree with the engine's sampling
(top-k 50, top-p 1, temperature 0.9, seeded) on bf16 logits of the model's widths (the code predictor's 2,048,
codebook 0's 3,072), the ids of every tree checked equal to the first's, in the order before, after (and any
variants), then all again.

    python3 -m bench.sampler_ab .e2e/before/talkgate/synth/sample_kernel.py [--rows 1,8,64,256] [--variants F,...]

Each figure: us a call, REPS calls back to back in a CUDA graph, the median of 7 replays (bench/persistent.py graph_ms).
"""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import torch

from bench.persistent import graph_ms
from talkgate.synth import sample_kernel

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


def draws(sk, B: int, device):
    """The code predictor's draw (sample, V 2,048) and codebook 0's (codebook0, V 3,072) of module sk, each a
    function of no arguments returning its ids."""
    logits, temp, top_k, top_p, greedy, seed, counter = rows(B, 2048, device)
    slots = torch.arange(B, device=device)

    def sample():
        return sk.sample(logits, temp, top_k, top_p, greedy, seed, counter, 3, slots)
    logits0 = rows(B, 3072, device)[0]
    seen = torch.zeros(B, 3072, dtype=torch.bool, device=device)
    seen[:, ::7] = True
    suppressed = torch.zeros(3072, dtype=torch.bool, device=device)
    suppressed[2048:] = True
    suppressed[2150] = False                                        # eos
    allow = torch.ones(B, dtype=torch.bool, device=device)
    penalty = torch.full((B,), 1.05, device=device)

    def codebook0():
        # marks its drawn ids in a copy of seen (the same penalties every call: a timing, and ids to compare)
        return sk.codebook0(logits0, slots, seen.clone(), suppressed, 2150, allow, penalty, temp, top_k, top_p,
                            greedy.bool(), seed, counter)
    return {"sample": sample, "codebook0": codebook0}


def module(path: str):
    spec = importlib.util.spec_from_file_location(f"sample_kernel_{Path(path).stem}", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("before", help="the earlier tree's talkgate/synth/sample_kernel.py")
    ap.add_argument("--rows", default="1,8,64,256")
    ap.add_argument("--variants", default="", help="more copies of the module (comma-separated files), each named "
                    "by its file's stem, timed after this tree's")
    a = ap.parse_args()
    before = module(a.before)
    trees = [("before", before), ("after", sample_kernel)] + \
        [(Path(f).stem, module(f)) for f in a.variants.split(",") if f]
    order = trees + trees
    device = torch.device("cuda")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, us a call (each includes its own seen copy "
          "for codebook0); [ids differ] where a tree's differ from before's")
    print("| kernel | rows | " + " | ".join(name for name, _ in order) + " |")
    print("| --- | --- |" + " --- |" * len(order))
    for B in (int(b) for b in a.rows.split(",")):
        want = {name: fn().clone() for name, fn in draws(before, B, device).items()}
        cells = {name: [] for name in want}
        for _, sk in order:
            for name, fn in draws(sk, B, device).items():
                same = torch.equal(fn(), want[name])
                cells[name].append(f"{timed(fn):.2f}" + ("" if same else " [ids differ]"))
        for name, row in cells.items():
            print(f"| {name} | {B} | " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
