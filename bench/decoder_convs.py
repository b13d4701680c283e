"""The codec decoder's residual-unit convolutions (kernel 7, dilation 1/3/9, C in = C out) at the shapes of a
one-frame step of B rows, three ways, each timed alone (CUDA events, median of REPS after a warm run):

    ncl      F.conv1d on [B, C, L] (the decoder's path today), cuDNN's algorithm search on (cudnn.benchmark)
    nlc      the same convolution as conv2d on a channels-last [B, C, 1, L] (cuDNN's NHWC kernels, no
             layout conversion around each call)
    gemm     the windows unfolded and one matrix multiply [B * n, 7 C] x [7 C, C] (cuBLAS)

`--hog` first allocates all but 2 GiB of the GPU's free memory (an engine's KV and graphs hold most of it): does
cuDNN's search pick other algorithms when it cannot have a large workspace? `--busy` runs a process of large matrix
multiplies on the same GPU while every shape's first call (cuDNN's search) runs, and stops it before the timing (an
engine's compile helpers use the GPU while it warms up: does a search timed beside other work pick slow kernels?).
`--heuristics`: cuDNN's heuristics instead of its search (cudnn.benchmark off). Prints one line a shape.

    python -m bench.decoder_convs [--rows 32,64,256] [--hog] [--busy] [--heuristics] [--dtype float16]
"""
import argparse
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

STAGES = ((768, 32), (384, 160), (192, 640), (96, 1920))     # 1.7B / 0.6B decoder: (channels, samples a frame)
K = 7
REPS = 20
BUSY = ("import torch\na = torch.randn(8192, 8192, device='cuda', dtype=torch.float16)\n"
        "while True:\n    a @ a\n")


def timed(fn) -> float:
    fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(REPS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    return statistics.median(ms) * 1000


def ways(B: int, C: int, n: int, d: int, dtype, device):
    ctx = (K - 1) * d
    x = torch.randn(B, C, ctx + n, device=device, dtype=dtype)
    w = torch.randn(C, C, K, device=device, dtype=dtype) / (C * K) ** 0.5
    bias = torch.randn(C, device=device, dtype=dtype)
    x4 = x[:, :, None].contiguous(memory_format=torch.channels_last)
    w4 = w[:, :, None].contiguous(memory_format=torch.channels_last)
    wt = w.permute(2, 1, 0).reshape(K * C, C).contiguous()                 # [(k, c_in), c_out]
    xt = x.transpose(1, 2).contiguous()                                     # [B, L, C]: channels last

    def ncl():
        return F.conv1d(x, w, bias, dilation=d)

    def nlc():
        return F.conv2d(x4, w4, bias, dilation=(1, d))

    def gemm():
        win = xt.as_strided((B, n, K, C), (xt.stride(0), C, d * C, 1)).reshape(B * n, K * C)
        return torch.addmm(bias, win, wt)                                   # [B * n, C]
    return {"ncl": ncl, "nlc": nlc, "gemm": gemm}


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="32,64,256")
    p.add_argument("--hog", action="store_true")
    p.add_argument("--busy", action="store_true")
    p.add_argument("--heuristics", action="store_true")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--check", action="store_true", help="compare the three ways' outputs (CPU or GPU)")
    a = p.parse_args(argv)
    dtype = getattr(torch, a.dtype)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = not a.heuristics
    hog = None
    if a.hog and device.type == "cuda":
        free, _ = torch.cuda.mem_get_info()
        hog = torch.empty(max(0, free - (2 << 30)), dtype=torch.uint8, device=device)
        print(f"hog: {hog.numel() / 2**30:.1f} GiB held, {torch.cuda.mem_get_info()[0] / 2**30:.1f} GiB free")
    shapes = [(B, C, n, d) for B in map(int, a.rows.split(",")) for C, n in STAGES for d in (1, 3, 9)]
    fns = {shape: ways(*shape, dtype, device) for shape in shapes}
    if a.check:
        for (B, C, n, d), f in fns.items():
            ref = f["ncl"]().float()
            nlc = f["nlc"]()[:, :, 0].float()
            gemm = f["gemm"]().view(B, n, C).transpose(1, 2).float()
            scale = ref.abs().max().item()
            print(f"B {B} C {C} n {n} d {d}: nlc {((nlc - ref).abs().max() / scale).item():.1e}, "
                  f"gemm {((gemm - ref).abs().max() / scale).item():.1e}", flush=True)
        return
    busy = None
    if a.busy:
        busy = subprocess.Popen([sys.executable, "-c", BUSY])
        time.sleep(8)                                                       # its CUDA context up, multiplying
    for f in fns.values():                                                  # cuDNN's search, once a shape
        for way in f.values():
            way()
    if device.type == "cuda":
        torch.cuda.synchronize()
    if busy is not None:
        busy.kill()
        busy.wait()
    for (B, C, n, d), f in fns.items():
        us = {k: timed(way) for k, way in f.items()}
        flop = 2 * B * n * C * C * K
        best = min(us, key=us.get)
        print(f"B {B:4d} C {C:4d} n {n:5d} d {d}: " + ", ".join(f"{k} {v:8.1f} us" for k, v in us.items())
              + f"; best {best} {flop / us[best] / 1e6:.0f} TFLOP/s", flush=True)
    del hog


if __name__ == "__main__":
    main()
