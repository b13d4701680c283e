"""Rows written into chosen rows of a pool, as one Triton kernel: pool[rows[i]] = src[i].

The codec decoder's step writes its convs' new carried frames back to the slots' state (CodecDecoder.decode_step,
one column span of the state per compiled part). torch's index_copy_ does it element by element through strided
index arithmetic: at 256 rows the 1.7B decoder's write-back (113 MB read and written) took 114 us on an H100 (about
1 TB/s; the gather of the same rows at the step's start 36 us). Here each program copies BLOCK contiguous values of
one row, in 16-byte accesses where the pool's row stride and the span's start allow (Triton specializes on their
alignment): 48 us (docs/benchmarks.md "Kept: the decoder state's write-back as a row copy"). Runs in Triton's
interpreter on the CPU for tests (tests/gpu/test_row_copy.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# Values a program copies: 2,048 half-precision values on 4 warps are two 16-byte accesses a thread
BLOCK = 2048


@triton.jit
def copy_rows_kernel(POOL, pool_stride, ROWS, SRC, src_stride, n, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(ROWS + i)
    keep = c < n
    tl.store(POOL + row * pool_stride + c, tl.load(SRC + i * src_stride + c, mask=keep), mask=keep)


def copy_rows(pool: torch.Tensor, rows: torch.Tensor, src: torch.Tensor):
    """pool [N, n] (unit column stride: a column span of a larger pool, say), rows [B] long, src [B, n] of pool's
    dtype: pool[rows[i]] = src[i]. Rows repeated in `rows` (padding rows sharing a scratch row) leave that row
    garbage, as index_copy_ does."""
    B, n = src.shape
    assert pool.shape[1] == n and pool.stride(1) == 1 and src.stride(1) == 1 and pool.dtype == src.dtype
    if B and n:
        copy_rows_kernel[(B, triton.cdiv(n, BLOCK))](pool, pool.stride(0), rows, src, src.stride(0), n, BLOCK=BLOCK,
                                                     num_warps=4)
