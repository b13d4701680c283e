"""The codec decoder's residual units as two Triton kernels: causal convolutions as matrix multiplies with the
SnakeBeta after the first and the residual add after the second fused into them.

A residual unit (synth/codec_decoder.py) is x + conv2(snake2(conv1(snake1(x)))): conv1 a causal kernel-7 dilated
convolution whose first input frames are the slot's carried tail, conv2 a 1x1 convolution. Nearly all of the
decoder's multiply-adds are in its 12 units (4.0 of 4.4 GFLOP a frame), and at large batch the decoder is most of
a step (68% of the 1.7B step at 256 rows, docs/engine.md "Roofline"), run by cuDNN around separate elementwise
passes over activations of up to [rows, 96, 1920] (the tail prepended by a copy of the whole input, the two
SnakeBetas, the add). Here a unit is:

    a1 = snake1(x)                                   PyTorch (compiled with the tail update: one pass)
    a2 = snake2(conv1(tail ++ a1) + b1)              causal_conv(..., snake=...): SnakeBeta in the epilogue
    y  = x + conv2(a2) + b2                          causal_conv(..., residual=x): the add in the epilogue

Each is one multiply per row: out[co, t] = bias[co] + sum over taps k and input channels ci of
W[k, co, ci] * in[ci, t + k * dilation - context], on tiles of BM output channels by BN times, BK input channels a
step, float32 accumulators; the tap's input tile comes from the row's input where its time is >= 0, else from the
tail (both read in place: nothing is concatenated). Inputs and outputs in the decoder's dtype; float32 inputs
multiply in TF32 where torch.backends.cudnn.allow_tf32 (as cuDNN runs the reference's Conv1d), else exactly. Runs
in Triton's interpreter on CPU tensors for tests (tests/gpu/test_conv_kernel.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def causal_conv_kernel(X, sxb, sxc, TAIL, stb, stc, W, BIAS, FREQ, INV_BETA, RES, srb, src, Y, syb, syc, T, CIN, COUT,
                       KSIZE: tl.constexpr, DIL: tl.constexpr, CTX: tl.constexpr, SNAKE: tl.constexpr,
                       RESIDUAL: tl.constexpr, PRECISION: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                       BK: tl.constexpr):
    tiles = tl.cdiv(T, BN)
    b = (tl.program_id(0) // tiles).to(tl.int64)
    t = (tl.program_id(0) % tiles) * BN + tl.arange(0, BN)
    co = tl.program_id(1) * BM + tl.arange(0, BM)
    kk = tl.arange(0, BK)
    in_t = t < T
    co_in = co < COUT
    x_row = X + b * sxb
    tail_row = TAIL + b * stb
    acc = tl.zeros([BM, BN], tl.float32)
    blocks = tl.cdiv(CIN, BK)
    # one loop over (tap, block of input channels): a loop per tap made the kernel minutes to compile
    for i in range(KSIZE * blocks):
        k = i // blocks
        ci = (i % blocks) * BK + kk
        ci_in = ci < CIN
        p = t + (k * DIL - CTX)                          # the input time tap k reads (< 0: in the tail)
        w = tl.load(W + (k * COUT + co[:, None]) * CIN + ci[None, :], mask=co_in[:, None] & ci_in[None, :], other=0.0)
        a = tl.load(x_row + ci[:, None] * sxc + p[None, :], mask=ci_in[:, None] & (in_t & (p >= 0))[None, :],
                    other=0.0)
        if CTX > 0:
            a += tl.load(tail_row + ci[:, None] * stc + (p + CTX)[None, :],
                         mask=ci_in[:, None] & (in_t & (p < 0))[None, :], other=0.0)
        acc = tl.dot(w, a, acc, input_precision=PRECISION)
    acc += tl.load(BIAS + co, mask=co_in, other=0.0).to(tl.float32)[:, None]
    if SNAKE:
        freq = tl.load(FREQ + co, mask=co_in, other=0.0).to(tl.float32)[:, None]
        inv_beta = tl.load(INV_BETA + co, mask=co_in, other=0.0).to(tl.float32)[:, None]
        s = tl.sin(acc * freq)
        acc += inv_beta * s * s
    out = co_in[:, None] & in_t[None, :]
    if RESIDUAL:
        acc += tl.load(RES + b * srb + co[:, None] * src + t[None, :], mask=out, other=0.0).to(tl.float32)
    tl.store(Y + b * syb + co[:, None] * syc + t[None, :], acc.to(Y.dtype.element_ty), mask=out)


def tiles(cin: int, cout: int, K: int, T: int) -> dict:
    """The launch's tile sizes and warps for a convolution of these sizes: the fastest of 8 configurations at the
    released decoder's unit shapes, 256 rows, float16, on an H200 (bench/conv_tiles.py, docs/benchmarks.md)."""
    return dict(BM=128, BN=64, BK=32 if K > 1 or cin % 64 else 64, num_warps=4, num_stages=3)


def causal_conv(x: torch.Tensor, tail: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor, dilation: int,
                freq: torch.Tensor | None = None, inv_beta: torch.Tensor | None = None,
                residual: torch.Tensor | None = None) -> torch.Tensor:
    """x [B, C_in, T] (time contiguous); tail [B, C_in, context] the input frames before x (a view into the
    carried state is fine), context = (K - 1) * dilation, None when K == 1; weight [K, C_out, C_in] contiguous;
    bias [C_out] -> [B, C_out, T]: conv + bias, then SnakeBeta (x + inv_beta * sin(x * freq)^2, per channel)
    where freq and inv_beta are given, plus `residual` [B, C_out, T] where given."""
    B, cin, T = x.shape
    K, cout, _ = weight.shape
    ctx = (K - 1) * dilation
    assert x.stride(2) == 1 and weight.is_contiguous() and (tail is not None) == (ctx > 0)
    assert tail is None or (tail.shape == (B, cin, ctx) and tail.stride(2) == 1)
    assert residual is None or (residual.shape == (B, cout, T) and residual.stride(2) == 1)
    y = torch.empty(B, cout, T, device=x.device, dtype=x.dtype)
    precision = "tf32" if x.dtype == torch.float32 and torch.backends.cudnn.allow_tf32 and x.is_cuda else "ieee"
    snake = freq is not None
    t = tail if tail is not None else x
    r = residual if residual is not None else y
    cfg = tiles(cin, cout, K, T)
    grid = (B * triton.cdiv(T, cfg["BN"]), triton.cdiv(cout, cfg["BM"]))
    causal_conv_kernel[grid](
        x, x.stride(0), x.stride(1), t, t.stride(0), t.stride(1), weight, bias,
        freq if snake else bias, inv_beta if snake else bias, r, r.stride(0), r.stride(1), y, y.stride(0),
        y.stride(1), T, cin, cout, KSIZE=K, DIL=dilation, CTX=ctx, SNAKE=snake, RESIDUAL=residual is not None,
        PRECISION=precision, **cfg)
    return y
