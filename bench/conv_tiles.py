"""The residual units' convolution kernel (synth/conv_kernel.py) at the released decoder's unit shapes: time and
TFLOP/s of each tile configuration, against cuDNN's convolution of the same sizes (the tail prepended, as the PyTorch
path runs it), so that conv_kernel.tiles can be chosen from measurements.

    python -m bench.conv_tiles [--batch 256] [--dtypes float16,float32]      # on a GPU machine
"""
import argparse
import itertools

import torch
import torch.nn.functional as F

from talkgate.synth import conv_kernel

# (channels, times of one frame, dilation) of a unit of each decoder block (1536 // 2, ... ; 1920 samples a frame)
UNITS = [(768, 32, 9), (384, 160, 9), (192, 640, 9), (96, 1920, 9)]
CONFIGS = [dict(BM=bm, BN=bn, BK=bk, num_warps=4 if bm * bn <= 8192 else 8, num_stages=3)
           for bm, bn, bk in itertools.product((64, 128), (64, 128), (32, 64))]


def ms(fn, iters=20):
    graph = torch.cuda.CUDAGraph()
    fn()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        for _ in range(5):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters / 5


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dtypes", default="float16,float32")
    args = ap.parse_args()
    B = args.batch
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    chosen = conv_kernel.tiles
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, batch {B}")
    print("| dtype | C | T | kernel | cuDNN ms | shipped tiles ms | best ms | best tiles | best TFLOP/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
        for C, T, d in UNITS:
            x = torch.randn(B, C, T, device="cuda", dtype=dtype)
            for K, dil in ((7, d), (1, 1)):
                ctx = (K - 1) * dil
                tail = torch.randn(B, C, ctx, device="cuda", dtype=dtype) if ctx else None
                w = torch.randn(K, C, C, device="cuda", dtype=dtype) / (C * K) ** 0.5
                bias = torch.randn(C, device="cuda", dtype=dtype)
                freq, inv_beta = torch.rand(C, device="cuda", dtype=dtype) + 0.5, torch.rand(C, device="cuda", dtype=dtype)
                extra = dict(freq=freq, inv_beta=inv_beta) if K > 1 else dict(residual=x)
                wc = w.permute(1, 2, 0).contiguous()
                cudnn = ms(lambda: F.conv1d(torch.cat([tail, x], -1) if ctx else x, wc, bias, dilation=dil))
                flop = 2 * B * T * C * C * K
                times = {}
                for cfg in [None] + CONFIGS:
                    conv_kernel.tiles = (lambda *a, cfg=cfg: cfg) if cfg else chosen
                    try:
                        times[str(cfg)] = ms(lambda: conv_kernel.causal_conv(x, tail, w, bias, dil, **extra))
                    except Exception as e:                              # out of shared memory, say
                        times[str(cfg)] = float("inf")
                        print(f"  {cfg}: {type(e).__name__}: {str(e)[:120]}")
                conv_kernel.tiles = chosen
                shipped = times.pop("None")
                best = min(times, key=times.get)
                print(f"| {str(dtype)[6:]} | {C} | {T} | k{K}{' snake' if K > 1 else ' residual'} | {cudnn:.3f} | "
                      f"{shipped:.3f} | {times[best]:.3f} | {best} | {flop / times[best] / 1e9:.0f} |", flush=True)


if __name__ == "__main__":
    main()
