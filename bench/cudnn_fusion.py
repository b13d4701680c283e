"""Can cuDNN's runtime fusion take a codec-decoder residual unit's SnakeBeta and residual add into its two
convolutions' epilogues, and is that faster than the path of today?

At 256 rows a residual unit (SnakeBeta, 7-tap dilated conv, SnakeBeta, 1x1 conv, residual add) runs as its two
convolutions and two memory-bound kernels that read and write its activations once more each (block 4 on an H100,
2026-12-06: conv 133 us, SnakeBeta 72, 1x1 71, residual add and the next unit's SnakeBeta 108). Here each decoder
block's three units (dilations 1, 3, 9) are chained at real 1.7B sizes, float16, [B, n, C] (channels last), each
unit's conv reading its carried frames and then the new ones from one buffer, as the decoder does:

    today   cuDNN's conv (its bias in it), SnakeBeta (one Triton kernel), the 1x1 as a cuBLAS multiply with its
            bias, then one Triton kernel: x + that -> x, and the next unit's SnakeBeta of it -> its conv's buffer
    fused   two cuDNN graphs a unit: conv + bias + SnakeBeta; 1x1 conv + bias + x -> x, and SnakeBeta of it ->
            the next unit's buffer (a second output of the same graph)
    fused-packed  fused with its second output into a packed scratch, then copied into the buffer (right where fused
            is wrong: Fused)
    fused1  where fused's second output is not supported: its graph with x alone, the SnakeBeta a Triton kernel
    engine  the engine's own three ResidualUnits (talkgate/synth/codec_decoder.py) with the block's weights, compiled
            with the batch dynamic as the engine compiles (the three units as one function; the engine compiles the
            conv stack's two halves), each unit's SnakeBeta of its input its own. Not the engine's cost: on
            2026-12-06 (H100, 256 rows) it took 1.0-1.5x the engine's own kernels for the same units in the decode
            graph's listing (bench/decoder_kernels.py), which is the comparison (docs/benchmarks.md)

The Triton kernels stand in for today's Inductor kernels (each reads and writes its tensors once, as those do).
Dilated convs run over their phases as synth/codec_decoder.py runs them on cuDNN (CausalConv._phases), so the
frames a frame are rounded up to a multiple of 9 (32 -> 36, 160 -> 162, 640 -> 648, 1920 -> 1926). Each way is
one CUDA graph of the block's three units, the median of 20 replays; fused and fused1 checked against today. A way
cuDNN does not support prints its error and the rest go on.

    python3 -m bench.cudnn_fusion --rows 64,256,512   # a GPU, nvidia-cudnn-frontend installed (bench/gpu_wheels.sh)
    python3 -m bench.cudnn_fusion --rows 2 --device cpu  # today's way against PyTorch, no timing (Triton interpreter)
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from bench.decoder_convs import K, STAGES
from talkgate.synth.codec_decoder import ConvHistory, ResidualUnit

DILATIONS = (1, 3, 9)
REPS = 20
BLOCK = 1024


@triton.jit
def _store_snake(x, i, live, FREQ, INV, OUT, n, C, out_row):
    """OUT[b, t] = SnakeBeta(x) for the flat indices i of [B, n, C]; OUT's rows out_row apart."""
    b, r = i // (n * C), i % (n * C)
    s = tl.sin(x * tl.load(FREQ + r % C))
    tl.store(OUT + b * out_row + r, (x + tl.load(INV + r % C) * s * s).to(OUT.dtype.element_ty), mask=live)


