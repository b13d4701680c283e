"""The codec decoder's one-frame attention as one Triton kernel: RoPE, the ring write and attention.

The decoder's transformer (synth/codec_decoder.py) attends over a sliding window of 72 frames kept in a
per-slot key/value ring. At batch 1 its frame step is bound by the number of kernels, and the PyTorch path
spent about ten per layer between the q/k/v projection and o_proj (RoPE, the ring write, gathering the
rows' rings, SDPA, a transpose) plus about fifteen a step building RoPE tables and the mask. This kernel
reads the fused q/k/v projection's row of each frame and:
- rotates q and k (RoPE from the frame's position and inv_freq, angles in float32, rounded to the model
  dtype after each step as the PyTorch path does);
- writes k and v at ring entry position % window of the row's slot;
- attends over the ring entries that hold positions in (position - window, position], the whole ring
  loaded as one block, reading only the row's own ring. The new frame enters from registers: its entry
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
    # The whole ring in one block: entry j holds the latest position <= pos congruent to j, one of the
    # last WINDOW positions, and a position >= 0 only where j <= pos. Loaded first, so that its latency
    # overlaps the RoPE below (at batch 1 the kernel is a chain of dependent loads). The new frame's
    # entry is not read: its k and v come from registers.
    j = tl.arange(0, BLOCK)
    valid = (j < WINDOW) & (j <= pos) & (j != new)
    off = ring + j[:, None] * s_entry + d[None, :]
    kb = tl.load(off, mask=valid[:, None], other=0.0).to(tl.float32)                      # [BLOCK, D]
    vb = tl.load(off + s_kind, mask=valid[:, None], other=0.0).to(tl.float32)
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
    # the new frame starts the online softmax, then the ring's block joins it
    _, l, acc = _softmax_step(q, kb, vb, valid, tl.sum(q * k[None, :], axis=1) * scale,
                              tl.full([GROUP], 1.0, tl.float32), tl.zeros([GROUP, D], tl.float32) + v[None, :], scale)
    out = acc / l[:, None]
    tl.store(O + b * so + (h * GROUP + g)[:, None] * D + d[None, :], out.to(O.dtype.element_ty))


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
    # 8 warps: 32 values a thread of a [128, 64] block (72 entries of 64 dims), as synth/attention.py's
    # measured [32, 128] blocks on 4 warps; not timed for this kernel
    window_attention_kernel[(B, kv_heads)](
        qkv, qkv.stride(0), pos, slots, inv_freq, cache, cache.stride(0), cache.stride(1), cache.stride(2),
        cache.stride(3), out, out.stride(0), D ** -0.5, HQ=heads, HKV=kv_heads, GROUP=heads // kv_heads, D=D,
        WINDOW=window, BLOCK=triton.next_power_of_2(window), num_warps=8)
    return out
