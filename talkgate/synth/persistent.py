"""Persistent Triton kernels for small batches on CUDA: the Talker's frame step and the code predictor's
whole frame, each one launch instead of hundreds of small kernels.

At batch 1 a frame step was bound by kernel count, not by work (bench/engine.py profile): the code predictor
alone ran 16 one-token passes through its 5 layers and 15 head + draw steps in strict sequence, about 600
kernels of 2-6 us, while a pass's weights (157 MB at 0.6B) stream in about 50 us at 3 TB/s. Here every
program is resident at once (one per SM) and walks through the same phases; each phase splits its output
columns over the programs and ends at a grid barrier (an atomic counter). One decoder layer (_layer):
    A  q/k/v of the normed residual          B  attention per (row, kv head) with q/k norm, RoPE and the
    C  o_proj + residual                        cache write (synth/attention.py's attend_range)
    D  gate/up of the normed residual, SiLU(gate) * up          E  down_proj + residual
talker_kernel: the layers at each row's (slot, position), then the final norm; its attention runs in
parts of 64 cached positions, combined after one more barrier (_attend_split).
predictor_kernel: passes t = 0..15 (position t of the frame: the Talker's hidden state, the codebook-0
embedding, then the embeddings of codebooks 1..14) through the layers into a scratch cache (at one row with
phase B folded into C: _attend_project), and for t >= 1
    F  head t of the final norm -> logits    G  draw codebook t per row (synth/sample_kernel.py's
    P  small_to_mtp_projection (1.7B)           sample_row): its embedding joins the sum, feeds pass t + 1

A phase streams its share of the weights as [BN, BK] tiles with PREFETCH weights in flight (_stream): a
program arrives at a barrier, loads the next phase's first tiles into registers (_tiles), then waits, so
the wait overlaps the stream; the phase's inputs are loaded once, in one L2 trip (_inputs). Streaming one
tile at a time (the earlier code, at 255 registers with a 16k-value accumulator a row) moved about 13 GB/s
an SM, a third of an H100's share of its bandwidth (per-phase clock stamps, docs/benchmarks.md).

A running step's kernels give way to a first frame on the lane (synth/lane.py), which would otherwise wait for the
whole kernel in flight (both take every SM): where the runner says so (`yielding`, Yield), a kernel reads the lane's
gate (synth/stream_gate.py) during each layer (Talker) or pass (code predictor), and once it was up all programs stop
after that layer or pass; the stream then waits at the gate, and a second launch makes the rest.

Values are rounded to the model dtype where the PyTorch path rounds them. Scratch written inside a launch
is read with L2-only loads (".cg") after the barrier's acquire. In Triton's interpreter (the CPU tests) one
program runs every phase and the barriers are skipped. Measured on an H100 (docs/benchmarks.md): a grid
barrier cost about 0.7 us with the earlier one-thread atomic poll (_wait polls with one warp now, a little
faster; a volatile-load spin was slower), and an L2 prefetch of later phases' weights (at a layer's start, or
while waiting at a barrier) made the kernels slower: the tiles loaded ahead go to registers instead.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Protocol

import torch
import triton
import triton.language as tl

from talkgate.synth.attention import _in_dtype, attend_one_token, attend_range
from talkgate.synth.sample_kernel import sample_row

# one accumulator a row: at 4 rows the predictor kernel spilled registers and lost to the per-step path
# (H100: 4.7 ms against about 3.3); at 1 and 2 rows it wins (2.2 and 2.6 ms against about 3.2)
MAX_ROWS = 2
WARPS = 8
TILE = 8192                      # columns x inputs of one row's multiply-add tile (registers)
PREFETCH = 24576                 # weights a program keeps in flight: the tiles loaded ahead (48 KB of bf16)
SPLIT = 64                       # Talker attention: positions a program reads (a 878-position slot: 14 parts)
# Launched as cooperative grids: the driver guarantees that all of a kernel's programs are resident at once, which
# the grid barrier needs. Alone on a GPU one program per SM always is; beside another process's kernels (engine
# processes sharing a GPU under CUDA MPS) two barrier kernels could in principle each hold part of the SMs and wait
# for the rest for ever. Three MPS clients running them at one row never stalled in 20 s, plain or cooperative, and
# a cooperative launch cost nothing measurable (bench/persistent_mps.py, docs/benchmarks.md): kept as the guarantee
COOPERATIVE = True


@triton.jit
def _arrive(SYNC, NPROG: tl.constexpr):
    """This program's half of a grid barrier: its writes so far are released to the other programs."""
    if NPROG > 1:
        tl.debug_barrier()
        tl.atomic_add(SYNC, 1, sem="release")


@triton.jit
def _wait(SYNC, target, NPROG: tl.constexpr):
    """Wait until every program has arrived (the counter reaches target); make their writes visible.
    Loads issued between _arrive and _wait (the next phase's first weight tiles) stream in meanwhile.
    Warp 0 polls with acquire loads, then one CTA barrier passes the ordering on to the other warps. A
    scalar tl.atomic_add(SYNC, 0) in a Triton loop polled through one thread's acquire load, a store to
    shared memory and two CTA barriers a poll (Triton 3.6's PTX); H100, kernels alone, 0.6B batch 1: code
    predictor 1.883 -> 1.843 ms; every thread polling by itself was slower, 1.95-1.98 ms (docs/benchmarks.md)."""
    if NPROG > 1:
        tl.inline_asm_elementwise(
            "{ .reg .pred p, w; .reg .u32 t; mov.u32 t, %tid.x; setp.ge.u32 w, t, 32; mov.s32 $0, 0; @w bra DONE; "
            "SPIN: ld.acquire.gpu.global.s32 $0, [$1]; setp.lt.s32 p, $0, $2; @p bra SPIN; DONE: }",
            "=r,l,r", [SYNC, target], dtype=tl.int32, is_pure=False, pack=1)
        tl.debug_barrier()


@triton.jit
def _grid_sync(SYNC, target, NPROG: tl.constexpr):
    """A grid barrier with nothing to load meanwhile."""
    _arrive(SYNC, NPROG)
    _wait(SYNC, target, NPROG)


