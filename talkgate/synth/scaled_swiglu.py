"""SwiGLU of a projection of a row not yet normed, as one Triton kernel: silu(gate * r) * (up * r), r = 1 / rms(x).

A one-token decoder layer on CUDA with its norms folded (synth/model.py run_layers_folded) multiplies the residual x
itself by gate/up weights that carry the post-attention norm's weight; the norm's other factor, x's 1/rms, is a
number a row, applied here where the gate/up output is read anyway. Without it a layer's post-attention norm is a
kernel of its own (with the residual add): at 256 rows about 2 us and a launch gap, 70 times a code predictor frame.
Each program recomputes r from x's row (a few KB), then a block of the row's gate/up columns, rounded as the
normed path rounds: the projection's output to the model dtype, then silu(gate) * up computed in float32.
Runs in Triton's interpreter on the CPU for tests (tests/gpu/test_folded_layers.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from talkgate.synth.attention import _scaled, row_inv_rms

# gate/up columns a program covers: at 256 rows the code predictor's 3,072 make 768 programs
BLOCK = 1024


@triton.jit
def scaled_swiglu_kernel(GU, sgu, X, sx, O, so, I, H, eps, HB: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    r = row_inv_rms(X + b * sx, H, eps, HB)
    DT: tl.constexpr = O.dtype.element_ty
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = j < I
    gate = _scaled(tl.load(GU + b * sgu + j, mask=keep, other=0.0).to(tl.float32), r, True, DT)
    up = _scaled(tl.load(GU + b * sgu + I + j, mask=keep, other=0.0).to(tl.float32), r, True, DT)
    tl.store(O + b * so + j, (gate * tl.sigmoid(gate) * up).to(DT), mask=keep)


def scaled_swiglu(gate_up: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
    """gate_up [B, 2 I] (gate columns, then up), x [B, H] -> [B, I]: silu(gate * r) * (up * r), r = rsqrt(mean(x^2) +
    eps) per row, in gate_up's dtype."""
    B, I = gate_up.shape[0], gate_up.shape[1] // 2
    H = x.shape[1]
    assert gate_up.stride(1) == 1 and x.stride(1) == 1
    out = torch.empty(B, I, device=gate_up.device, dtype=gate_up.dtype)
    if B:
        scaled_swiglu_kernel[(B, triton.cdiv(I, BLOCK))](gate_up, gate_up.stride(0), x, x.stride(0), out, out.stride(0),
                                                         I, H, eps, HB=triton.next_power_of_2(H), BLOCK=BLOCK,
                                                         num_warps=4)
    return out
