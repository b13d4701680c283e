"""The codec decoder's one-frame attention as one Triton kernel: RoPE, the ring write and attention.

The decoder's transformer (synth/codec_decoder.py) attends over a sliding window of 72 frames kept in a
per-slot key/value ring. At batch 1 its frame step is bound by the number of kernels, and the PyTorch path
spent about ten per layer between the q/k/v projection and o_proj (RoPE, the ring write, gathering the
rows' rings, SDPA, a transpose) plus about fifteen a step building RoPE tables and the mask. This kernel
reads the fused q/k/v projection's row of each frame and:
- rotates q and k (RoPE from the frame's position and inv_freq, angles in float32, rounded to the model
  dtype after each step as the PyTorch path does);
- writes k and v at ring entry position % window of the row's slot;
- attends over the ring entries that hold positions in (position - window, position], ring_block(rows)
  entries at a time (online softmax), reading only the row's own ring. The new frame enters from registers: its entry
  is not read back.
One program per (row, kv head) covers the head's query group. Runs in Triton's interpreter on the CPU for
tests (tests/gpu/test_window_attention.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from talkgate.synth.attention import _in_dtype, _softmax_step


@triton.jit
def _rope(X, d, rot, cos, sin, DT: tl.constexpr):
    """x * cos + rotate_half(x) * sin of the head vectors at X + d (sin carries rotate_half's sign),
    rounded to the model dtype after the product and after the sum, as the PyTorch path."""
    x = tl.load(X + d).to(tl.float32)
    xr = tl.load(X + rot).to(tl.float32)
    return _in_dtype(_in_dtype(x * cos, DT) + xr * sin, DT)


@triton.jit
def _ring_block(ring, first, pos, new, s_entry, s_kind, d, WINDOW: tl.constexpr, BLOCK: tl.constexpr):
    """Ring entries [first, first + BLOCK): keys and values [BLOCK, D] float32, and which of them count. Entry j holds
    the latest position <= pos congruent to j, one of the last WINDOW positions, and a position >= 0 only where
    j <= pos; the new frame's entry is not read (its k and v come from registers)."""
    j = first + tl.arange(0, BLOCK)
    valid = (j < WINDOW) & (j <= pos) & (j != new)
    off = ring + j[:, None] * s_entry + d[None, :]
    kb = tl.load(off, mask=valid[:, None], other=0.0).to(tl.float32)
    vb = tl.load(off + s_kind, mask=valid[:, None], other=0.0).to(tl.float32)
    return kb, vb, valid


@triton.jit
def window_attention_kernel(QKV, sqkv, POS, SLOTS, INV_FREQ, CACHE, s_slot, s_entry, s_kind, s_head, O, so, scale,
                            HQ: tl.constexpr, HKV: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
                            WINDOW: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    DT: tl.constexpr = CACHE.dtype.element_ty
    pos = tl.load(POS + b)
    new = pos % WINDOW
    ring = CACHE + tl.load(SLOTS + b).to(tl.int64) * s_slot + h * s_head
    d = tl.arange(0, D)
    # the ring's first block is loaded before the RoPE below, so that its latency overlaps it (at batch 1 the
    # kernel is a chain of dependent loads)
    kb, vb, valid = _ring_block(ring, 0, pos, new, s_entry, s_kind, d, WINDOW, BLOCK)
    rot = (d + D // 2) % D
    # compiled, tl.cos/tl.sin are libdevice's cosf/sinf (as torch's CUDA cos/sin), not the hardware
    # approximations, whose error grows with the angle (the PTX of Triton 3.6 and 3.9)
    angle = pos.to(tl.float32) * tl.load(INV_FREQ + d % (D // 2)).to(tl.float32)
    cos = _in_dtype(tl.cos(angle), DT)
    sin = _in_dtype(tl.sin(angle), DT)
    sin = tl.where(d < D // 2, -sin, sin)
    row = QKV + b * sqkv
    g = tl.arange(0, GROUP)
    q = _rope(row + (h * GROUP + g)[:, None] * D, d[None, :], rot[None, :], cos, sin, DT)   # [GROUP, D]
    k = _rope(row + (HQ + h) * D, d, rot, cos, sin, DT)                                   # [D]
    v = tl.load(row + (HQ + HKV + h) * D + d).to(tl.float32)
    tl.store(ring + new * s_entry + d, k.to(DT))
    tl.store(ring + new * s_entry + s_kind + d, v.to(DT))
    # the new frame starts the online softmax, then the ring joins it block by block
    m, l, acc = _softmax_step(q, kb, vb, valid, tl.sum(q * k[None, :], axis=1) * scale,
                              tl.full([GROUP], 1.0, tl.float32), tl.zeros([GROUP, D], tl.float32) + v[None, :], scale,
                              False)
    for first in range(BLOCK, WINDOW, BLOCK):
        kb, vb, valid = _ring_block(ring, first, pos, new, s_entry, s_kind, d, WINDOW, BLOCK)
        m, l, acc = _softmax_step(q, kb, vb, valid, m, l, acc, scale, False)
    out = acc / l[:, None]
    tl.store(O + b * so + (h * GROUP + g)[:, None] * D + d[None, :], out.to(O.dtype.element_ty))


# One warp a program, the ring in blocks of 16 entries, of 8 from 256 rows. On an H200 (bench/attention_configs.py, 16
# heads of 64, float16) 16 entries took 32 us at 256 rows against 144 with the whole ring as one block on 8 warps;
# wider blocks or more warps were slower at every size. On an H100 16 entries take 6.9-15.3 us at 1-128 rows against
# 8 entries' 7.3-16.2, but 35.4 against 31.1 at 256 rows and 66.6 against 58.0 at 512: 8 entries hold 53 registers a
# thread (32 programs an SM, 256 rows' 4,096 programs in one wave), 16 entries 119 (17 an SM, 1.83 waves)
def ring_block(rows: int) -> int:
    """Ring entries a block for a launch of this many rows (a captured graph's rows: chosen once per graph)."""
    return 8 if rows >= 256 else 16


def window_attention(qkv: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, cache: torch.Tensor,
                     inv_freq: torch.Tensor, heads: int) -> torch.Tensor:
    """qkv [B, (heads + 2 kv_heads) * D]: the fused projection of one frame per row; pos [B] long its
    position; slots [B] its ring in cache [num_slots, window, 2, kv_heads, D] (RoPE'd keys, values);
    inv_freq [D / 2] -> [B, heads * D], ready for o_proj. Writes the frame's k and v into the ring (rows
    sharing a slot, such as padding rows, leave it garbage)."""
    B = qkv.shape[0]
    window, kv_heads, D = cache.shape[1], cache.shape[3], cache.shape[4]
    assert qkv.stride(1) == 1 and cache.stride(4) == 1
    out = torch.empty(B, heads * D, device=qkv.device, dtype=qkv.dtype)
    window_attention_kernel[(B, kv_heads)](
        qkv, qkv.stride(0), pos, slots, inv_freq, cache, cache.stride(0), cache.stride(1), cache.stride(2),
        cache.stride(3), out, out.stride(0), D ** -0.5, HQ=heads, HKV=kv_heads, GROUP=heads // kv_heads, D=D,
        WINDOW=window, BLOCK=ring_block(B), num_warps=1)
    return out
