"""The step's three attentions at many rows, by launch configuration (issue 44): where a kernel at 256 rows took
several times what its bytes need (bench/decoder_kernels.py, 1.7B, 2026-12-04): the codec decoder's window
attention (146 us a layer), the Talker's one-token attention (20 us a layer) and the code predictor's two-position
first pass through SDPA (cuDNN's flash kernel, 96 us a layer).

    python3 -m bench.attention_configs [--rows 64,256,512] [--parts window,talker,predictor,first]

Each figure: a CUDA graph of REPS back-to-back calls, replayed (bench/persistent.py graph_ms); us a call = the
median of 7 replays / REPS. A configuration (keys a block, warps[, maxnreg]): maxnreg caps the registers a thread
(Triton's option), which bound how many one-warp programs an SM holds at once.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.persistent import graph_ms
from talkgate.synth.attention import one_token_attention_kernel
from talkgate.synth.window_attention import window_attention_kernel

REPS = 20


def timed(fn) -> float:
    """us a call: REPS calls back to back in one graph, the median of 7 replays."""
    return 1e3 * graph_ms(fn, reps=1, rounds=7, calls=REPS)


def window(B: int, configs=((128, 8), (128, 1), (8, 1), (16, 1), (32, 1), (16, 2), (32, 2), (32, 4), (64, 2),
                            (64, 4)),
           pos: int = 100) -> None:
    """The codec decoder's window attention (1.7B and 0.6B alike: 16 heads of 64, a 72-frame ring, float16)."""
    H, D, W = 16, 64, 72
    dt = torch.float16
    qkv = torch.randn(B, 3 * H * D, device="cuda", dtype=dt)
    posv = torch.full((B,), pos, device="cuda", dtype=torch.long)
    slots = torch.arange(B, device="cuda")
    cache = torch.randn(B, W, 2, H, D, device="cuda", dtype=dt)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device="cuda").float() / D))
    out = torch.empty(B, H * D, device="cuda", dtype=dt)
    ref = None
    for block, warps, *cap in configs:
        def run():
            return window_attention_kernel[(B, H)](qkv, qkv.stride(0), posv, slots, inv, cache, cache.stride(0),
                                                   cache.stride(1), cache.stride(2), cache.stride(3), out,
                                                   out.stride(0), D ** -0.5, HQ=H, HKV=H, GROUP=1, D=D, WINDOW=W,
                                                   BLOCK=block, num_warps=warps, maxnreg=cap[0] if cap else None)
        t = timed(run)
        k = run()
        ref = out.float().clone() if ref is None else ref
        mb = B * W * 2 * H * D * 2 / 1e6
        capped = f" maxnreg={cap[0]}" if cap else ""
        print(f"window attention B={B} block={block} warps={warps}{capped}: {t:.1f} us ({mb / t:.2f} TB/s of the "
              f"ring; max diff {(out.float() - ref).abs().max().item():.2g}; {k.n_regs} registers a thread, "
              f"{k.n_spills} spilled)")