@triton.jit
def snake_kernel(H, FREQ, INV, OUT, total, n, C, out_row, BLOCK: tl.constexpr):
    """OUT = SnakeBeta(H) for H [B, n, C] contiguous."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = i < total
    _store_snake(tl.load(H + i, mask=live).to(tl.float32), i, live, FREQ, INV, OUT, n, C, out_row)


@triton.jit
def residual_kernel(X, H, FREQ, INV, OUT, total, n, C, out_row, BLOCK: tl.constexpr):
    """X += H, and OUT = SnakeBeta(X) (both [B, n, C], X contiguous)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = i < total
    x = tl.load(X + i, mask=live).to(tl.float32) + tl.load(H + i, mask=live).to(tl.float32)
    tl.store(X + i, x.to(X.dtype.element_ty), mask=live)
    _store_snake(x, i, live, FREQ, INV, OUT, n, C, out_row)


def snake(x, freq, inv):
    return torch.addcmul(x, inv, torch.sin(x * freq).square())


class Block:
    """One decoder block's three residual units at B rows: weights, the residual stream x [B, n, C], each unit's
    conv buffer [B, context + n, C] (carried frames, then the new frames' SnakeBeta) and scratch."""

    def __init__(self, B: int, C: int, n: int, dtype, device, seed: int = 0):
        g = torch.Generator().manual_seed(seed)

        def rand(*shape, scale=1.0):
            return (torch.randn(*shape, generator=g) * scale).to(device, dtype)

        self.B, self.C, self.n = B, C, n
        self.w7 = [rand(C, C, K, 1, scale=(C * K) ** -0.5).contiguous(memory_format=torch.channels_last)
                   for _ in DILATIONS]
        self.b7 = [rand(C, scale=0.1) for _ in DILATIONS]
        self.w1 = [rand(C, C, scale=C ** -0.5) for _ in DILATIONS]
        self.b1 = [rand(C, scale=0.1) for _ in DILATIONS]
        # SnakeBeta's e^alpha and 1 / (e^beta + 1e-9), float32 as synth/codec_decoder.py prepares them: act1 of
        # each unit, then act2 of each
        self.freq = [(torch.rand(C, generator=g) + 0.5).to(device) for _ in range(2 * len(DILATIONS))]
        self.inv = [(torch.rand(C, generator=g) + 0.5).to(device) for _ in range(2 * len(DILATIONS))]
        self.x0 = rand(B, n, C)
        self.bufs0 = []
        for u, d in enumerate(DILATIONS):
            buf = rand(B, (K - 1) * d + n, C)
            buf[:, (K - 1) * d:] = snake(self.x0.float(), *self.act1(u)).to(dtype)
            self.bufs0.append(buf)
        self.x, self.bufs = torch.empty_like(self.x0), [torch.empty_like(b) for b in self.bufs0]
        self.out = torch.empty_like(self.bufs0[0])          # the next block's first buffer stands in: its SnakeBeta
        self.h = torch.empty(B, n, C, device=device, dtype=dtype)
        self.a2 = torch.empty_like(self.h)
        self.reset()

    def reset(self):
        """The inputs as made (in place: the ways' graphs keep their tensors)."""
        self.x.copy_(self.x0)
        for buf, buf0 in zip(self.bufs, self.bufs0):
            buf.copy_(buf0)
        self.out.zero_()

    def act1(self, u: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Unit u's first SnakeBeta (e^alpha, 1 / (e^beta + 1e-9)); past the last unit the first's stands in for the
        next block's."""
        i = u % len(DILATIONS)
        return self.freq[i], self.inv[i]

    def act2(self, u: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Unit u's second SnakeBeta, as act1."""
        return self.freq[len(DILATIONS) + u], self.inv[len(DILATIONS) + u]

    def target(self, u: int) -> torch.Tensor:
        """Where unit u's residual add writes the next unit's SnakeBeta, [B, n, C]: the new frames of its buffer, or
        of `out` after the last."""
        buf = self.bufs[u + 1] if u + 1 < len(DILATIONS) else self.out
        return buf[:, buf.shape[1] - self.n:]

    def conv_view(self, u: int) -> torch.Tensor:
        """Unit u's conv input as the NHWC memory of [B, C, L / d, d] (CausalConv._phases: a (K, 1) kernel down
        the height reaches frames t, t + d, ...)."""
        d, buf = DILATIONS[u], self.bufs[u]
        return buf.view(self.B, buf.shape[1] // d, d, self.C).permute(0, 3, 1, 2)


def per_channel(t: torch.Tensor) -> torch.Tensor:
    """A [C] tensor as [1, C, 1, 1] with channels-last strides (cuDNN reads the layout from the strides)."""
    C = t.shape[0]
    return t.as_strided((1, C, 1, 1), (C, 1, C, C))


def launch(kernel, *args, out):
    """kernel over the flat [B, n, C] of `out`, a [B, n, C] view whose rows may be apart."""
    B, n, C = out.shape
    kernel[(triton.cdiv(B * n * C, BLOCK),)](*args, out, B * n * C, n, C, out.stride(0), BLOCK=BLOCK)


def today(blk: Block) -> None:
    B, C, n = blk.B, blk.C, blk.n
    for u, d in enumerate(DILATIONS):
        y = F.conv2d(blk.conv_view(u), blk.w7[u], blk.b7[u])                 # [B, C, n / d, d] channels-last
        h = y.permute(0, 2, 3, 1).reshape(B, n, C)
        launch(snake_kernel, h, *blk.act2(u), out=blk.a2)
        torch.addmm(blk.b1[u], blk.a2.view(B * n, C), blk.w1[u].T, out=blk.h.view(B * n, C))
        launch(residual_kernel, blk.x, blk.h, *blk.act1(u + 1), out=blk.target(u))


def reference(blk: Block) -> None:
    """today's arithmetic in plain PyTorch (float32 between the convs), for the CPU check of today's kernels."""
    B, C, n = blk.B, blk.C, blk.n
    for u, d in enumerate(DILATIONS):
        y = F.conv2d(blk.conv_view(u).float(), blk.w7[u].float(), blk.b7[u].float())
        a2 = snake(y.permute(0, 2, 3, 1).reshape(B, n, C), *blk.act2(u)).to(blk.x.dtype)
        x = blk.x.float() + F.linear(a2.float(), blk.w1[u].float(), blk.b1[u].float())
        blk.x.copy_(x)
        blk.target(u).copy_(snake(x, *blk.act1(u + 1)))


class EngineUnits:
    """The engine's ResidualUnits with a Block's weights; run() takes the block's x0 and each unit's carried frames
    (its buffer's first frames) through the three -> `result`, the new x (the engine's units compute each SnakeBeta
    themselves)."""

    def __init__(self, blk: Block, compiled: bool):
        self.blk = blk
        self.units, offset = [], 0
        for u, d in enumerate(DILATIONS):
            unit = ResidualUnit(blk.C, d).to(blk.x.device, blk.x.dtype)
            with torch.no_grad():
                unit.conv1.conv.weight.copy_(blk.w7[u][..., 0])
                unit.conv1.conv.bias.copy_(blk.b7[u])
                unit.conv2.conv.weight.copy_(blk.w1[u][:, :, None])
                unit.conv2.conv.bias.copy_(blk.b1[u])
            for part in (unit.conv1, unit.conv2):
                part.prepare()
            unit.conv1.state_offset, offset = offset, offset + blk.C * unit.conv1.context
            # in the model's dtype, as the engine's decoder holds them (prepared in float32, then converted)
            unit.act1.freq, unit.act1.inv_beta = (t.to(blk.x.dtype) for t in blk.act1(u))
            unit.act2.freq, unit.act2.inv_beta = (t.to(blk.x.dtype) for t in blk.act2(u))
            self.units.append(unit)
        self.tails = torch.cat([buf[:, :(K - 1) * d].reshape(blk.B, -1) for buf, d in zip(blk.bufs0, DILATIONS)], 1)
        self.forward = self._forward
        if compiled:                # the batch dynamic, as the engine compiles (synth/precompiled.py's kinds)
            for t in (blk.x0, self.tails):
                torch._dynamo.maybe_mark_dynamic(t, 0)
            self.forward = torch.compile(self._forward, fullgraph=True)

    def _forward(self, x: torch.Tensor, tails: torch.Tensor) -> torch.Tensor:
        history = ConvHistory(tails)
        for unit in self.units:
            x = unit(x, history)
        return x

    def run(self) -> None:
        with torch.no_grad():
            self.result = self.forward(self.blk.x0, self.tails)


class Fused:
    """The cuDNN graphs of fused (two_outputs) or fused1 for a Block, built once; run() launches them. A unit's
    residual add writes the other of two x buffers (`xs`: the block's x, then a scratch one; the result in `result`),
    as the engine's compiled units write a new x. The two-output graph's results are ~100% off (2026-12-06, x in
    place and x in the other buffer alike) while fused1's match. Its second output is the only tensor of either way
    whose rows are apart (the new frames of the next unit's buffer, after its carried ones): packed_act writes it to
    a packed scratch [B, n, C] instead, copied into the buffer after the graph (fused-packed), and that is right
    (2026-12-06): cuDNN does not honour that output's stride."""

    def __init__(self, blk: Block, two_outputs: bool, packed_act: bool = False):
        import cudnn
        self.cudnn, self.blk, self.two = cudnn, blk, two_outputs
        self.scratch = torch.empty_like(blk.x) if packed_act else None
        self.handle = cudnn.create_handle()
        B, C, n = blk.B, blk.C, blk.n
        self.extra = []                                   # (graph tensor, data) of the SnakeBetas' per-channel inputs
        self.units = []
        self.xs = [blk.x, torch.empty_like(blk.x)]
        self.result = self.xs[len(DILATIONS) % 2]
        for u, d in enumerate(DILATIONS):
            a2 = blk.a2.view(B, n // d, d, C).permute(0, 3, 1, 2)
            g1, io1 = self._graph(lambda g, t: self._conv_snake(g, t, u), [blk.conv_view(u), blk.w7[u],
                                  per_channel(blk.b7[u])], [a2])
            act_to = blk.target(u) if self.scratch is None else self.scratch
            act = act_to.unsqueeze(2).permute(0, 3, 1, 2) if two_outputs else None
            x, x_new = (t.view(B, n, 1, C).permute(0, 3, 1, 2) for t in (self.xs[u % 2], self.xs[(u + 1) % 2]))
            g2, io2 = self._graph(lambda g, t: self._linear_residual(g, t, u), [blk.a2.view(B, n, 1, C).permute(
                0, 3, 1, 2), blk.w1[u].as_strided((C, C, 1, 1), (C, 1, C, C)), per_channel(blk.b1[u]), x],
                [x_new] + ([act] if two_outputs else []))
            self.units.append((g1, io1, g2, io2))
        self.workspace = torch.empty(max(max(g1.get_workspace_size(), g2.get_workspace_size())
                                         for g1, _, g2, _ in self.units), device=blk.x.device, dtype=torch.uint8)

    def _graph(self, body, inputs, outputs):
        cudnn = self.cudnn
        g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=self.handle)
        tensors = [g.tensor_like(t) for t in inputs]
        self.extra = []
        results = body(g, tensors)
        for r, t in zip(results, outputs):
            r.set_output(True).set_data_type(cudnn.data_type.HALF).set_stride(list(t.stride()))
        g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        io = dict(zip(tensors + list(results), inputs + outputs))
        io.update(self.extra)
        return g, io

    def _snake(self, g, y, act):
        """SnakeBeta of y with act's (freq, inv), each a per-channel input of the graph."""
        views = [per_channel(t) for t in act]
        freq, inv = (g.tensor_like(v) for v in views)
        self.extra += [(freq, views[0]), (inv, views[1])]
        s = g.sin(g.mul(y, freq))
        return g.add(y, g.mul(g.mul(s, s), inv))

    def _conv_snake(self, g, t, u):
        image, weight, bias = t
        y = g.bias(g.conv_fprop(image=image, weight=weight, pre_padding=[0, 0], post_padding=[0, 0], stride=[1, 1],
                                dilation=[1, 1]), bias)
        return [self._snake(g, y, self.blk.act2(u))]

    def _linear_residual(self, g, t, u):
        a2, weight, bias, x = t
        x_new = g.add(g.bias(g.conv_fprop(image=a2, weight=weight, pre_padding=[0, 0], post_padding=[0, 0],
                                          stride=[1, 1], dilation=[1, 1]), bias), x)
        return [x_new, self._snake(g, x_new, self.blk.act1(u + 1))] if self.two else [x_new]

    def run(self) -> None:
        blk = self.blk
        self.cudnn.set_stream(handle=self.handle, stream=torch.cuda.current_stream().cuda_stream)
        for u, (g1, io1, g2, io2) in enumerate(self.units):
            g1.execute(io1, self.workspace, handle=self.handle)
            g2.execute(io2, self.workspace, handle=self.handle)
            if self.scratch is not None:
                blk.target(u).copy_(self.scratch)
            if not self.two:
                launch(snake_kernel, self.xs[(u + 1) % 2], *blk.act1(u + 1), out=blk.target(u))


def replay_us(fn) -> float:
    """fn captured in a CUDA graph (after a warm run), the median of REPS replays."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(REPS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return statistics.median(times)


def outputs(blk: Block, x: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x (the block's, or where a way left it) and the last unit's SnakeBeta of it, as float32 copies."""
    return (blk.x if x is None else x).float().clone(), blk.target(len(DILATIONS) - 1).float().clone()


def error(got, want) -> float:
    """The largest difference of x and of the last SnakeBeta (x alone where got holds x alone), over the largest value
    of each."""
    return max(float((g - w).abs().max() / w.abs().max()) for g, w in zip(got, want))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="256", help="rows, one or more: 64,256,512")
    ap.add_argument("--blocks", default="1,2,3,4", help="which decoder blocks (1: 768 channels ... 4: 96)")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    device, gpu = torch.device(args.device), args.device == "cuda"
    torch.backends.cudnn.benchmark = True
    if gpu:
        import cudnn
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {cudnn.backend_version_string()}, "
              f"frontend {getattr(cudnn, '__version__', '?')}; float16", flush=True)
    for rows, index in ((int(r), int(b)) for r in args.rows.split(",") for b in args.blocks.split(",")):
        C, n = STAGES[index - 1]
        n = -(-n // 9) * 9
        blk = Block(rows, C, n, torch.float16 if gpu else torch.float32, device)
        today(blk)
        want = outputs(blk)
        if not gpu:
            blk.reset()
            reference(blk)
            units = EngineUnits(blk, compiled=False)
            units.run()
            print(f"{rows} rows, block {index} ({C} channels, {n} frames): today against PyTorch "
                  f"{error(want, outputs(blk)):.2e}, the engine's units' x against today's "
                  f"{error([units.result.float()], want):.2e}")
            continue
        line = [f"{rows} rows, block {index} ({C} channels, {n} frames): today {replay_us(lambda: today(blk)):.1f} us"]
        blk.reset()
        engine = EngineUnits(blk, compiled=True)
        engine.run()
        line.append(f"engine {replay_us(engine.run):.1f} us (x error {error([engine.result.float()], want):.1e})")
        for name, two, packed in (("fused", True, False), ("fused-packed", True, True), ("fused1", False, False)):
            blk.reset()
            try:
                fused = Fused(blk, two, packed)
                fused.run()
                torch.cuda.synchronize()
                err = error(outputs(blk, fused.result), want)
                line.append(f"{name} {replay_us(fused.run):.1f} us (error {err:.1e})")
            except Exception as e:                     # cuDNN's refusal of a pattern is this bench's answer
                line.append(f"{name} not run: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
        print("; ".join(line), flush=True)


if __name__ == "__main__":
    main()
