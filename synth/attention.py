"""Decode attention over the slot-indexed KV cache, without gathering whole per-slot caches.

A one-token Talker step for B contexts needs, per row b, attention over positions [0, lens[b]) of
cache slot slots[b]. Gathering `cache[slots]` copies every row's whole slot (max_len positions) every
layer: at 256 contexts that gather was the largest kernel of the step (measured in bench/engine.py).
This Triton kernel reads only each row's live positions, one program per (row, kv head) covering the
head's query group. CUDA only; prefill (T > 1) and CPU keep the SDPA path in model.py.
"""
from __future__ import annotations

import functools

import torch


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def decode_attention_kernel(Q, K, V, O, SLOTS, LENS, sqb, sqh, sks, skh, skl, sob, soh, scale,
                                GROUP: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
        b = tl.program_id(0)
        h = tl.program_id(1)
        slot = tl.load(SLOTS + b).to(tl.int64)
        n = tl.load(LENS + b).to(tl.int32)
        g = tl.arange(0, GROUP)
        d = tl.arange(0, D)
        q = tl.load(Q + b * sqb + (h * GROUP + g)[:, None] * sqh + d[None, :]).to(tl.float32)
        m = tl.full([GROUP], float("-inf"), tl.float32)
        l = tl.zeros([GROUP], tl.float32)
        acc = tl.zeros([GROUP, D], tl.float32)
        base = slot * sks + h * skh
        for start in range(0, n, BLOCK):          # online softmax over the row's live positions
            pos = start + tl.arange(0, BLOCK)
            valid = pos < n
            off = base + pos[:, None].to(tl.int64) * skl + d[None, :]
            k = tl.load(K + off, mask=valid[:, None], other=0.0).to(tl.float32)
            v = tl.load(V + off, mask=valid[:, None], other=0.0).to(tl.float32)
            s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            l = l * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
            m = m_new
        tl.store(O + b * sob + (h * GROUP + g)[:, None] * soh + d[None, :], (acc / l[:, None]).to(O.dtype.element_ty))

    return decode_attention_kernel


def available(x: torch.Tensor) -> bool:
    if not x.is_cuda:
        return False
    try:
        _kernel()
    except ImportError:
        return False
    return True


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                     lens: torch.Tensor, block: int = 32) -> torch.Tensor:
    """q [B,heads,D], k/v cache [slots,kv_heads,L,D], slots [B], lens [B] -> [B,heads,D]."""
    B, H, D = q.shape
    kv_heads = k_cache.shape[1]
    out = torch.empty_like(q)
    _kernel()[(B, kv_heads)](q, k_cache, v_cache, out, slots, lens, q.stride(0), q.stride(1),
                             k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), out.stride(0),
                             out.stride(1), D ** -0.5, GROUP=H // kv_heads, D=D, BLOCK=block)
    return out
