"""The codec decoder's convolutions of a one-row, one-frame step at the released size, alone, each computed
four ways (CUDA graphs, us a call): its input windows gathered and multiplied (CausalConv's one-row path) in
exact float32 and in TF32, and cuDNN's convolution in TF32 and exact; then the transposed convolutions' and
ConvNeXt linears' multiplies in exact float32 and TF32. Random values (timing does not depend on them).

    python3 bench/decoder_convs.py        # on a GPU machine; docs/benchmarks.md has a run
"""
import traceback

import torch
import torch.nn.functional as F

from bench.decoder import set_tf32 as tf32
from bench.persistent import graph_ms


def graph_us(fn):
    return round(graph_ms(fn) * 1000, 2)


CONVS = [("pre 1024->1536 k7", 1024, 1536, 7, 1, 4)]
for c, n, name in ((768, 32, "b1"), (384, 160, "b2"), (192, 640, "b3"), (96, 1920, "b4")):
    for d in (1, 3, 9):
        CONVS.append((f"{name} k7 d{d}", c, c, 7, d, n))
    CONVS.append((f"{name} 1x1", c, c, 1, 1, n))
CONVS.append(("final 96->1 k7", 96, 1, 7, 1, 1920))

MMS = [("b1 transconv", 4, 3072, 6144), ("b2 transconv", 32, 1536, 1920), ("b3 transconv", 160, 768, 768),
       ("b4 transconv", 640, 384, 288), ("convnext1 pw1", 2, 1024, 4096), ("convnext1 pw2", 2, 4096, 1024),
       ("convnext2 pw1", 4, 1024, 4096), ("convnext2 pw2", 4, 4096, 1024)]


def main():
    torch.backends.cudnn.benchmark = True
    print(f"{'conv':22s} {'MACs':>8s} | mm exact | mm tf32 | cudnn tf32 | cudnn exact")
    for name, ci, co, k, d, n in CONVS:
        try:
            x = torch.randn(1, ci, n + (k - 1) * d, device="cuda")
            w = torch.randn(co, ci, k, device="cuda")
            bias = torch.randn(co, device="cuda")

            def mm():
                _, sc, st = x.stride()
                win = x.as_strided((ci, k, n), (sc, d * st, st)).reshape(ci * k, n)
                return torch.addmm(bias[:, None], w.view(co, ci * k), win)

            res = []
            for on in (False, True):
                tf32(on)
                res.append(graph_us(mm))
            for on in (True, False):
                tf32(on)
                res.append(graph_us(lambda: F.conv1d(x, w, bias, dilation=d)))
            tf32(False)
            print(f"{name:22s} {co * ci * k * n / 1e6:7.0f}M | " + " | ".join(f"{r:7.2f}" for r in res), flush=True)
        except Exception:
            traceback.print_exc()
    print(f"{'multiply':22s} rows K N | exact | tf32")
    for name, m, kk, nn in MMS:
        try:
            x = torch.randn(m, kk, device="cuda")
            w = torch.randn(nn, kk, device="cuda")
            bias = torch.randn(nn, device="cuda")
            res = []
            for on in (False, True):
                tf32(on)
                res.append(graph_us(lambda: torch.addmm(bias, x, w.T)))
            tf32(False)
            print(f"{name:22s} {m} {kk} {nn} | " + " | ".join(f"{r:7.2f}" for r in res)
                  + f" | weight {kk * nn * 4 / 1e6:.1f} MB", flush=True)
        except Exception:
            traceback.print_exc()


if __name__ == "__main__":
    main()