@triton.jit
def _tile(W, q, pid, N, active, K: tl.constexpr, BN: tl.constexpr, CH: tl.constexpr, BK: tl.constexpr,
          NPROG: tl.constexpr):
    """Tile q [BN, BK] of this program's share of W [OPS * N, K]: column chunk c = q // (K // BK) (operand
    c // CH, its columns (pid + c % CH * NPROG) * BN..), inputs (q % (K // BK)) * BK... Inactive: loads nothing."""
    NK: tl.constexpr = K // BK
    c: tl.constexpr = q // NK
    n = (pid + (c % CH) * NPROG) * BN + tl.arange(0, BN)
    k = (q % NK) * BK + tl.arange(0, BK)
    row = (c // CH) * N + n
    # where(), not `&`: Triton's interpreter makes int32 of `&` between a [BN] and a runtime scalar int1
    return tl.load(W + row[:, None].to(tl.int64) * K + k[None, :], mask=tl.where(active, n < N, n < 0)[:, None],
                   other=0.0, eviction_policy="evict_first")


@triton.jit
def _tiles(W, pid, N, active, K: tl.constexpr, BN: tl.constexpr, CH: tl.constexpr, BK: tl.constexpr,
           OPS: tl.constexpr, NPROG: tl.constexpr, P: tl.constexpr):
    """The first P tiles of a phase (a tuple): loaded while the program waits at the barrier before it, so
    the phase starts with P tiles in flight and the barrier's wait overlaps the weight stream."""
    ws = ()
    for q in tl.static_range(P):
        if q < OPS * CH * (K // BK):
            ws = ws + (_tile(W, q, pid, N, active, K, BN, CH, BK, NPROG),)
    return ws


@triton.jit
def _inputs(IN, nrows, active, K: tl.constexpr, BK: tl.constexpr, ROWS: tl.constexpr):
    """The rows of IN [rows, K] as ROWS * (K // BK) chunks [BK] float32, row by row: all loads issued at
    once (IN was written by other programs in this launch: L2-only loads)."""
    kk = tl.arange(0, BK)
    xs = ()
    for r in tl.static_range(ROWS):
        for k0 in tl.static_range(0, K, BK):
            xs = xs + (tl.load(IN + r * K + k0 + kk, mask=(kk * 0 + r < nrows) & active, other=0.0,
                               cache_modifier=".cg").to(tl.float32),)
    return xs


@triton.jit
def _normed(xs, NW, eps, K: tl.constexpr, BK: tl.constexpr, ROWS: tl.constexpr, DT: tl.constexpr):
    """RMSNorm (weight NW) of each row's chunks, rounded to the model dtype where the PyTorch path rounds."""
    NK: tl.constexpr = K // BK
    kk = tl.arange(0, BK)
    out = ()
    for r in tl.static_range(ROWS):
        sq = tl.zeros([BK], tl.float32)
        for i in tl.static_range(NK):
            sq += xs[r * NK + i] * xs[r * NK + i]
        inv = tl.rsqrt(tl.sum(sq, axis=0) / K + eps)
        for i in tl.static_range(NK):
            w = tl.load(NW + i * BK + kk).to(tl.float32)
            out = out + (_in_dtype(_in_dtype(xs[r * NK + i] * inv, DT) * w, DT),)
    return out


@triton.jit
def _stream(W, pid, N, active, xs, ws, K: tl.constexpr, BN: tl.constexpr, CH: tl.constexpr, BK: tl.constexpr,
            OPS: tl.constexpr, ROWS: tl.constexpr, NPROG: tl.constexpr, P: tl.constexpr):
    """This program's share of W [OPS * N, K] times the rows' inputs xs (_inputs): a tuple of OPS * CH
    results [ROWS, BN] float32, one a column chunk (_tile). ws holds tiles 0..P-1 (_tiles); tile q + P is
    loaded before tile q is used, so P tiles stay in flight (one at a time streamed at about 13 GB/s an SM,
    a third of the H100's share). Each row has its own [BN, BK] accumulator in the tiles' layout (the row's
    inputs broadcast over it), summed once a chunk: no layout conversion of the weights."""
    NK: tl.constexpr = K // BK
    NT: tl.constexpr = OPS * CH * NK
    r = tl.arange(0, ROWS)[:, None]
    out = ()
    for q in tl.static_range(NT):
        if q + P < NT:
            ws = ws + (_tile(W, q + P, pid, N, active, K, BN, CH, BK, NPROG),)
        w = ws[q].to(tl.float32)
        if q % NK == 0:
            acc0 = tl.zeros([BN, BK], tl.float32)
            acc1 = tl.zeros([BN, BK], tl.float32)
        acc0 += w * xs[q % NK][None, :]
        if ROWS > 1:
            acc1 += w * xs[NK + q % NK][None, :]
        if q % NK == NK - 1:
            res = tl.where(r == 0, tl.sum(acc0, axis=1)[None, :], 0.0)
            if ROWS > 1:
                res += tl.where(r == 1, tl.sum(acc1, axis=1)[None, :], 0.0)
            out = out + (res,)
    return out


@triton.jit
def _rms_inv(X, nrows, eps, ROWS: tl.constexpr, H: tl.constexpr):
    """[ROWS] float32: 1 / rms of the rows of X [rows, H]."""
    r = tl.arange(0, ROWS)
    k = tl.arange(0, H)
    x = tl.load(X + r[:, None] * H + k[None, :], mask=(r < nrows)[:, None], other=0.0,
                cache_modifier=".cg").to(tl.float32)
    return tl.rsqrt(tl.sum(x * x, axis=1) / H + eps)


@triton.jit
def _rows_cols(nrows, n0, N, ROWS: tl.constexpr, BN: tl.constexpr):
    """Offsets [ROWS, BN] into a [rows, N] matrix and their mask."""
    r = tl.arange(0, ROWS)
    n = n0 + tl.arange(0, BN)
    return r[:, None] * N + n[None, :], (r < nrows)[:, None] & (n < N)[None, :]


@triton.jit
def _residual_matmul(IN, RES, X, X0, W, ws, pid, nrows, N_IN: tl.constexpr, HP: tl.constexpr, BN: tl.constexpr,
                     CH: tl.constexpr, BK: tl.constexpr, ROWS: tl.constexpr, NPROG: tl.constexpr, P: tl.constexpr,
                     active, skip):
    """C (the Talker's) and E: X = RES + IN @ W^T for this program's columns (skip: X = X0[:, 1], the next
    pass's input); ws its first tiles."""
    DT: tl.constexpr = X.dtype.element_ty
    xs = _inputs(IN, nrows, active, N_IN, BK, ROWS)
    acc = _stream(W, pid, HP, active, xs, ws, N_IN, BN, CH, BK, 1, ROWS, NPROG, P)
    for c in tl.static_range(CH):
        off, mask = _rows_cols(nrows, (pid + c * NPROG) * BN, HP, ROWS, BN)
        x = tl.load(RES + off, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
        nxt = tl.load(X0 + off + (off // HP + 1) * HP, mask=mask & skip, other=0.0).to(tl.float32)
        tl.store(X + off, tl.where(skip, nxt, x + acc[c].to(DT).to(tl.float32)).to(DT), mask=mask)


@triton.jit
def _normed_matmul(X, NW, W, ws, OUT, pid, nrows, eps, N: tl.constexpr, HP: tl.constexpr, BN: tl.constexpr,
                   CH: tl.constexpr, BK: tl.constexpr, ROWS: tl.constexpr, NPROG: tl.constexpr, P: tl.constexpr):
    """A and F: OUT = rms_norm(X) @ W^T for this program's columns, rounded to the model dtype; ws its first
    tiles."""
    DT: tl.constexpr = X.dtype.element_ty
    xs = _normed(_inputs(X, nrows, True, HP, BK, ROWS), NW, eps, HP, BK, ROWS, DT)
    acc = _stream(W, pid, N, True, xs, ws, HP, BN, CH, BK, 1, ROWS, NPROG, P)
    for c in tl.static_range(CH):
        off, mask = _rows_cols(nrows, (pid + c * NPROG) * BN, N, ROWS, BN)
        tl.store(OUT + off, acc[c].to(DT).to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu(xs, NW, W, ws, ACT, pid, nrows, eps, active, I: tl.constexpr, HP: tl.constexpr, BN: tl.constexpr,
            CH: tl.constexpr, BK: tl.constexpr, ROWS: tl.constexpr, NPROG: tl.constexpr, P: tl.constexpr):
    """D: ACT = SiLU(gate) * up of rms_norm(xs) (the residual rows as _inputs' chunks), W the fused [gate; up]
    rows (two operands); ws its first tiles."""
    DT: tl.constexpr = ACT.dtype.element_ty
    xs = _normed(xs, NW, eps, HP, BK, ROWS, DT)
    acc = _stream(W, pid, I, active, xs, ws, HP, BN, CH, BK, 2, ROWS, NPROG, P)
    for c in tl.static_range(CH):
        gate = acc[c].to(DT).to(tl.float32)
        up = acc[CH + c].to(DT).to(tl.float32)
        off, mask = _rows_cols(nrows, (pid + c * NPROG) * BN, I, ROWS, BN)
        tl.store(ACT + off, (gate * tl.sigmoid(gate) * up).to(DT), mask=mask)


@triton.jit
def _project(EIN, PW, PB, X, pid, nrows, HT: tl.constexpr, HP: tl.constexpr, BN: tl.constexpr, CH: tl.constexpr,
             BK: tl.constexpr, ROWS: tl.constexpr, NPROG: tl.constexpr, P: tl.constexpr):
    """P: X = EIN @ PW^T + PB (small_to_mtp_projection)."""
    DT: tl.constexpr = X.dtype.element_ty
    ws = _tiles(PW, pid, HP, True, HT, BN, CH, BK, 1, NPROG, P)
    acc = _stream(PW, pid, HP, True, _inputs(EIN, nrows, True, HT, BK, ROWS), ws, HT, BN, CH, BK, 1, ROWS, NPROG, P)
    for c in tl.static_range(CH):
        off, mask = _rows_cols(nrows, (pid + c * NPROG) * BN, HP, ROWS, BN)
        bias = tl.load(PB + off % HP, mask=mask, other=0.0).to(tl.float32)
        tl.store(X + off, (acc[c] + bias).to(DT), mask=mask)


@triton.jit
def _draw(LOGITS, EMB, ESUM, NEXT, CODES, SLOTS, TEMP, TOPK, TOPP, GREEDY, SEED, COUNTER, pid, nrows, t,
          G: tl.constexpr, VOC: tl.constexpr, HT: tl.constexpr, VBLOCK: tl.constexpr, NPROG: tl.constexpr):
    """G: codebook t of each row (one program a row, its parameters its slot's); its embedding joins ESUM and goes
    to NEXT."""
    key = (tl.cast(t, tl.int64) * 0x2545F491) & 0xFFFFFFFF
    k = tl.arange(0, HT)
    for b in range(pid, nrows, NPROG):
        at = tl.load(SLOTS + b)
        code = sample_row(LOGITS + b * VOC, VOC, tl.load(TEMP + at), tl.load(TOPK + at), tl.load(TOPP + at),
                          tl.load(GREEDY + at) != 0, tl.load(SEED + at), tl.load(COUNTER + b), key, VBLOCK)
        tl.store(CODES + b * (G - 1) + t - 1, code)
        e = tl.load(EMB + (tl.cast(t - 1, tl.int64) * VOC + code) * HT + k).to(tl.float32)
        tl.store(ESUM + b * HT + k, tl.load(ESUM + b * HT + k, cache_modifier=".cg") + e)
        tl.store(NEXT + b * HT + k, e.to(NEXT.dtype.element_ty))


@triton.jit
def _o_tiles(WO, pid, HP: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BN: tl.constexpr,
             ITEMS: tl.constexpr, NPROG: tl.constexpr):
    """The o_proj weights of this program's items in the code predictor's phase C (a tuple): item j = pid + i *
    NPROG is kv head h = j // (HP // BN) for output columns (j % (HP // BN)) * BN..: the tile [BN, GROUP, D] of
    W [HP, HQ * D] at those columns and the inputs of h's query group. Items past the last load nothing."""
    GROUP: tl.constexpr = HQ // HKV
    NCH: tl.constexpr = HP // BN
    g = tl.arange(0, GROUP)
    d = tl.arange(0, D)
    ws = ()
    for i in tl.static_range(ITEMS):
        j = pid + i * NPROG
        n = (j % NCH) * BN + tl.arange(0, BN)
        off = n[:, None, None] * (HQ * D) + (((j // NCH) * GROUP + g) * D)[None, :, None] + d[None, None, :]
        ws = ws + (tl.load(WO + off, mask=off * 0 + j < HKV * NCH, other=0.0, eviction_policy="evict_first"),)
    return ws


@triton.jit
def _attend_project(ws, QKV, NQ, NK, eps, COS, SIN, KC, VC, skh, pos, OPART, pid, scale, HP: tl.constexpr,
                    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BN: tl.constexpr, ITEMS: tl.constexpr,
                    NPROG: tl.constexpr, BLOCK: tl.constexpr):
    """The code predictor's phase C of one row with the attention folded in: for each item (kv head h, BN
    output columns; _o_tiles, ws), h's attention (attend_range over the pass's positions [0, pos) and the
    token, whose K/V every program of the head writes alike), rounded to the model dtype as the PyTorch path
    rounds it, times the tile: OPART[h, columns], h's part of o_proj, summed by phase D (_attended). The
    attention reads at most 16 positions, so the 16 programs of a head each compute it instead of waiting a
    barrier for 8 programs to: one phase and barrier a layer less (H100: phases B + C + D 14.6 -> 13.9 us;
    with two rows, two attentions a program and twice the parts to sum made it slower)."""
    DT: tl.constexpr = KC.dtype.element_ty
    GROUP: tl.constexpr = HQ // HKV
    NCH: tl.constexpr = HP // BN
    for i in tl.static_range(ITEMS):
        j = pid + i * NPROG
        h = j // NCH
        if h < HKV:
            # the group's step, not one query at a time as the code predictor's own kernel (synth/attention.py): here
            # that cost a one-row frame 0.23 ms, and gained nothing at two rows (_layer's attend_one_token, which keeps
            # the group's step too; docs/benchmarks.md "The one-token attention one query at a time")
            m, l, acc = attend_range(QKV, NQ, NK, eps, COS, SIN, KC, VC, KC, 0, h * skh, D, pos, 0, pos, True, scale,
                                     h, 1.0, HQ, HKV, GROUP, D, BLOCK, 0, False, False)
            o = (acc / l[:, None]).to(DT).to(tl.float32)
            n = (j % NCH) * BN + tl.arange(0, BN)
            tl.store(OPART + h * HP + n, tl.sum(tl.sum(ws[i].to(tl.float32) * o[None, :, :], axis=2), axis=1))


@triton.jit
def _attended(X, OPART, X2, pid, HP: tl.constexpr, BK: tl.constexpr, HKV: tl.constexpr, NPROG: tl.constexpr):
    """Phase D's input in the code predictor (one row), as _inputs' chunks: the residual X plus o_proj, the
    sum of phase C's kv-head parts (OPART) rounded to the model dtype once, as the PyTorch path rounds the
    product. Also written to X2 (this program's share of the columns), the residual that phase E adds to: X
    itself is still being read by the other programs."""
    DT: tl.constexpr = X.dtype.element_ty
    SHARE: tl.constexpr = (HP + NPROG - 1) // NPROG
    xs = _inputs(X, 1, True, HP, BK, 1)
    kk = tl.arange(0, BK)
    out = ()
    for i in tl.static_range(HP // BK):
        o = tl.zeros([BK], tl.float32)
        for h in tl.static_range(HKV):
            o += tl.load(OPART + h * HP + i * BK + kk, cache_modifier=".cg")
        x = (xs[i] + o.to(DT).to(tl.float32)).to(DT)
        tl.store(X2 + i * BK + kk, x, mask=(i * BK + kk) // SHARE == pid)
        out = out + (x.to(tl.float32),)
    return out


@triton.jit
def _of_row(values, b, ROWS: tl.constexpr):
    """values[b] of a [ROWS] tensor held in registers."""
    return tl.sum(tl.where(tl.arange(0, ROWS) == b, values, 0), axis=0)


@triton.jit
def _attend_split(target, QKV, NQ, NK, eps, COS, SIN, scs, KC, VC, sks, skh, TABLE, stab, slot_rows, pos_rows, ATT,
                  PART, ML, SYNC, pid, nrows, scale, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                  ROWS: tl.constexpr, NPROG: tl.constexpr, BLOCK: tl.constexpr, SPLIT: tl.constexpr,
                  MAXSPLIT: tl.constexpr, PAGE: tl.constexpr):
    """Phase B with a long cache (flash-decoding): one program a (row, kv head, part of SPLIT positions), so a
    row's attention does not wait on one program reading hundreds of positions (at position 600 that was
    2.5 of a 6.9-ms batch-1 step). Part s of [0, n] covers [s * SPLIT, (s + 1) * SPLIT); the last one holds
    the token itself and writes its K/V. A row with one part writes its output; otherwise the parts' softmax
    states go to PART/ML and, after one more barrier (only when some row has several parts), are combined. With pages
    (PAGE > 0) a slot's positions are found through its row of the page table TABLE (stride stab), sks a page's
    stride."""
    GROUP: tl.constexpr = HQ // HKV
    NQKV: tl.constexpr = (HQ + 2 * HKV) * D
    g = tl.arange(0, GROUP)
    d = tl.arange(0, D)
    for j in range(pid, nrows * HKV * MAXSPLIT, NPROG):
        part = j % MAXSPLIT
        b = j // (HKV * MAXSPLIT)
        h = (j // MAXSPLIT) % HKV
        n = _of_row(pos_rows, b, ROWS)
        last = n // SPLIT
        if part <= last:
            slot = _of_row(slot_rows, b, ROWS)
            if PAGE > 0:
                tab, base = TABLE + slot * stab, h * skh
            else:
                tab, base = TABLE, slot * sks + h * skh
            m, l, acc = attend_range(QKV + b * NQKV, NQ, NK, eps, COS + b * scs, SIN + b * scs, KC, VC, tab, sks, base,
                                     D, n, part * SPLIT, tl.minimum(part * SPLIT + SPLIT, n), part == last, scale, h,
                                     1.0, HQ, HKV, GROUP, D, BLOCK, PAGE, False, False)
            if last == 0:
                tl.store(ATT + b * HQ * D + (h * GROUP + g)[:, None] * D + d[None, :],
                         (acc / l[:, None]).to(ATT.dtype.element_ty))
            else:
                at = (b * HKV + h) * MAXSPLIT + part
                tl.store(PART + at * GROUP * D + g[:, None] * D + d[None, :], acc)
                tl.store(ML + at * 2 * GROUP + g, m)
                tl.store(ML + at * 2 * GROUP + GROUP + g, l)
    if tl.max(pos_rows, axis=0) >= SPLIT:
        target += NPROG
        _grid_sync(SYNC, target, NPROG)
        for j in range(pid, nrows * HKV, NPROG):
            b = j // HKV
            h = j % HKV
            last = _of_row(pos_rows, b, ROWS) // SPLIT
            if last > 0:
                m = tl.full([GROUP], float("-inf"), tl.float32)
                l = tl.zeros([GROUP], tl.float32)
                acc = tl.zeros([GROUP, D], tl.float32)
                for part in range(0, last + 1):
                    at = (b * HKV + h) * MAXSPLIT + part
                    m_part = tl.load(ML + at * 2 * GROUP + g, cache_modifier=".cg")
                    m_new = tl.maximum(m, m_part)
                    alpha = tl.exp(m - m_new)
                    beta = tl.exp(m_part - m_new)
                    l = l * alpha + tl.load(ML + at * 2 * GROUP + GROUP + g, cache_modifier=".cg") * beta
                    acc = acc * alpha[:, None] + tl.load(PART + at * GROUP * D + g[:, None] * D + d[None, :],
                                                         cache_modifier=".cg") * beta[:, None]
                    m = m_new
                tl.store(ATT + b * HQ * D + (h * GROUP + g)[:, None] * D + d[None, :],
                         (acc / l[:, None]).to(ATT.dtype.element_ty))
    return target


@triton.jit
def _layer(target, l, wa, keep, skip, X, X0, QKV, ATT, ACT, SYNC, WQKV, WO, WGU, WD, NIN, NPOST, NQ, NK,
           KC, VC, sks, skh, TABLE, stab, slot_rows, pos_rows, pos_all, COS, SIN, PART, ML, OPART, X2, pid, nrows, eps,
           scale, GATE, DECIDE, tell, ask,
           HP: tl.constexpr, I: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
           ROWS: tl.constexpr, NPROG: tl.constexpr, BLOCK: tl.constexpr, SPLIT: tl.constexpr, MAXSPLIT: tl.constexpr,
           FOLD: tl.constexpr, PAGE: tl.constexpr,
           BN_A: tl.constexpr, CH_A: tl.constexpr, BK_A: tl.constexpr, P_A: tl.constexpr, BN_C: tl.constexpr, CH_C: tl.constexpr,
           BK_C: tl.constexpr, P_C: tl.constexpr, BN_D: tl.constexpr, CH_D: tl.constexpr, BK_D: tl.constexpr, P_D: tl.constexpr, BN_E: tl.constexpr,
           CH_E: tl.constexpr, BK_E: tl.constexpr, P_E: tl.constexpr):
    """Decoder layer l of the stacked weights for the rows of X (the residual, updated in place), wa its
    phase A's first weight tiles (_tiles); each phase followed by a grid barrier, at which the next phase's
    first tiles are loaded. Returns the barrier count after phase E, whose barrier it arrives at but
    does not wait for: the caller loads the tiles of whatever comes next, then waits. keep false: skip the
    MLP; skip true: phase E stores X0[:, 1] instead (see predictor_kernel). Row b's K/V go to KC/VC at slot
    * sks + head * skh: SPLIT == 0 (the code predictor): slot b, position pos_all, RoPE row COS/SIN; FOLD
    (the code predictor's single row): the attention folded into phase C (_attend_project: o_proj in kv-head
    parts OPART, summed into X2 by phase D; BN_C and CH_C are its tile width and items a program). SPLIT > 0
    (the Talker): slot slot_rows[b], position pos_rows[b] ([ROWS] in registers), RoPE row COS/SIN + b * D,
    attention in SPLIT-position parts (_attend_split), through the page table TABLE where PAGE > 0. Yielding (see talker_kernel): where `tell`, this program
    reads the gate during phase A and writes it to DECIDE before the barrier after it; where `ask`, every program
    reads DECIDE after that barrier (so that all agree). Returns (barrier count, the gate as DECIDE held it, 0
    unless `ask`)."""
    li = tl.cast(l, tl.int64)
    up = tl.load(GATE, mask=tell, other=0, volatile=True)
    NQKV: tl.constexpr = (HQ + 2 * HKV) * D
    QD: tl.constexpr = HQ * D
    W_O = WO + li * HP * QD
    W_GU = WGU + li * 2 * I * HP
    W_D = WD + li * HP * I
    _normed_matmul(X, NIN + l * HP, WQKV + li * NQKV * HP, wa, QKV, pid, nrows, eps, NQKV, HP, BN_A, CH_A, BK_A,
                   ROWS, NPROG, P_A)
    tl.store(DECIDE, up, mask=tell)
    _arrive(SYNC, NPROG)
    if FOLD:                                                  # the tiles are held through the attention
        wc = _o_tiles(W_O, pid, HP, HQ, HKV, D, BN_C, CH_C, NPROG)
    else:
        wc = _tiles(W_O, pid, HP, True, QD, BN_C, CH_C, BK_C, 1, NPROG, P_C)
    target += NPROG
    _wait(SYNC, target, NPROG)
    stop = tl.load(DECIDE, mask=ask, other=0, cache_modifier=".cg")   # its latency hidden by the layer's rest
    if FOLD:
        _attend_project(wc, QKV, NQ + l * D, NK + l * D, eps, COS, SIN, KC, VC, skh, pos_all, OPART, pid, scale, HP,
                        HQ, HKV, D, BN_C, CH_C, NPROG, BLOCK)
        RES = X2
    else:
        if SPLIT == 0:
            for j in range(pid, nrows * HKV, NPROG):          # B: one program a (row, kv head)
                b = j // HKV
                attend_one_token(QKV + b * NQKV, NQ + l * D, NK + l * D, eps, COS, SIN, KC, VC, KC, 0,
                                 b * sks + (j % HKV) * skh, D, pos_all, ATT + b * QD, scale, j % HKV, 1.0, HQ,
                                 HKV, HQ // HKV, D, BLOCK, 0, False, False)
        else:
            target = _attend_split(target, QKV, NQ + l * D, NK + l * D, eps, COS, SIN, D, KC, VC, sks, skh, TABLE,
                                   stab, slot_rows, pos_rows, ATT, PART, ML, SYNC, pid, nrows, scale, HQ, HKV, D,
                                   ROWS, NPROG, BLOCK, SPLIT, MAXSPLIT, PAGE)
        target += NPROG
        _grid_sync(SYNC, target, NPROG)
        _residual_matmul(ATT, X, X, X0, W_O, wc, pid, nrows, QD, HP, BN_C, CH_C, BK_C, ROWS, NPROG, P_C, True, False)
        RES = X
    _arrive(SYNC, NPROG)
    wd = _tiles(W_GU, pid, I, keep, HP, BN_D, CH_D, BK_D, 2, NPROG, P_D)
    target += NPROG
    _wait(SYNC, target, NPROG)
    if FOLD:
        xs = _attended(X, OPART, X2, pid, HP, BK_D, HKV, NPROG)
    else:
        xs = _inputs(X, nrows, True, HP, BK_D, ROWS)
    _swiglu(xs, NPOST + l * HP, W_GU, wd, ACT, pid, nrows, eps, keep, I, HP, BN_D, CH_D, BK_D, ROWS, NPROG, P_D)
    _arrive(SYNC, NPROG)
    we = _tiles(W_D, pid, HP, keep, I, BN_E, CH_E, BK_E, 1, NPROG, P_E)
    target += NPROG
    _wait(SYNC, target, NPROG)
    _residual_matmul(ACT, RES, X, X0, W_D, we, pid, nrows, I, HP, BN_E, CH_E, BK_E, ROWS, NPROG, P_E, keep, skip)
    _arrive(SYNC, NPROG)
    return target + NPROG, stop


@triton.jit(do_not_specialize=["check", "resume"])
def talker_kernel(X, QKV, ATT, ACT, SYNC, OUT, WQKV, WO, WGU, WD, NIN, NPOST, NQ, NK, NFINAL,
                  KC, VC, sl, sks, skh, TABLE, stab, SLOTS, POS, COS, SIN, PART, ML, nrows, eps, scale,
                  GATE, STATE, DECIDE, check, resume,
                  L: tl.constexpr, HP: tl.constexpr, I: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr,
                  D: tl.constexpr, ROWS: tl.constexpr, NPROG: tl.constexpr, BLOCK: tl.constexpr,
                  SPLIT: tl.constexpr, MAXSPLIT: tl.constexpr, PAGE: tl.constexpr,
                  BN_A: tl.constexpr, CH_A: tl.constexpr, BK_A: tl.constexpr, P_A: tl.constexpr, BN_C: tl.constexpr,
                  CH_C: tl.constexpr, BK_C: tl.constexpr, P_C: tl.constexpr, BN_D: tl.constexpr, CH_D: tl.constexpr,
                  BK_D: tl.constexpr, P_D: tl.constexpr, BN_E: tl.constexpr, CH_E: tl.constexpr, BK_E: tl.constexpr, P_E: tl.constexpr):
    """The Talker's step (talker_step). Yielding: with `check`, the launch stops after the layer during which it
    found the gate up (GATE: synth/stream_gate.py's flag) and writes where it stopped to STATE (L: done); with
    `resume`, a launch starts from STATE's layer (and does nothing past L)."""
    pid = tl.program_id(0)
    DT: tl.constexpr = X.dtype.element_ty
    NQKV: tl.constexpr = (HQ + 2 * HKV) * D
    target = pid * 0
    start = tl.load(STATE, mask=resume != 0, other=0)
    end = start * 0 + L                                       # the layer after which the gate stopped the launch
    # every layer's attention starts from the rows' slots and positions: loaded once, not once a layer
    r = tl.arange(0, ROWS)
    slot_rows = tl.load(SLOTS + r, mask=r < nrows, other=0).to(tl.int64)
    pos_rows = tl.load(POS + r, mask=r < nrows, other=0).to(tl.int32)
    wa = _tiles(WQKV + tl.cast(start, tl.int64) * NQKV * HP, pid, NQKV, start < L, HP, BN_A, CH_A, BK_A, 1, NPROG,
                P_A)
    for l in range(start, L):
        if l < end:                                           # (no break in Triton: the layers after a stop skip)
            li = tl.cast(l, tl.int64)
            target, stop = _layer(
                target, l, wa, True, False, X, X, QKV, ATT, ACT, SYNC, WQKV, WO, WGU, WD, NIN, NPOST, NQ, NK,
                KC + li * sl, VC + li * sl, sks, skh, TABLE, stab, slot_rows, pos_rows, 0, COS, SIN, PART, ML, PART,
                X, pid, nrows, eps, scale, GATE, DECIDE + l, (check != 0) & (pid == 0), check != 0, HP, I, HQ, HKV, D,
                ROWS, NPROG, BLOCK, SPLIT, MAXSPLIT, False, PAGE, BN_A, CH_A, BK_A, P_A, BN_C, CH_C, BK_C, P_C, BN_D, CH_D, BK_D, P_D,
                BN_E, CH_E, BK_E, P_E)
            wa = _tiles(WQKV + (li + 1) * NQKV * HP, pid, NQKV, l + 1 < L, HP, BN_A, CH_A, BK_A, 1, NPROG, P_A)
            _wait(SYNC, target, NPROG)
            end = tl.where(stop != 0, l + 1, end)
    tl.store(STATE, end, mask=(check != 0) & (pid == 0))
    if (end == L) & (start < L):                              # the final norm, this program's columns
        inv = _rms_inv(X, nrows, eps, ROWS, HP)
        for c in tl.static_range(CH_E):
            off, mask = _rows_cols(nrows, (pid + c * NPROG) * BN_E, HP, ROWS, BN_E)
            x = tl.load(X + off, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
            w = tl.load(NFINAL + off % HP, mask=mask, other=0.0).to(tl.float32)
            tl.store(OUT + off, _in_dtype(_in_dtype(x * inv[:, None], DT) * w, DT).to(DT), mask=mask)


@triton.jit(do_not_specialize=["check", "resume"])
def predictor_kernel(
        X0, X, X2, QKV, ATT, OPART, ACT, KV, LOGITS, EIN, ESUM, CODES, SYNC,
        WQKV, WO, WGU, WD, NIN, NPOST, NQ, NK, NFINAL, HEADS, EMB, PW, PB, COS, SIN,
        SLOTS, TEMP, TOPK, TOPP, GREEDY, SEED, COUNTER, nrows, eps, scale, GATE, STATE, DECIDE, check, resume,
        L: tl.constexpr, G: tl.constexpr, HP: tl.constexpr, HT: tl.constexpr, I: tl.constexpr,
        VOC: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr,
        NPROG: tl.constexpr, PROJ: tl.constexpr,
        BN_A: tl.constexpr, CH_A: tl.constexpr, BK_A: tl.constexpr, P_A: tl.constexpr,
        BN_C: tl.constexpr, CH_C: tl.constexpr, BK_C: tl.constexpr, P_C: tl.constexpr,
        BN_D: tl.constexpr, CH_D: tl.constexpr, BK_D: tl.constexpr, P_D: tl.constexpr,
        BN_E: tl.constexpr, CH_E: tl.constexpr, BK_E: tl.constexpr, P_E: tl.constexpr,
        BN_F: tl.constexpr, CH_F: tl.constexpr, BK_F: tl.constexpr, P_F: tl.constexpr,
        BN_P: tl.constexpr, CH_P: tl.constexpr, BK_P: tl.constexpr, P_P: tl.constexpr, VBLOCK: tl.constexpr):
    """The code predictor's frame (predict). Yielding as talker_kernel's, between passes: with `check`, the launch
    stops after the pass during which it found the gate up."""
    pid = tl.program_id(0)
    KV_ROWS: tl.constexpr = ROWS * HKV * G * D                 # KV [L, 2, ROWS, HKV, G, D]
    NQKV: tl.constexpr = (HQ + 2 * HKV) * D
    target = pid * 0
    start = tl.load(STATE, mask=resume != 0, other=0)
    end = start * 0 + G                                       # the pass after which the gate stopped the launch
    wa = _tiles(WQKV, pid, NQKV, True, HP, BN_A, CH_A, BK_A, 1, NPROG, P_A)
    for t in range(start, G):
        if t < end:                                           # (no break in Triton: the passes after a stop skip)
            stop = pid * 0
            for l in range(0, L - 1):
                K = KV + tl.cast(l, tl.int64) * 2 * KV_ROWS
                target, up = _layer(
                    target, l, wa, True, False, X, X0, QKV, ATT, ACT, SYNC, WQKV, WO, WGU, WD, NIN, NPOST, NQ, NK, K,
                    K + KV_ROWS, HKV * G * D, G * D, X, 0, X, X, t, COS + t * D, SIN + t * D, X, X, OPART, X2, pid,
                    nrows, eps, scale, GATE, DECIDE + t, (check != 0) & (pid == 0) & (l == 0), (check != 0) & (l == 0),
                    HP, I, HQ, HKV, D, ROWS, NPROG, G, 0, 1, ROWS == 1, 0, BN_A, CH_A, BK_A, P_A, BN_C, CH_C, BK_C, P_C,
                    BN_D, CH_D, BK_D, P_D, BN_E, CH_E, BK_E, P_E)
                stop = stop | up
                wa = _tiles(WQKV + tl.cast(l + 1, tl.int64) * NQKV * HP, pid, NQKV, True, HP, BN_A, CH_A, BK_A, 1,
                            NPROG, P_A)
                _wait(SYNC, target, NPROG)
            # the last layer, outside the loop so that the head's tiles (F) it loads at its last barrier are not
            # carried through the loop in registers; its MLP at position 0 is never read: its phase E loads the
            # next input instead
            K = KV + (L - 1) * 2 * KV_ROWS
            target, _ = _layer(
                target, L - 1, wa, t > 0, t == 0, X, X0, QKV, ATT, ACT, SYNC, WQKV, WO, WGU, WD, NIN, NPOST, NQ, NK, K,
                K + KV_ROWS, HKV * G * D, G * D, X, 0, X, X, t, COS + t * D, SIN + t * D, X, X, OPART, X2, pid, nrows,
                eps, scale, GATE, DECIDE + t, pid < 0, pid < 0, HP, I, HQ, HKV, D, ROWS, NPROG, G, 0, 1, ROWS == 1, 0,
                BN_A,
                CH_A, BK_A, P_A, BN_C, CH_C, BK_C, P_C, BN_D, CH_D, BK_D, P_D, BN_E, CH_E, BK_E, P_E)
            if t >= 1:
                W_F = HEADS + tl.cast(t - 1, tl.int64) * VOC * HP
                wf = _tiles(W_F, pid, VOC, True, HP, BN_F, CH_F, BK_F, 1, NPROG, P_F)
                _wait(SYNC, target, NPROG)
                _normed_matmul(X, NFINAL, W_F, wf, LOGITS, pid, nrows, eps, VOC, HP, BN_F, CH_F, BK_F, ROWS, NPROG,
                               P_F)
                _arrive(SYNC, NPROG)
                wa = _tiles(WQKV, pid, NQKV, t < G - 1, HP, BN_A, CH_A, BK_A, 1, NPROG, P_A)   # the next pass's layer 0
                target += NPROG
                _wait(SYNC, target, NPROG)
                if PROJ:
                    _draw(LOGITS, EMB, ESUM, EIN, CODES, SLOTS, TEMP, TOPK, TOPP, GREEDY, SEED, COUNTER, pid, nrows,
                          t, G, VOC, HT, VBLOCK, NPROG)
                else:
                    _draw(LOGITS, EMB, ESUM, X, CODES, SLOTS, TEMP, TOPK, TOPP, GREEDY, SEED, COUNTER, pid, nrows, t,
                          G, VOC, HT, VBLOCK, NPROG)
                if t < G - 1:
                    target += NPROG
                    _grid_sync(SYNC, target, NPROG)
                    if PROJ:
                        _project(EIN, PW, PB, X, pid, nrows, HT, HP, BN_P, CH_P, BK_P, ROWS, NPROG, P_P)
                        target += NPROG
                        _grid_sync(SYNC, target, NPROG)
            else:
                wa = _tiles(WQKV, pid, NQKV, True, HP, BN_A, CH_A, BK_A, 1, NPROG, P_A)
                _wait(SYNC, target, NPROG)
            end = tl.where((stop != 0) & (t + 1 < G), t + 1, end)
    tl.store(STATE, end, mask=(check != 0) & (pid == 0))


def supports(model, rows: int) -> bool:
    """Whether the kernels take `rows` rows of this Talker or code predictor: at most MAX_ROWS rows of
    hidden 1024 (fewer when wider), and at most the model's `persistent_rows` where the runner set one (while
    a compile helper compiles the kernels of more rows), stacked layers (synth.model.fuse_projections),
    power-of-two widths."""
    d = model.cfg.dims
    widths = [d.hidden_size, d.head_dim, d.num_heads // d.num_kv_heads]
    if hasattr(model, "embeddings"):                          # the code predictor's input width (Talker hidden)
        widths.append(model.embeddings.shape[-1])
    pow2 = all(n & (n - 1) == 0 for n in widths)
    # a row is an accumulator tile: 2 rows of the 1.7B Talker (hidden 2048) lost to the per-layer path on
    # the H100 (2.04 against about 1.8 ms), 2 rows of hidden 1024 win
    limit = min(MAX_ROWS, vars(model).get("persistent_rows", MAX_ROWS))
    return 0 < rows <= limit and rows * d.hidden_size <= 2048 and pow2 and hasattr(model, "stacked")


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def programs(device: torch.device) -> int:
    """One program per SM on CUDA (all resident, which the grid barrier needs); one in the interpreter."""
    if device.type != "cuda":
        return 1
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def tiles(N: int, K: int, nprog: int, rows: int) -> tuple[int, int, int, int]:
    """(BN, CH, BK, P) of a phase with N output columns over K inputs: BN columns a chunk and CH chunks a
    program, choosing the fewest columns for the busiest program (then the widest chunk); BK inputs a
    tile, as many as the rows' accumulators allow; P tiles in flight."""
    best = None
    for bn in (2, 4, 8, 16, 32, 64):
        ch = triton.cdiv(triton.cdiv(N, bn), nprog)
        key = (ch * bn, -bn)
        if best is None or key < best[0]:
            best = (key, bn, ch)
    _, bn, ch = best
    bk = min(K & -K, 1024, max(16, TILE // (rows * bn)))
    return bn, ch, bk, max(1, PREFETCH // (bn * bk))


def _layer_tiles(d, nprog: int, rows: int) -> dict:
    qkv, qd = (d.num_heads + 2 * d.num_kv_heads) * d.head_dim, d.num_heads * d.head_dim
    return dict(A=tiles(qkv, d.hidden_size, nprog, rows), C=tiles(d.hidden_size, qd, nprog, rows),
                D=tiles(d.intermediate_size, d.hidden_size, nprog, rows),
                E=tiles(d.hidden_size, d.intermediate_size, nprog, rows))


def _meta(sizes: dict) -> dict:
    return {f"{kind}_{part}": v for part, t in sizes.items() for kind, v in zip(("BN", "CH", "BK", "P"), t)}


def _attend_project_tiles(d, nprog: int) -> tuple[int, int, int, int]:
    """(BN, items a program, -, -) of the code predictor's phase C (_attend_project): kv heads x column chunks
    of BN, at most one item a program where there are programs enough (H100: 8 x 16 chunks of 64)."""
    bn = min(d.hidden_size, max(4, triton.next_power_of_2(triton.cdiv(d.num_kv_heads * d.hidden_size, nprog))))
    return bn, triton.cdiv(d.num_kv_heads * (d.hidden_size // bn), nprog), 0, 0


def _scratch(d, B: int, dev, dt) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q/k/v and MLP activation rows of one layer, and the barrier counters: [0, 0] a launch's, [1, 0] the resume
    launch's where it yields (16 bytes apart: a pointer's alignment is part of a Triton kernel's specialization),
    [0, 1] the STATE word."""
    return (torch.empty(B, (d.num_heads + 2 * d.num_kv_heads) * d.head_dim, device=dev, dtype=dt),
            torch.empty(B, d.intermediate_size, device=dev, dtype=dt),
            torch.zeros(2, 4, device=dev, dtype=torch.int32))


class Yield(Protocol):
    """What a running step's kernels give way to at their layer (Talker) or pass (code predictor) boundaries: the
    first-frame lane's gate (synth/stream_gate.py's StreamGate), `flag` 1 while a lane launch runs, `wait(stream)`
    queuing on the stream a wait until it is 0. A kernel that found the gate up stops where it was; the stream waits at
    the gate, then a second launch of the kernel finishes the rest (one that finds nothing left returns at once)."""
    flag: torch.Tensor

    def wait(self, stream) -> None: ...


_yielding = threading.local()          # .to: the Yield of the calling thread's launches (per thread: a runner's own)


@contextlib.contextmanager
def yielding(to: Yield | None):
    """Within: this thread's kernels launched (or captured into a graph) yield `to` (the runner: its main stream's
    steps, never the lane's own launches)."""
    before = getattr(_yielding, "to", None)
    _yielding.to = to
    try:
        yield
    finally:
        _yielding.to = before


def _launch(kernel, nprog: int, sync: torch.Tensor, decisions: int, **args) -> None:
    """One launch of `kernel` with `args` (all but its yielding ones), or where the caller yields, the launch that
    checks the gate (its `decisions` words: a layer's or a pass's each), the wait at it, and the launch that finishes.
    Every launch passes pointers of the same alignments (one compiled kernel): GATE and DECIDE unread without `check`
    (then sync[1])."""
    y = getattr(_yielding, "to", None)
    state = sync[0, 1:2]
    if y is None:
        kernel[(nprog,)](SYNC=sync[0], GATE=sync[1], STATE=state, DECIDE=sync[1], check=0, resume=0, **args)
        return
    decide = torch.empty(decisions, device=sync.device, dtype=torch.int32)
    kernel[(nprog,)](SYNC=sync[0], GATE=y.flag, STATE=state, DECIDE=decide, check=1, resume=0, **args)
    y.wait(torch.cuda.current_stream(sync.device) if sync.is_cuda else None)
    kernel[(nprog,)](SYNC=sync[1], GATE=y.flag, STATE=state, DECIDE=decide, check=0, resume=1, **args)


def talker_step(talker, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                pos: torch.Tensor, split: int = SPLIT) -> torch.Tensor:
    """Talker.forward for one token per row, at most MAX_ROWS rows, in one launch: x [B, H], cos/sin
    [B, head_dim] float32, slots and pos [B] -> final-normed hidden [B, H]; writes K/V at (slot, pos).
    Attention runs in parts of `split` positions (a power of two)."""
    d, st = talker.cfg.dims, talker.stacked
    B, HP = x.shape
    dev, dt = x.device, x.dtype
    ROWS, nprog = triton.next_power_of_2(B), programs(dev)
    X = x.clone(memory_format=torch.contiguous_format)
    qkv, act, sync = _scratch(d, B, dev, dt)
    att = torch.empty(B, d.num_heads * d.head_dim, device=dev, dtype=dt)
    out = torch.empty_like(X)
    kc, vc = talker.kv[0], talker.kv[1]                        # [L, pages, kv_heads, page_len, head_dim]
    table = talker.page_table                                  # [slots, slot pages]
    parts, group = triton.cdiv(talker.max_len, split), d.num_heads // d.num_kv_heads
    part = torch.empty(B, d.num_kv_heads, parts, group, d.head_dim, device=dev, dtype=torch.float32)
    ml = torch.empty(B, d.num_kv_heads, parts, 2, group, device=dev, dtype=torch.float32)
    _launch(talker_kernel, nprog, sync, d.num_layers,
            X=X, QKV=qkv, ATT=att, ACT=act, OUT=out, WQKV=st.qkv, WO=st.o, WGU=st.gate_up, WD=st.down,
            NIN=st.input_norm, NPOST=st.post_norm, NQ=st.q_norm, NK=st.k_norm, NFINAL=talker.norm.weight, KC=kc, VC=vc,
            sl=kc.stride(0), sks=kc.stride(1), skh=kc.stride(2), TABLE=table, stab=table.stride(0), SLOTS=slots,
            POS=pos, COS=cos.contiguous(),
            SIN=sin.contiguous(), PART=part, ML=ml, nrows=B, eps=d.rms_norm_eps, scale=d.head_dim ** -0.5,
            L=d.num_layers, HP=HP, I=d.intermediate_size, HQ=d.num_heads, HKV=d.num_kv_heads, D=d.head_dim, ROWS=ROWS,
            NPROG=nprog, BLOCK=min(32, split), SPLIT=split, MAXSPLIT=parts, PAGE=kc.shape[3], num_warps=WARPS,
            launch_cooperative_grid=COOPERATIVE, **_meta(_layer_tiles(d, nprog, ROWS)))
    return out


def predict(predictor, hidden: torch.Tensor, code0_embed: torch.Tensor, rows, counter: torch.Tensor,
            slots: torch.Tensor):
    """CodePredictor.predict for at most MAX_ROWS rows in one launch: hidden and code0_embed [B, Talker H],
    rows a synth.sampling.RowSampling of slots (its sub_* parameters and seed), counter [B] frame indices, slots [B]
    the rows' slots in it -> (codes [B, 15] int64, embed_sum [B, Talker H])."""
    d, cfg, st = predictor.cfg.dims, predictor.cfg, predictor.stacked
    B, HT = hidden.shape
    G, HP, V = cfg.num_code_groups, d.hidden_size, cfg.vocab_size
    dev, dt = hidden.device, hidden.dtype
    ROWS, nprog = triton.next_power_of_2(B), programs(dev)
    x0 = predictor._project(torch.stack([hidden, code0_embed], dim=1)).contiguous()     # [B, 2, HP]
    x = x0[:, 0].clone(memory_format=torch.contiguous_format)
    qkv, act, sync = _scratch(d, B, dev, dt)
    fold = ROWS == 1                                                   # see _attend_project
    if fold:                                                           # (x: unused pointers)
        att = x
        x2 = torch.empty(1, HP, device=dev, dtype=dt)                   # the residual between phases D and E
        opart = torch.empty(d.num_kv_heads, HP, device=dev, dtype=torch.float32)     # o_proj by kv head
    else:
        att, x2, opart = torch.empty(B, d.num_heads * d.head_dim, device=dev, dtype=dt), x, x
    kv = torch.empty(d.num_layers, 2, ROWS, d.num_kv_heads, G, d.head_dim, device=dev, dtype=dt)
    logits = torch.empty(B, V, device=dev, dtype=torch.float32)
    ein = torch.empty(B, HT, device=dev, dtype=dt)
    esum = code0_embed.to(torch.float32, copy=True)
    codes = torch.empty(B, G - 1, device=dev, dtype=torch.int64)
    proj = predictor.small_to_mtp_projection
    pw, pb = (proj.weight, proj.bias) if proj is not None else (x, x)
    sizes = dict(_layer_tiles(d, nprog, ROWS), F=tiles(V, HP, nprog, ROWS), P=tiles(HP, HT, nprog, ROWS))
    if fold:
        sizes["C"] = _attend_project_tiles(d, nprog)
    _launch(predictor_kernel, nprog, sync, G,
            X0=x0, X=x, X2=x2, QKV=qkv, ATT=att, OPART=opart, ACT=act, KV=kv, LOGITS=logits, EIN=ein, ESUM=esum,
            CODES=codes, WQKV=st.qkv, WO=st.o, WGU=st.gate_up, WD=st.down, NIN=st.input_norm, NPOST=st.post_norm,
            NQ=st.q_norm, NK=st.k_norm, NFINAL=predictor.norm.weight, HEADS=predictor.heads, EMB=predictor.embeddings,
            PW=pw, PB=pb, COS=predictor.cos, SIN=predictor.sin, SLOTS=slots, TEMP=rows.sub_temperature,
            TOPK=rows.sub_top_k, TOPP=rows.sub_top_p, GREEDY=rows.sub_greedy.view(torch.uint8), SEED=rows.seed,
            COUNTER=counter, nrows=B,
            eps=d.rms_norm_eps, scale=d.head_dim ** -0.5,
            L=d.num_layers, G=G, HP=HP, HT=HT, I=d.intermediate_size, VOC=V, HQ=d.num_heads, HKV=d.num_kv_heads,
            D=d.head_dim, ROWS=ROWS, NPROG=nprog, PROJ=proj is not None, VBLOCK=triton.next_power_of_2(V),
            num_warps=WARPS, launch_cooperative_grid=COOPERATIVE, **_meta(sizes))
    return codes, esum.to(dt)
