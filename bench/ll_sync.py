"""A chain of all-to-all phases across every SM, as the persistent kernels' phases are (synth/persistent.py):
each phase, every program reads all N values the last phase wrote, and writes its share of the next N.
Two ways to hand the values on, timed with CUDA events around one launch of --phases phases (median of 7):

    barrier  the values as they are; then a grid barrier (release add on a counter, warp 0 polls with
             acquire loads, one CTA barrier: synth.persistent._arrive / _wait); the next phase's loads
             go to L2 (".cg") after it
    flag     each value written as one 64-bit word, its float32 bits and the phase's number (NCCL's LL
             protocol): the next phase's loads spin on each word until its number is the phase's, so the
             data is the barrier (no fence, no counter, no second trip to L2); two buffers by phase parity

Each is also run with 32 KB of weights a program a phase, a new 32 KB from HBM every phase, loaded before the
wait (as the persistent kernels load their next phase's first tiles), to see the spin loads beside the
weight stream. H100 (docs/benchmarks.md): flags save 0.3-0.4 us a phase at N 1024 and lose 0.1-0.25 us at
N 4096, so the kernels keep the barrier.

    python3 bench/ll_sync.py [--phases 2000] [--n 1024]
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from talkgate.synth.persistent import _arrive, _wait


# four 64-bit words a thread: all four loads in flight, then the checks; again from the top if one is stale
SPIN_ASM = tl.constexpr("{ .reg .pred p; .reg .u32 f<4>; .reg .u64 v<4>; SPIN: "
            + "".join(f"ld.relaxed.gpu.global.u64 v{i}, [${4 + i}]; " for i in range(4))
            + "".join(f"mov.b64 {{${i}, f{i}}}, v{i}; " for i in range(4))
            + "".join(f"setp.ne.u32 p, f{i}, ${8 + i}; @p bra SPIN; " for i in range(4)) + "}")


@triton.jit
def _spin_load(P, epoch):
    """The float32 of each 64-bit word at P once its high half equals epoch (relaxed gpu-scope loads)."""
    bits = tl.inline_asm_elementwise(SPIN_ASM, "=r,=r,=r,=r,l,l,l,l,r,r,r,r", [P, epoch], dtype=tl.int32,
                                     is_pure=False, pack=4)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _flag_word(x, epoch):
    return (epoch.to(tl.int64) << 32) | (x.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF)


@triton.jit
def _weights(W, pid, ph, WB: tl.constexpr, NPROG: tl.constexpr):
    # a different 32 KB a phase, over 64 phases (270 MB: from HBM, as the kernels' weights)
    if WB > 0:
        k = tl.arange(0, WB // 2)
        return tl.load(W + ((ph % 64) * NPROG + pid) * (WB // 2) + k, eviction_policy="evict_first").to(tl.float32)
    else:
        return tl.zeros([16], tl.float32)


@triton.jit
def _phase_value(x, w):
    """What every program makes of the phase's N inputs (and its weights): the same in both chains, so that
    main() can check that they agree."""
    return tl.sum(x, axis=0) * 1e-3 + tl.sum(w, axis=0) * 1e-9


@triton.jit
def barrier_chain(BUF, SYNC, W, OUT, phases, N: tl.constexpr, BN: tl.constexpr, WB: tl.constexpr,
                  NPROG: tl.constexpr):
    pid = tl.program_id(0)
    k = tl.arange(0, N)
    cols = pid * BN + tl.arange(0, BN)
    target = pid * 0
    acc = tl.zeros([BN], tl.float32)
    _arrive(SYNC, NPROG)
    for ph in range(phases):
        w = _weights(W, pid, ph, WB, NPROG)
        target += NPROG
        _wait(SYNC, target, NPROG)
        x = tl.load(BUF + (ph % 2) * N + k, cache_modifier=".cg")
        s = _phase_value(x, w)
        tl.store(BUF + ((ph + 1) % 2) * N + cols, s + cols.to(tl.float32), mask=cols < N)
        acc += s
        _arrive(SYNC, NPROG)
    tl.store(OUT + pid * BN + tl.arange(0, BN), acc)


@triton.jit
def flag_chain(BUF, W, OUT, phases, epoch0, N: tl.constexpr, BN: tl.constexpr, WB: tl.constexpr,
               NPROG: tl.constexpr):
    pid = tl.program_id(0)
    k = tl.arange(0, N)
    cols = pid * BN + tl.arange(0, BN)
    acc = tl.zeros([BN], tl.float32)
    for ph in range(phases):
        w = _weights(W, pid, ph, WB, NPROG)
        x = _spin_load(BUF + (ph % 2) * N + k, k * 0 + epoch0 + ph)
        s = _phase_value(x, w)
        tl.store(BUF + ((ph + 1) % 2) * N + cols, _flag_word(s + cols.to(tl.float32), cols * 0 + epoch0 + ph + 1),
                 mask=cols < N)
        acc += s
    tl.store(OUT + pid * BN + tl.arange(0, BN), acc)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--phases", type=int, default=2000)
    p.add_argument("--n", type=int, default=1024)
    a = p.parse_args()
    nprog = torch.cuda.get_device_properties(0).multi_processor_count
    N, phases = a.n, a.phases
    BN = triton.next_power_of_2(triton.cdiv(N, nprog))
    w = torch.randn(64 * nprog * 16384, device="cuda", dtype=torch.bfloat16)
    rows = []
    for wb in (0, 32768):
        buf = torch.zeros(2 * N, device="cuda", dtype=torch.float32)
        sync = torch.zeros(1, device="cuda", dtype=torch.int32)
        out_b = torch.zeros(nprog * BN, device="cuda")
        fbuf = torch.zeros(2 * N, device="cuda", dtype=torch.int64)
        out_f = torch.zeros(nprog * BN, device="cuda")
        epoch = [1]

        def run_barrier():
            sync.zero_()
            buf[:N] = torch.arange(N, device="cuda", dtype=torch.float32)
            barrier_chain[(nprog,)](buf, sync, w, out_b, phases, N=N, BN=BN, WB=wb, NPROG=nprog, num_warps=8)

        def run_flag():
            e = epoch[0]
            vals = torch.arange(N, device="cuda", dtype=torch.float32)
            fbuf[:N] = (torch.full((N,), e, device="cuda", dtype=torch.int64) << 32) | (
                vals.view(torch.int32).to(torch.int64) & 0xFFFFFFFF)
            flag_chain[(nprog,)](fbuf, w, out_f, phases, e, N=N, BN=BN, WB=wb, NPROG=nprog, num_warps=8)
            epoch[0] = e + phases + 2

        for name, fn in (("barrier", run_barrier), ("flag", run_flag)) * 2:
            fn()
            torch.cuda.synchronize()
            ts = []
            for _ in range(7):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                torch.cuda.synchronize()
                ts.append(s.elapsed_time(e))
            ts.sort()
            rows.append((name, wb, ts[3] * 1000 / phases))
        assert torch.allclose(out_b, out_f, rtol=1e-4), (out_b[:8], out_f[:8])
        print(f"outputs agree (W={wb}): {out_b[:3].tolist()}")
    print(f"{'sync':8} {'weights/program':>16} {'us/phase':>9}   (N={N}, {nprog} programs, {phases} phases)")
    for name, wb, us in rows:
        print(f"{name:8} {wb:16d} {us:9.3f}")


if __name__ == "__main__":
    main()
