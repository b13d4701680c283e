"""The draw kernels of two trees side by side (issue 44): `sample` (codebooks 1-15, V 2,048) and `codebook0` (V 3,072)
at B rows, each tree's synth/sample_kernel.py loaded from its path, timed in CUDA graphs (bench/persistent.py
graph_ms: 20 calls back to back a replay, the median of 7 rounds), with the engine's sampling settings (top-k 50,
top-p 1.0 and 0.95, temperature 0.9); the ids each draws are compared.

    python3 -m bench.draws_ab OLD/talkgate/synth/sample_kernel.py NEW/talkgate/synth/sample_kernel.py [--rows 1,8,256]
"""
from __future__ import annotations

import argparse

import torch

from bench.persistent import graph_ms, load_variant


def inputs(B: int, V: int, top_p: float, device: str):
    g = torch.Generator().manual_seed(B * 7 + V)
    logits = (torch.randn(B, V, generator=g) * 3).to(device, torch.bfloat16)

    def full(value, dtype=torch.float32):
        return torch.full((B,), value, dtype=dtype, device=device)
    return dict(logits=logits, temperature=full(0.9), top_k=full(50, torch.long), top_p=full(top_p),
                greedy=full(False, torch.bool), seed=torch.randint(0, 1 << 56, (B,), generator=g).to(device),
                counter=torch.randint(0, 1 << 33, (B,), generator=g).to(device))


def calls(module, x: dict, B: int, V: int, device: str):
    slots = torch.arange(B, device=device)
    seen = torch.zeros(B, V, dtype=torch.bool, device=device)
    suppressed = torch.zeros(V, dtype=torch.bool, device=device)
    allow = torch.ones(B, dtype=torch.bool, device=device)
    penalty = torch.full((B,), 1.05, device=device)

    def draw():
        return module.sample(x["logits"], x["temperature"], x["top_k"], x["top_p"], x["greedy"], x["seed"],
                             x["counter"], 3, slots)

    def first():
        return module.codebook0(x["logits"], slots, seen, suppressed, V - 2, allow, penalty, x["temperature"],
                                x["top_k"], x["top_p"], x["greedy"], x["seed"], x["counter"])
    return draw, first


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--rows", default="1,8,256")
    a = p.parse_args()
    device = "cuda"
    trees = {"old": load_variant(a.old), "new": load_variant(a.new)}
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    for B in (int(r) for r in a.rows.split(",")):
        for kind, V in (("draw", 2048), ("codebook0", 3072)):
            for top_p in (1.0, 0.95):
                x = inputs(B, V, top_p, device)
                fns = {tree: calls(module, x, B, V, device)[kind == "codebook0"] for tree, module in trees.items()}
                ids = {tree: fn().cpu() for tree, fn in fns.items()}
                us = {}
                for again in ("", "-again"):                 # old, new, old, new: a drift shows in both pairs
                    for tree, fn in fns.items():
                        us[tree + again] = 1e3 * graph_ms(fn, reps=20, rounds=7, calls=20)
                same = bool((ids["old"] == ids["new"]).all())
                print(f"{kind} B={B} V={V} top_p={top_p}: old {us['old']:.2f} / {us['old-again']:.2f} us, "
                      f"new {us['new']:.2f} / {us['new-again']:.2f} us; same ids {same}", flush=True)


if __name__ == "__main__":
    main()
