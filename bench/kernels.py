"""Micro-benchmarks of the engine's small kernels at batch 1-4, timed inside CUDA graphs (as the engine
replays them): the sampler and one-token attention kernels per num_warps, and a Triton GEMV against
cuBLAS (F.linear) at the 0.6B/1.7B projection shapes.

    python -m bench.kernels [--json out.json]
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph


@triton.jit
def gemv_kernel(X, W, Y, M, N, K, sxm, swn, sym, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    m = tl.arange(0, BM)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        w = tl.load(W + n[:, None] * swn + k[None, :], mask=(n[:, None] < N) & (k[None, :] < K), other=0.0)
        x = tl.load(X + m[:, None] * sxm + k[None, :], mask=(m[:, None] < M) & (k[None, :] < K), other=0.0)
        acc += tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    tl.store(Y + m[:, None] * sym + n[None, :], acc.to(Y.dtype.element_ty), mask=(m[:, None] < M) & (n[None, :] < N))


def gemv(x, w, BN, BK, warps):
    M, K = x.shape
    N = w.shape[0]
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    gemv_kernel[(triton.cdiv(N, BN),)](x, w, y, M, N, K, x.stride(0), w.stride(0), y.stride(0),
                                       BM=max(2, triton.next_power_of_2(M)), BN=BN, BK=BK, num_warps=warps)
    return y


def t(fn) -> float:
    return round(do_bench_cudagraph(fn, rep=50) * 1000, 2)        # us


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json")
    a = p.parse_args(argv)
    from talkgate.synth import attention, sample_kernel
    dev, bf16 = "cuda", torch.bfloat16
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    # sampler: B rows, V = 2048 (code predictor) and 3072 (codebook 0), top-k 50
    rows = []
    for B in (1, 8, 256):
        for V in (2048, 3072):
            logits = torch.randn(B, V, device=dev)
            args = (torch.full((B,), 0.9, device=dev), torch.full((B,), 50, device=dev), torch.ones(B, device=dev),
                    torch.zeros(B, dtype=torch.bool, device=dev), torch.arange(B, device=dev), torch.arange(B, device=dev))
            for warps in (1, 2, 4, 8):
                block = 1 << (V - 1).bit_length()

                def run():
                    out = torch.empty(B, dtype=torch.int64, device=dev)
                    sample_kernel.sample_kernel[(B,)](logits, V, *args[:3], args[3].view(torch.uint8), *args[4:], out, V,
                                                      12345, BLOCK=block, num_warps=warps)
                rows.append({"B": B, "V": V, "warps": warps, "us": t(run)})
                print("sample", rows[-1], flush=True)
    res["sample"] = rows
    # one-token attention, 0.6B shapes: code predictor (16 positions) and Talker (slot cache, ~200 positions)
    rows = []
    w = torch.ones(128, device=dev, dtype=bf16)
    for B in (1, 8, 256):
        qkv = torch.randn(B, 32 * 128, device=dev, dtype=bf16)
        cos, sin = torch.rand(B, 128, device=dev), torch.rand(B, 128, device=dev)
        cp_k = torch.randn(B, 8, 16, 128, device=dev, dtype=bf16)
        cp_v = torch.randn_like(cp_k)
        tk = torch.randn(257, 8, 878, 128, device=dev, dtype=bf16)
        tv = torch.randn_like(tk)
        slots = torch.arange(B, device=dev)
        pos = torch.full((B,), 200, device=dev)
        for warps in (1, 2, 4):
            for block in (16, 32, 64):
                def cp():
                    out = torch.empty(B, 16 * 128, device=dev, dtype=bf16)
                    attention.one_token_attention_kernel[(B, 8)](
                        qkv, qkv.stride(0), w, w, cos[0], sin[0], 0, cp_k, cp_v, *cp_k.stride()[:3], qkv, qkv, out,
                        out.stride(0), 8, 1e-6, 128 ** -0.5, HQ=16, HKV=8, GROUP=2, D=128, BLOCK=block,
                        ROW_SLOTS=False, ROW_POS=False, num_warps=warps)

                def talker():
                    out = torch.empty(B, 16 * 128, device=dev, dtype=bf16)
                    attention.one_token_attention_kernel[(B, 8)](
                        qkv, qkv.stride(0), w, w, cos, sin, cos.stride(0), tk, tv, *tk.stride()[:3], slots, pos, out,
                        out.stride(0), 0, 1e-6, 128 ** -0.5, HQ=16, HKV=8, GROUP=2, D=128, BLOCK=block,
                        ROW_SLOTS=True, ROW_POS=True, num_warps=warps)
                rows.append({"B": B, "warps": warps, "block": block, "cp_us": t(cp), "talker_us": t(talker)})
                print("attention", rows[-1], flush=True)
    res["attention"] = rows
    # GEMV vs cuBLAS at the projection shapes (N, K): 0.6B Talker/CP and 1.7B Talker
    rows = []
    shapes = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (2048, 1024), (3072, 1024),
              (4096, 2048), (2048, 2048), (12288, 2048), (2048, 6144)]
    for N, K in shapes:
        wt = torch.randn(N, K, device=dev, dtype=bf16) * 0.02
        for M in (1, 2, 4):
            x = torch.randn(M, K, device=dev, dtype=bf16)
            ref = F.linear(x, wt).float()
            row = {"N": N, "K": K, "M": M, "cublas_us": t(lambda: F.linear(x, wt))}
            best = None
            for BN, BK, warps in ((8, 256, 4), (16, 256, 4), (16, 128, 4), (32, 128, 4), (8, 512, 4), (16, 512, 8),
                                  (32, 256, 8), (4, 512, 2), (8, 128, 2)):
                err = (gemv(x, wt, BN, BK, warps).float() - ref).abs().max().item()
                us = t(lambda: gemv(x, wt, BN, BK, warps))
                if err < 2e-2 * ref.abs().max().item() and (best is None or us < best[0]):
                    best = (us, BN, BK, warps)
            row.update(gemv_us=best[0], BN=best[1], BK=best[2], warps=best[3],
                       GBps=round(N * K * 2 / best[0] / 1e3, 1))
            rows.append(row)
            print("gemv", row, flush=True)
    res["gemv"] = rows
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
