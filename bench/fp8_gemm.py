"""Per-projection time, bf16 against fp8 (e4m3 weights with a scale per output row, activations quantized per row
at run time), at the Talker's and code predictor's shapes: is --quantization fp8 worth building? (issue 44)

    python3 -m bench.fp8_gemm [--rows 1,8,64,256,512,1024]

Each figure: a CUDA graph of 20 back-to-back calls (bench/attention_configs.py timed), replayed; us a call = median
replay / 20. 'fp8' includes the activation's quantization (compiled: amax, scale, cast); 'fp8 mm' is the multiply
alone (quantization fused away); 'per-tensor' the multiply with one scale for each operand (cuBLAS's other fp8 path).
"""
from __future__ import annotations

import argparse
import torch
import torch.nn.functional as F

from bench.attention_configs import timed

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max

SHAPES = {   # name: (K in, N out)
    "talker-1.7B qkv": (2048, 4096), "talker-1.7B o": (2048, 2048), "talker-1.7B gate_up": (2048, 12288),
    "talker-1.7B down": (6144, 2048),
    "talker-0.6B qkv": (1024, 4096), "talker-0.6B o": (2048, 1024), "talker-0.6B gate_up": (1024, 6144),
    "talker-0.6B down": (3072, 1024),
    "predictor qkv": (1024, 4096), "predictor o": (2048, 1024), "predictor gate_up": (1024, 6144),
    "predictor down": (3072, 1024), "predictor head": (1024, 2048),
}


def quantize_rows(x: torch.Tensor):
    scale = x.abs().amax(-1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
    return (x.float() / scale).to(FP8), scale


def fp8_linear(x, w8, w_scale):
    xq, xs = quantize_rows(x)
    return torch._scaled_mm(xq, w8.t(), scale_a=xs, scale_b=w_scale, out_dtype=torch.bfloat16)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="1,8,64,256,512,1024")
    args = p.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    compiled = torch.compile(fp8_linear, dynamic=False)
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    print("| shape | rows | bf16 us | fp8 us | fp8 mm us | fp8 mm per-tensor us | fp8/bf16 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    totals: dict[tuple[str, int], list[float]] = {}
    for name, (k, n) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        w_scale = w.abs().amax(-1, keepdim=True).float().t().contiguous() / FP8_MAX      # [1, N]
        w8 = (w.float() / w_scale.t()).to(FP8)
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            xq, xs = quantize_rows(x)
            t_bf = timed(lambda: F.linear(x, w))
            t_8 = timed(lambda: compiled(x, w8, w_scale))
            t_mm = timed(lambda: torch._scaled_mm(xq, w8.t(), scale_a=xs, scale_b=w_scale, out_dtype=torch.bfloat16))
            one = torch.ones((), device="cuda")
            t_tw = timed(lambda: torch._scaled_mm(xq, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
            part = name.split()[0]
            acc = totals.setdefault((part, m), [0.0, 0.0, 0.0, 0.0])
            acc[0] += t_bf; acc[1] += t_8; acc[2] += t_mm; acc[3] += t_tw
            print(f"| {name} | {m} | {t_bf :.1f} | {t_8 :.1f} | {t_mm :.1f} | {t_tw :.1f} | {t_8 / t_bf:.2f} |")
        ref = F.linear(x, w).float()
        got = compiled(x, w8, w_scale).float()
        snr = 10 * torch.log10(ref.pow(2).mean() / (got - ref).pow(2).mean()).item()
        print(f"|   {name} output SNR fp8 vs bf16 | | | | {snr:.1f} dB | |")
    print("\nsum over a layer's projections (us):")
    for (part, m), (a, b, c, d) in totals.items():
        print(f"  {part} rows {m}: bf16 {a :.1f}  fp8 {b :.1f}  fp8 mm {c :.1f}  per-tensor {d :.1f}")


if __name__ == "__main__":
    main()
