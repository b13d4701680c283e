"""One-token attention as one Triton kernel: q/k RMSNorm, RoPE, the cache write and attention.

A one-token step (the Talker's frame step, each of the code predictor's 14 one-token steps) used to
be five or six kernels per layer around the q/k/v projection: q norm and k norm with RoPE, two cache
writes, attention, a transpose. At batch 1 a frame runs 103 such layers and the step is bound by the
number of kernels, not by their work (bench/engine.py profile), so this kernel does it all, reading
the fused q/k/v projection's output row:
- normalizes q and k per head (RMSNorm in float32, weight applied in the model dtype, as the
  reference) and rotates them (RoPE with the caller's cos/sin, in the model dtype); where the projection is of rows
  not yet normed (synth/model.py run_layers_folded), it first scales q, k and v by each row's 1/rms;
- writes k and v at (slot, position) of the cache [slots, kv_heads, L, D], or of the pages [pages, kv_heads, page_len,
  D] through the slot's row of a page table (the Talker's KV: synth/model.py Talker.setup_cache);
- attends over the row's cached positions [0, position) plus the new one (online softmax), reading
  only those positions: gathering whole per-slot caches was the largest kernel at 256 contexts.
One program per (row, kv head) covers the head's query group. The code predictor's first pass (two positions of fresh
caches) launches it once a position, in order (synth/model.py Attention.new_positions). Runs in Triton's interpreter
on the CPU for tests (tests/gpu/test_attention.py); the model keeps its PyTorch path on the CPU and for prefill.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _in_dtype(x, DT: tl.constexpr):
    """Round float32 to the model dtype and back (the reference computes these steps in it)."""
    return x.to(DT).to(tl.float32)


@triton.jit
def row_inv_rms(X, H, eps, HB: tl.constexpr):
    """rsqrt(mean(x^2) + eps) of the row of H values at X (HB: H or the power of two above it), in float32: the factor
    a norm of the row applies before its weight."""
    c = tl.arange(0, HB)
    x = tl.load(X + c, mask=c < H, other=0.0).to(tl.float32)
    return tl.rsqrt(tl.sum(x * x, axis=0) / H + eps)


@triton.jit
def _scaled(x, r, SCALED: tl.constexpr, DT: tl.constexpr):
    """A projection of a row not yet normed (its norm's weight folded into the projection: synth/model.py fold_norms)
    times the row's 1/rms r, rounded to the model dtype as the normed row's projection is; x itself unless SCALED."""
    if SCALED:
        x = _in_dtype(x * r, DT)
    return x


@triton.jit
def _norm_rope(X, rows, d, rot, sign, cos, sin, W, eps, r, SCALED: tl.constexpr, D: tl.constexpr, DT: tl.constexpr):
    """Per-head RMSNorm then RoPE of the head vectors at X + rows[:, None] * D + d: [R, D] float32. SCALED: X is the
    projection of a row not yet normed, r its 1/rms (_scaled)."""
    x = _scaled(tl.load(X + rows[:, None] * D + d[None, :], cache_modifier=".cg").to(tl.float32), r, SCALED, DT)
    xr = _scaled(tl.load(X + rows[:, None] * D + rot[None, :], cache_modifier=".cg").to(tl.float32), r, SCALED, DT)
    inv = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)[:, None]
    w = tl.load(W + d).to(tl.float32)[None, :]
    wr = tl.load(W + rot).to(tl.float32)[None, :]
    n = _in_dtype(_in_dtype(x * inv, DT) * w, DT)
    nr = _in_dtype(_in_dtype(xr * inv, DT) * wr, DT)
    return _in_dtype(_in_dtype(n * cos, DT) + _in_dtype(sign * nr * sin, DT), DT)


@triton.jit
def _row(x, g, i):
    """Row i of x [G, N] -> [N] (a masked sum: Triton has no row index)."""
    return tl.sum(tl.where(g[:, None] == i, x, 0.0), axis=0)


@triton.jit
def _softmax_step(q, kb, vb, valid, m, l, acc, scale, ONE_QUERY: tl.constexpr):
    """One block of keys kb and values vb [BLOCK, D] (cache dtype, `valid` positions) into the online softmax of the
    query group q [GROUP, D] float32: the group's scores as one [GROUP, BLOCK, D] product, or with ONE_QUERY one query
    at a time ([BLOCK, D] products, fewer registers a program; keys and values widened where multiplied)."""
    GROUP: tl.constexpr = q.shape[0]
    BLOCK: tl.constexpr = kb.shape[0]
    g = tl.arange(0, GROUP)
    if ONE_QUERY:
        s = tl.zeros([GROUP, BLOCK], tl.float32)
        for i in tl.static_range(GROUP):
            si = tl.sum(_row(q, g, i)[None, :] * kb.to(tl.float32), axis=1) * scale
            s = tl.where(g[:, None] == i, si[None, :], s)
    else:
        s = tl.sum(q[:, None, :] * kb.to(tl.float32)[None, :, :], axis=2) * scale
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None]
    if ONE_QUERY:
        for i in tl.static_range(GROUP):
            acc = acc + tl.where(g[:, None] == i, tl.sum(_row(p, g, i)[:, None] * vb.to(tl.float32), axis=0)[None, :],
                                 0.0)
    else:
        acc = acc + tl.sum(p[:, :, None] * vb.to(tl.float32)[None, :, :], axis=1)
    return m_new, l, acc


@triton.jit
def _at(TAB, sps, base, skl, pos, valid, PAGE: tl.constexpr):
    """The cache offset of positions `pos` (int64): base + pos * skl, or with pages (PAGE > 0: positions a page)
    base + TAB[pos // PAGE] * sps + (pos % PAGE) * skl, TAB the slot's row of the page table."""
    if PAGE > 0:
        page = tl.load(TAB + pos // PAGE, mask=valid, other=0)
        return base + page.to(tl.int64) * sps + (pos % PAGE).to(tl.int64) * skl
    return base + pos.to(tl.int64) * skl


@triton.jit
def _load_block(K, V, TAB, sps, base, skl, first, stop, d, BLOCK: tl.constexpr, PAGE: tl.constexpr):
    """Cached keys and values of positions [first, first + BLOCK) below stop ([BLOCK, D], cache dtype), and
    which of them are valid."""
    pos = first + tl.arange(0, BLOCK)
    valid = pos < stop
    off = _at(TAB, sps, base, skl, pos, valid, PAGE)[:, None] + d[None, :]
    return tl.load(K + off, mask=valid[:, None], other=0.0), tl.load(V + off, mask=valid[:, None], other=0.0), valid


@triton.jit
def attend_range(ROW, QW, KW, eps, COS, SIN, K, V, TAB, sps, base, skl, n, start, stop, new, scale, h, r,
                 HQ: tl.constexpr, HKV: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                 PAGE: tl.constexpr, ONE_QUERY: tl.constexpr, SCALED: tl.constexpr):
    """Kv head h of one token at position n, over cache positions [start, stop) and, when `new`, the token
    itself (its k/v written to the cache at n): ROW its fused q/k/v, COS/SIN its RoPE row [D] float32, base
    the cache offset of (slot, head h), or with pages (PAGE > 0) of head h in page 0, TAB the slot's row of the page
    table and sps a page's stride (_at), SCALED: ROW the projection of a row not yet normed, r its 1/rms (_scaled).
    -> the online softmax's state: max m [GROUP], sum l [GROUP] and
    weighted values acc [GROUP, D] (output = acc / l). Also called by synth/persistent.py's kernels, where
    ROW is rewritten every layer: hence the L2-only (".cg") loads of it. The first block of cached K/V
    (written by earlier steps, never by this one) is loaded before the q/k norm and RoPE, so its memory
    latency overlaps theirs: at batch 1 this phase is a chain of dependent loads, not bandwidth."""
    DT: tl.constexpr = K.dtype.element_ty
    d = tl.arange(0, D)
    kb0, vb0, valid0 = _load_block(K, V, TAB, sps, base, skl, start, stop, d, BLOCK, PAGE)
    rot = (d + D // 2) % D                                   # rotate_half: (-x2, x1)
    sign = tl.where(d < D // 2, -1.0, 1.0)[None, :]
    cos = _in_dtype(tl.load(COS + d).to(tl.float32), DT)[None, :]
    sin = _in_dtype(tl.load(SIN + d).to(tl.float32), DT)[None, :]
    g = tl.arange(0, GROUP)
    q = _norm_rope(ROW, h * GROUP + g, d, rot, sign, cos, sin, QW, eps, r, SCALED, D, DT)                  # [GROUP, D]
    if new:
        one = tl.arange(0, 1)
        k = _norm_rope(ROW, HQ + h + one, d, rot, sign, cos, sin, KW, eps, r, SCALED, D, DT)               # [1, D]
        v = _scaled(tl.load(ROW + (HQ + HKV + h + one)[:, None] * D + d[None, :], cache_modifier=".cg").to(tl.float32),
                    r, SCALED, DT)
        at = _at(TAB, sps, base, skl, tl.cast(n, tl.int64) + one, one == 0, PAGE)[:, None] + d[None, :]
        tl.store(K + at, k.to(DT))
        tl.store(V + at, v.to(DT))
        m = tl.sum(q * k, axis=1) * scale                    # the new position starts the softmax
        l = tl.full([GROUP], 1.0, tl.float32)
        acc = tl.zeros([GROUP, D], tl.float32) + v
    else:
        m = tl.full([GROUP], float("-inf"), tl.float32)
        l = tl.zeros([GROUP], tl.float32)
        acc = tl.zeros([GROUP, D], tl.float32)
    # an empty range adds nothing: only a range with the token (m finite) can be empty
    m, l, acc = _softmax_step(q, kb0, vb0, valid0, m, l, acc, scale, ONE_QUERY)
    for first in range(start + BLOCK, stop, BLOCK):          # the other cached positions
        kb, vb, valid = _load_block(K, V, TAB, sps, base, skl, first, stop, d, BLOCK, PAGE)
        m, l, acc = _softmax_step(q, kb, vb, valid, m, l, acc, scale, ONE_QUERY)
    return m, l, acc


@triton.jit
def attend_one_token(ROW, QW, KW, eps, COS, SIN, K, V, TAB, sps, base, skl, n, O, scale, h, r, HQ: tl.constexpr,
                     HKV: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr, PAGE: tl.constexpr,
                     ONE_QUERY: tl.constexpr, SCALED: tl.constexpr):
    """attend_range over all of [0, n) and the token; its output row O [HQ * D] (kv head h's query group)."""
    m, l, acc = attend_range(ROW, QW, KW, eps, COS, SIN, K, V, TAB, sps, base, skl, n, 0, n, True, scale, h, r, HQ,
                             HKV, GROUP, D, BLOCK, PAGE, ONE_QUERY, SCALED)
    g = tl.arange(0, GROUP)
    d = tl.arange(0, D)
    tl.store(O + (h * GROUP + g)[:, None] * D + d[None, :], (acc / l[:, None]).to(O.dtype.element_ty))


@triton.jit(do_not_specialize=["pos_all"])
def one_token_attention_kernel(QKV, sqkv, QW, KW, COS, SIN, scs, K, V, sks, skh, skl, SLOTS, POS, O, so,
                               pos_all, TABLE, stab, eps, scale, X, sx, H, x_eps, HQ: tl.constexpr, HKV: tl.constexpr,
                               GROUP: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr, ROW_SLOTS: tl.constexpr,
                               ROW_POS: tl.constexpr, PAGE: tl.constexpr, ONE_QUERY: tl.constexpr, HB: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    if HB > 0:                                # QKV projects x's rows before their norm: r = x's 1/rms
        r = row_inv_rms(X + b.to(tl.int64) * sx, H, x_eps, HB)
    else:
        r = 1.0
    if ROW_SLOTS:
        slot = tl.load(SLOTS + b).to(tl.int64)
    else:
        slot = b.to(tl.int64)
    if ROW_POS:
        n = tl.load(POS + b).to(tl.int32)
    else:
        n = pos_all
    if PAGE > 0:                              # the slot's row of the page table; sks: a page's stride
        tab, base = TABLE + slot * stab, h * skh
    else:
        tab, base = TABLE, slot * sks + h * skh
    attend_one_token(QKV + b * sqkv, QW, KW, eps, COS + b * scs, SIN + b * scs, K, V, tab, sks, base, skl, n,
                     O + b * so, scale, h, r, HQ, HKV, GROUP, D, BLOCK, PAGE, ONE_QUERY, HB > 0)


def one_token_attention(qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, eps: float,
                        cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        slots: torch.Tensor | None, pos: torch.Tensor | int, heads: int,
                        table: torch.Tensor | None = None, x: torch.Tensor | None = None, x_eps: float = 0.0,
                        out: torch.Tensor | None = None) -> torch.Tensor:
    """qkv [B, (heads + 2 kv_heads) * D] (the fused projection of one token per row), q_norm/k_norm [D]
    weights, cos/sin [B, D] or [D] float32, caches [S, kv_heads, L, D], or with a page table [S, slot pages] pages
    [pages, kv_heads, page_len, D]; slots [B] (None: row b uses cache row b), pos [B] or one int for every row (the
    new token's position) -> [B, heads * D]. x [B, H]: qkv projects these rows before their norm, its weight carrying
    the norm's (synth/model.py fold_norms); q, k and v are then scaled by each row's rsqrt(mean(x^2) + x_eps).
    out: where to write (rows of unit column stride), else a new tensor."""
    B = qkv.shape[0]
    kv_heads, D = k_cache.shape[1], k_cache.shape[3]
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    assert x is None or x.stride(1) == 1          # the kernel reads x's row as H contiguous values
    rows, srows, H = (x, x.stride(0), x.shape[1]) if x is not None else (qkv, 0, 0)   # H 0: no rows to scale by
    if out is None:
        out = torch.empty(B, heads * D, device=qkv.device, dtype=qkv.dtype)
    assert out.stride(1) == 1
    row_pos = isinstance(pos, torch.Tensor)
    # measured in CUDA graphs on an H100 (docs/experiments/README.md, kernels.py): few rows, long caches want 4
    # warps and 32-position blocks; many rows (the GPU is full anyway) and short caches one warp and 16 positions
    page = k_cache.shape[2] if table is not None else 0
    wide = B <= 16 and (table is not None or k_cache.shape[2] > 16)
    block, warps = (32, 4) if wide else (16, 1)
    # the code predictor's 16-position caches (no pages) read faster one query at a time, at every batch: 8.5 -> 5.9 us
    # at 256 rows on an H100; the Talker's long paged ones did not (48.0 -> 54.7 us at 256 rows, position 109;
    # bench/attention_variants.py, docs/benchmarks.md "The one-token attention one query at a time")
    one_query = table is None
    one_token_attention_kernel[(B, kv_heads)](
        qkv, qkv.stride(0), q_norm, k_norm, cos, sin, cos.stride(0) if cos.dim() == 2 else 0,
        k_cache, v_cache, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        slots if slots is not None else qkv, pos if row_pos else qkv, out, out.stride(0),
        0 if row_pos else int(pos), table if table is not None else qkv, table.stride(0) if table is not None else 0,
        eps, D ** -0.5, rows, srows, H, x_eps, HQ=heads, HKV=kv_heads, GROUP=heads // kv_heads, D=D,
        BLOCK=block, ROW_SLOTS=slots is not None, ROW_POS=row_pos, PAGE=page, ONE_QUERY=one_query,
        HB=triton.next_power_of_2(H) if H else 0, num_warps=warps)
    return out