def one_token(B: int, pos: int, paged: bool, configs, HQ=16, HKV=8, D=128) -> None:
    dt = torch.bfloat16
    qkv = torch.randn(B, (HQ + 2 * HKV) * D, device="cuda", dtype=dt)
    qw = torch.ones(D, device="cuda", dtype=dt)
    cos = torch.randn(B, D, device="cuda")
    sin = torch.randn(B, D, device="cuda")
    slots = torch.arange(B, device="cuda")
    posv = torch.full((B,), pos, device="cuda", dtype=torch.long)
    if paged:
        page = 64
        per = -(-(pos + 1) // page)
        kc = torch.randn(1 + B * per, HKV, page, D, device="cuda", dtype=dt)
        vc = torch.randn_like(kc)
        table = (1 + torch.arange(B * per, device="cuda")).view(B, per)
    else:
        page = 0
        kc = torch.randn(B, HKV, 16, D, device="cuda", dtype=dt)
        vc = torch.randn_like(kc)
        table = qkv
    out = torch.empty(B, HQ * D, device="cuda", dtype=dt)
    for block, warps, *cap in configs:
        def run():
            return one_token_attention_kernel[(B, HKV)](
                qkv, qkv.stride(0), qw, qw, cos, sin, cos.stride(0), kc, vc, kc.stride(0), kc.stride(1),
                kc.stride(2), slots, posv, out, out.stride(0), 0, table, table.stride(0) if paged else 0, 1e-6,
                D ** -0.5, qkv, 0, 0, 0.0, HQ=HQ, HKV=HKV, GROUP=HQ // HKV, D=D, BLOCK=block, ROW_SLOTS=True,
                ROW_POS=True, PAGE=page, ONE_QUERY=not paged, HB=0, num_warps=warps,     # the wrapper's choice
                maxnreg=cap[0] if cap else None)
        t = timed(run)
        k = run()                 # the compiled kernel: its registers bound how many programs an SM holds at once
        mb = B * (pos + 1) * HKV * D * 2 * 2 / 1e6
        capped = f" maxnreg={cap[0]}" if cap else ""
        print(f"one-token attention {'Talker' if paged else 'predictor'} B={B} pos={pos} block={block} "
              f"warps={warps}{capped}: {t:.1f} us ({mb / t:.2f} TB/s of the cache; {k.n_regs} registers a thread, "
              f"{k.n_spills} spilled)")


def small_attend(q, k, v):
    """q [B,T,H,D], k/v [B,Hkv,T,D], causal -> [B,T,H*D], in float32 (the explicit math of a short pass)."""
    B, T, H, D = q.shape
    Hkv = k.shape[1]
    qg = q.reshape(B, T, Hkv, H // Hkv, D).float()
    s = torch.einsum("btkgd,bksd->bkgts", qg, k.float()) * D ** -0.5
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    p = s.masked_fill(~mask, float("-inf")).softmax(-1)
    o = torch.einsum("bkgts,bksd->btkgd", p, v.float())
    return o.reshape(B, T, H * D).to(q.dtype)


def first_pass(B: int) -> None:
    H, Hkv, D, T = 16, 8, 128, 2
    q = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, T, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    ref = None
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH), ("default", None)):
        def run():
            if backend is None:
                return F.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=True, enable_gqa=True)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=True, enable_gqa=True)
        try:
            t = timed(run)
            o = run().float()
            ref = o if ref is None else ref
            print(f"predictor first pass SDPA {name} B={B}: {t:.1f} us (max diff {(o - ref).abs().max().item():.3g})")
        except Exception as e:          # a backend that does not take these shapes
            print(f"predictor first pass SDPA {name} B={B}: not run ({type(e).__name__}: {str(e)[:80]})")
    compiled = torch.compile(small_attend, dynamic=False)
    t = timed(lambda: compiled(q, k, v))
    o = compiled(q, k, v).float().view(B, T, H, D).transpose(1, 2)
    print(f"predictor first pass explicit (compiled) B={B}: {t:.1f} us (max diff {(o - ref).abs().max().item():.3g})")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="64,256,512")
    p.add_argument("--parts", default="window,talker,predictor,first")
    args = p.parse_args()
    parts = args.parts.split(",")
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    for B in (int(r) for r in args.rows.split(",")):
        if "window" in parts:
            window(B)
        if "talker" in parts:
            for pos in (40, 109):
                one_token(B, pos, True, ((8, 1), (16, 1), (16, 1, 128), (32, 1), (16, 2), (32, 2), (32, 4), (64, 4),
                                         (64, 8)))
        if "predictor" in parts:
            one_token(B, 15, False, ((8, 1), (16, 1), (16, 1, 128), (16, 2), (16, 4)))
        if "first" in parts:
            first_pass(B)


if __name__ == "__main__":
    main()
