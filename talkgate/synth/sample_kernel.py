"""synth.sampling.sample as one Triton kernel per call: the CUDA path of every codebook draw.

In PyTorch a draw is about 40 kernels (temperature, a full sort of the vocabulary for top-k/top-p,
softmax, cumsum, the integer hash noise, Gumbel, argmax): 16 draws a frame made the sampler the
largest group of kernels in a batch-1 step (bench/engine.py profile). Here one program per row holds
the row's logits in registers and does all of it:
- top-k: the k-th largest value found exactly by an 8-way search over the float's order-preserving
  int32 key (rounds of 8 counts over the row, the bracket snapped to the keys inside it), no sort;
- top-p: the smallest value whose "mass above" (softmax of the top-k survivors) is below top_p, by
  the same bisection (skipped when top_p >= 1);
- noise: the same lowbias32 hash of (seed, counter, stream, index) as synth.sampling.uniform_noise,
  in uint32 arithmetic, so the kernel and the PyTorch code draw the same ids (up to float rounding of
  the top-p sums and of log: tests/gpu/test_sample_kernel.py).
Ties at the cutoffs are kept, as in the PyTorch code. Codebook 0's draw (`codebook0`) applies the repetition
penalty and the bans of synth.sampling.FrameSampler.codebook0 to the row in registers first and marks the drawn id
in the slot's seen row: one kernel where PyTorch takes about 15 more. Runs in Triton's interpreter on the CPU for
tests.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def mix32(x):
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def _min_max(a_min, a_max, b_min, b_max):
    return tl.minimum(a_min, b_min), tl.maximum(a_max, b_max)


@triton.jit
def _flip(bits):
    """A float32's bits as an int32 key whose order is the floats' order; the same map takes a key back to the bits."""
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _group_stats(n_a, lo_a, hi_a, least_a, n_b, lo_b, hi_b, least_b):
    """draw's one reduction of the groups' figures: filled groups, smallest and largest maximum, smallest key."""
    return n_a + n_b, tl.minimum(lo_a, lo_b), tl.maximum(hi_a, hi_b), tl.minimum(least_a, least_b)


@triton.jit
def sample_row(LOGITS, V, temperature, top_k, top_p, greedy, seed, counter, stream_key, BLOCK: tl.constexpr):
    """One id from the logits LOGITS[:V] of one row (any float dtype, widened to float32 as loaded; its parameters
    as scalars). Also called by the code predictor's persistent kernel (synth/persistent.py), which rewrites LOGITS
    every codebook: hence the L2-only (".cg") load."""
    idx = tl.arange(0, BLOCK)
    valid = idx < V
    x = tl.load(LOGITS + idx, mask=valid, other=float("-inf"), cache_modifier=".cg").to(tl.float32)
    return draw(x, idx, valid, V, temperature, top_k, top_p, greedy, seed, counter, stream_key, BLOCK)


@triton.jit
def draw(x, idx, valid, V, temperature, top_k, top_p, greedy, seed, counter, stream_key, BLOCK: tl.constexpr):
    """sample_row's draw from a row's float32 logits x [BLOCK] (idx its ids, valid idx < V, -inf past V)."""
    GROUPS: tl.constexpr = 128 if BLOCK >= 2048 else BLOCK // 16
    PARTS: tl.constexpr = 8
    MAXI: tl.constexpr = 2147483647
    MINI: tl.constexpr = -2147483648
    NEG_INF: tl.constexpr = -2139095041                     # -inf's key
    scaled = x / tl.maximum(temperature, 1e-5)
    bits = scaled.to(tl.int32, bitcast=True)
    key = _flip(bits)
    # past V the smallest key: every bound below is above it (lo is a group maximum or the smallest key above
    # MINI), so no compare needs valid again
    key = tl.where(valid, key, MINI)                         # int32: the counts below compare PARTS x V of them

    k = top_k.to(tl.int64)
    k = tl.where(k <= 0, V, k)
    k = tl.minimum(tl.maximum(k, 1), V)
    # k-th largest key: the largest t with count(key >= t) >= k, searched over [lo, hi) in PARTS parts at
    # a time (one PARTS-way count a round instead of 32 halvings). The bracket starts at the smallest of
    # GROUPS group maxima (at least that many keys lie at or above it) and after each round shrinks to the
    # keys inside it: logits that take few distinct values (the predictor's are bf16) are then resolved in
    # about 3 rounds. A cut that holds exactly k keys already gives the survivors (the keys >= it are the k
    # largest), so the search stops there. The counts are most of a draw's work (PARTS compares a logit a
    # round): 8 parts drew faster than 16 and 32 at 1-256 rows (docs/benchmarks.md, "Kept: the draws' top-k
    # search in 8 parts, ..."). Only groups holding a finite key count: codebook 0's thousand banned ids (-inf)
    # would start the bracket at -inf's key, more rounds. Each reduction across the warps is a few barriers
    # of a latency-bound program: the groups' four figures (how many hold a finite key, the smallest and
    # largest of their maxima, the smallest key) are one.
    groups = tl.reshape(key, [GROUPS, BLOCK // GROUPS])
    gmax = tl.max(groups, axis=1)
    gmin = tl.min(tl.where(groups > MINI, groups, MAXI), axis=1)
    filled = gmax > NEG_INF
    nfilled, low, largest, least = tl.reduce((filled.to(tl.int32), tl.where(filled, gmax, MAXI), gmax, gmin), 0,
                                         _group_stats)
    # the search's bounds in int64 (hi may be 2^31); the smallest key only when k exceeds the filled groups
    lo = tl.where(k <= nfilled, low, least).to(tl.int64)
    hi = largest.to(tl.int64) + 1
    if k < V:
        part = tl.arange(0, PARTS).to(tl.int64)
        while hi - lo > 1:
            cut = lo + part * ((hi - lo + PARTS - 1) // PARTS)                    # cut[0] == lo
            cut32 = tl.minimum(cut, MAXI).to(tl.int32)                            # cuts >= hi are not used
            count = tl.sum((key[None, :] >= cut32[:, None]).to(tl.int32), axis=1)
            kept = (cut < hi) & (count >= k)
            new_lo = tl.max(tl.where(kept, cut, lo), axis=0)                      # counts fall with the cut
            exact = tl.min(tl.where(kept, count, V + 1), axis=0) == k             # the count at new_lo
            new_hi = tl.min(tl.where((cut > new_lo) & (cut < hi), cut, hi), axis=0)
            # not exact: count(>= new_lo) >= k > count(>= new_hi), so some key lies in [new_lo, new_hi)
            inside = (key >= new_lo) & (key < new_hi)
            first, last = tl.reduce((tl.where(inside, key, MAXI), tl.where(inside, key, MINI)), 0, _min_max)
            lo = tl.where(exact, new_lo, first.to(tl.int64))
            hi = tl.where(exact, new_lo + 1, last.to(tl.int64) + 1)
    survivor = key >= lo

    if top_p < 1.0:
        m = _flip(largest).to(tl.float32, bitcast=True)                            # the largest scaled logit
        e = tl.where(survivor, tl.exp(scaled - m), 0.0)
        prob = e / tl.sum(e, axis=0)
        # the smallest key t with mass(key > t) < top_p (at least the row's maximum: keep >= 1)
        plo = lo - 1
        phi = largest.to(tl.int64)
        if top_p > 0.0:
            while phi - plo > 1:
                mid = (plo + phi) >> 1
                ok = tl.sum(tl.where(key > mid, prob, 0.0), axis=0) < top_p
                plo = tl.where(ok, plo, mid)
                phi = tl.where(ok, mid, phi)
        survivor = survivor & (key >= phi)

    s = mix32(((seed >> 32) & 0xFFFFFFFF).to(tl.uint32) ^ 0x9E3779B9)
    s = mix32((seed & 0xFFFFFFFF).to(tl.uint32) ^ s)
    s = mix32(s ^ (counter & 0xFFFFFFFF).to(tl.uint32))
    s = mix32(s ^ tl.cast(stream_key, tl.uint32))
    h = mix32(s ^ mix32(idx.to(tl.uint32) + 0x632BE5AB))
    u = ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
    noisy = tl.where(survivor, scaled - tl.log(-tl.log(u)), float("-inf"))
    # greedy: the largest logit (before the temperature's rounding), in the same reduction as a draw's
    return tl.argmax(tl.where(greedy, x, noisy), axis=0).to(tl.int64)


@triton.jit
def sample_kernel(LOGITS, stride, SLOTS, TEMP, TOP_K, TOP_P, GREEDY, SEED, COUNTER, OUT, V, stream_key,
                  BLOCK: tl.constexpr, ROW_SLOTS: tl.constexpr):
    row = tl.program_id(0)
    # the parameters are the slots' (ROW_SLOTS: row's at SLOTS[row]): read where drawn, not gathered by kernels of
    # their own before (ten a codes graph)
    at = tl.load(SLOTS + row) if ROW_SLOTS else row
    tl.store(OUT + row, sample_row(LOGITS + row * stride, V, tl.load(TEMP + at), tl.load(TOP_K + at),
                                   tl.load(TOP_P + at), tl.load(GREEDY + at) != 0, tl.load(SEED + at),
                                   tl.load(COUNTER + row), stream_key, BLOCK))


@triton.jit
def codebook0_kernel(LOGITS, stride, SLOTS, SEEN, seen_stride, SUPPRESSED, ALLOW_EOS, eos, PENALTY, TEMP, TOP_K, TOP_P,
                     GREEDY, SEED, COUNTER, OUT, V, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    idx = tl.arange(0, BLOCK)
    valid = idx < V
    x = tl.load(LOGITS + row * stride + idx, mask=valid, other=float("-inf")).to(tl.float32)
    slot = tl.load(SLOTS + row)
    seen = SEEN + slot * seen_stride
    penalty = tl.load(PENALTY + slot)
    # as synth.sampling.apply_repetition_penalty, rounded as PyTorch rounds (div_rn: Triton's "/" is approximate)
    x = tl.where(tl.load(seen + idx, mask=valid, other=0) != 0,
                 tl.where(x < 0, x * penalty, tl.math.div_rn(x, penalty)), x)
    banned = (tl.load(SUPPRESSED + idx, mask=valid, other=1) != 0) | ((idx == eos) & (tl.load(ALLOW_EOS + row) == 0))
    x = tl.where(banned, float("-inf"), x)
    code = draw(x, idx, valid, V, tl.load(TEMP + slot), tl.load(TOP_K + slot), tl.load(TOP_P + slot),
                tl.load(GREEDY + slot) != 0, tl.load(SEED + slot), tl.load(COUNTER + row), 0, BLOCK)
    tl.store(OUT + row, code)
    tl.store(seen + code, tl.full([], 1, tl.uint8), mask=code != eos)


def codebook0(logits: torch.Tensor, slots: torch.Tensor, seen: torch.Tensor, suppressed: torch.Tensor, eos: int,
              allow_eos: torch.Tensor, penalty: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
              top_p: torch.Tensor, greedy: torch.Tensor, seed: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """Same contract as synth.sampling.FrameSampler.codebook0 (its slots' parameters as tensors [S], row b's at
    slots[b]; counter and allow_eos [B] a row's), one program a row: the repetition penalty, the bans and the draw of
    `sample` on the row's logits in registers, and the row's id marked in seen[slot] unless it is eos."""
    B, V = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    out = torch.empty(B, dtype=torch.int64, device=logits.device)
    codebook0_kernel[(B,)](logits, logits.stride(0), slots, seen.view(torch.uint8), seen.stride(0),
                           suppressed.view(torch.uint8), allow_eos.view(torch.uint8), eos, penalty, temperature, top_k,
                           top_p, greedy.view(torch.uint8), seed, counter, out, V, BLOCK=block(V), num_warps=8)
    return out


def block(V: int) -> int:
    """A row's block: the power of two that holds V logits."""
    return max(16, 1 << (V - 1).bit_length())


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           greedy: torch.Tensor, seed: torch.Tensor, counter: torch.Tensor, stream: int,
           slots: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as synth.sampling.sample: logits [B, V] of any float dtype (sample_row widens them)
    -> [B] int64."""
    B, V = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    out = torch.empty(B, dtype=torch.int64, device=logits.device)
    sample_kernel[(B,)](logits, logits.stride(0), slots if slots is not None else counter, temperature, top_k, top_p,
                        greedy.view(torch.uint8), seed, counter, out, V, (stream * 0x2545F491) & 0xFFFFFFFF,
                        BLOCK=block(V), ROW_SLOTS=slots is not None, num_warps=8)
    return out
