"""The one-token attention's inner step, three ways, at many rows (issue 44): the engine's kernel (synth/attention.py)
with its query group's product, with one query at a time, and with the group on the tensor cores, timed and compared
on the same inputs.

At 256-512 rows the Talker's one-token attention read its cache at 2.3-3.0 TB/s of the H200's 4.8 (40.7 us a layer at
256 rows and position 109, 78 at 512: 1.1-2.2 ms of a step) and the code predictor's at 2.0-2.4 (8.5 us a layer pass
at 256 rows, 70 a frame), where larger blocks or more warps made both slower (bench/attention_configs.py,
docs/benchmarks.md "The step's attentions at many rows"). The group's softmax step multiplies the query group and a
block of keys as one [GROUP, BLOCK, D] float32 product (128 registers a thread on one warp, the same again for the
values), its keys and values widened to float32 whole: register pressure that may bound how many programs an SM holds,
hence the bytes in flight. The ways:
- `kernel`: the group's product (ONE_QUERY False: the Talker's caches in the engine);
- `lean`: one query of the group at a time, [BLOCK, D] products, keys and values widened where multiplied (ONE_QUERY
  True: the code predictor's caches in the engine, since it read them faster at every batch);
- `dot`: the group padded to 16 queries (duplicates of the last), q.K^T and P.V on the tensor cores (`tl.dot`, bf16
  in, float32 accumulated; P rounded to the cache dtype as SDPA's kernels round it): this file's own kernel.

    python3 -m bench.attention_variants [--rows 64,256,512] [--parts talker,predictor]   # on a GPU
    TRITON_INTERPRET=1 python -m bench.attention_variants --check      # on the CPU: every variant against the kernel

Each figure: a CUDA graph of REPS back-to-back calls, replayed (bench/persistent.py graph_ms); us a call = the
median of 7 replays / REPS; max diff = the largest difference of the output from the kernel's, and whether the cache
writes are equal (with more than one warp, the k norm's sum may round apart).
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from talkgate.synth.attention import _at, _in_dtype, _load_block, _norm_rope, one_token_attention_kernel

REPS = 20
VARIANTS = ("lean", "dot")


@triton.jit
def _dot_step(q, kb, vb, valid, m, l, acc, scale, F32: tl.constexpr):
    """_softmax_step of synth/attention.py on the tensor cores: q [16, D] and kb, vb [BLOCK, D] in the cache dtype; F32:
    both products in exact float32 instead (Triton's interpreter multiplies bfloat16 wrongly; the CPU check runs so)."""
    if F32:
        s = tl.dot(q.to(tl.float32), tl.trans(kb.to(tl.float32)), input_precision="ieee") * scale
    else:
        s = tl.dot(q, tl.trans(kb)) * scale
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    if F32:
        acc = acc * alpha[:, None] + tl.dot(p, vb.to(tl.float32), input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb)
    return m_new, l, acc


@triton.jit(do_not_specialize=["pos_all"])
def dot_kernel(QKV, sqkv, QW, KW, COS, SIN, scs, K, V, sks, skh, skl, SLOTS, POS, O, so, pos_all, TABLE, stab, eps,
               scale, HQ: tl.constexpr, HKV: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
               PAGE: tl.constexpr, F32: tl.constexpr):
    """one_token_attention_kernel with the tensor-core softmax step; every row's slot and position given (SLOTS, POS:
    the Talker's way; pos_all unused)."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(SLOTS + b).to(tl.int64)
    n = tl.load(POS + b).to(tl.int32)
    if PAGE > 0:
        tab, base = TABLE + slot * stab, h * skh
    else:
        tab, base = TABLE, slot * sks + h * skh
    ROW = QKV + b * sqkv
    DT: tl.constexpr = K.dtype.element_ty
    d = tl.arange(0, D)
    kb, vb, valid = _load_block(K, V, tab, sks, base, skl, 0, n, d, BLOCK, PAGE)
    rot = (d + D // 2) % D
    sign = tl.where(d < D // 2, -1.0, 1.0)[None, :]
    cos = _in_dtype(tl.load(COS + b * scs + d).to(tl.float32), DT)[None, :]
    sin = _in_dtype(tl.load(SIN + b * scs + d).to(tl.float32), DT)[None, :]
    g = tl.arange(0, 16)
    rows = h * GROUP + tl.minimum(g, GROUP - 1)
    q = _norm_rope(ROW, rows, d, rot, sign, cos, sin, QW, eps, 1.0, False, D, DT)                       # [16, D]
    one = tl.arange(0, 1)
    k = _norm_rope(ROW, HQ + h + one, d, rot, sign, cos, sin, KW, eps, 1.0, False, D, DT)
    v = tl.load(ROW + (HQ + HKV + h + one)[:, None] * D + d[None, :], cache_modifier=".cg").to(tl.float32)
    at = _at(tab, sks, base, skl, tl.cast(n, tl.int64) + one, one == 0, PAGE)[:, None] + d[None, :]
    tl.store(K + at, k.to(DT))
    tl.store(V + at, v.to(DT))
    m = tl.sum(q * k, axis=1) * scale
    l = tl.full([16], 1.0, tl.float32)
    acc = tl.zeros([16, D], tl.float32) + v
    q = q.to(DT)                        # exact: _norm_rope's values are already in the model dtype
    m, l, acc = _dot_step(q, kb, vb, valid, m, l, acc, scale, F32)
    for first in range(BLOCK, n, BLOCK):
        kb, vb, valid = _load_block(K, V, tab, sks, base, skl, first, n, d, BLOCK, PAGE)
        m, l, acc = _dot_step(q, kb, vb, valid, m, l, acc, scale, F32)
    tl.store(O + b * so + (h * GROUP + g)[:, None] * D + d[None, :], (acc / l[:, None]).to(O.dtype.element_ty),
             mask=(g < GROUP)[:, None])


class Case:
    """The inputs of one call: B rows at position pos, the Talker's paged cache (pages of 64) or the code predictor's
    16-position slots, random values (cos/sin included: only equality between the kernels is judged)."""

    def __init__(self, B: int, pos: int, paged: bool, device: str, HQ=16, HKV=8, D=128, seed=0):
        g = torch.Generator(device="cpu").manual_seed(seed)
        dt = torch.bfloat16

        def rnd(*shape, dtype=dt):
            return torch.randn(*shape, generator=g).to(device, dtype)
        self.B, self.pos, self.paged, self.HQ, self.HKV, self.D = B, pos, paged, HQ, HKV, D
        self.qkv = rnd(B, (HQ + 2 * HKV) * D)
        self.qw, self.kw = rnd(D) * 0.1 + 1, rnd(D) * 0.1 + 1
        self.cos, self.sin = rnd(B, D, dtype=torch.float32), rnd(B, D, dtype=torch.float32)
        self.slots = torch.randperm(B, generator=g).to(device)
        self.posv = torch.full((B,), pos, device=device, dtype=torch.long)
        if paged:
            self.page = 64
            per = -(-(pos + 1) // self.page)
            self.kc = rnd(1 + B * per, HKV, self.page, D)
            self.table = (1 + torch.randperm(B * per, generator=g)).to(device).view(B, per)
        else:
            self.page = 0
            self.kc = rnd(B, HKV, 16, D)
            self.table = self.qkv
        self.vc = rnd(*self.kc.shape)
        self.out = torch.empty(B, HQ * D, device=device, dtype=dt)

    def args(self, kc: torch.Tensor, vc: torch.Tensor):
        return (self.qkv, self.qkv.stride(0), self.qw, self.kw, self.cos, self.sin, self.cos.stride(0), kc, vc,
                kc.stride(0), kc.stride(1), kc.stride(2), self.slots, self.posv, self.out, self.out.stride(0), 0,
                self.table, self.table.stride(0) if self.paged else 0, 1e-6, self.D ** -0.5)

    def launch(self, variant: str, block: int, warps: int, kc: torch.Tensor | None = None,
               vc: torch.Tensor | None = None) -> None:
        """One call, writing the new token into kc, vc (default: the case's own caches)."""
        args = self.args(self.kc if kc is None else kc, self.vc if vc is None else vc)
        kw = dict(HQ=self.HQ, HKV=self.HKV, GROUP=self.HQ // self.HKV, D=self.D, BLOCK=block, PAGE=self.page,
                  num_warps=warps)
        grid = (self.B, self.HKV)
        if variant == "dot":
            dot_kernel[grid](*args, F32=self.qkv.device.type == "cpu", **kw)
        else:
            # the projection of normed rows (X unused, HB=0), as the variants were measured
            one_token_attention_kernel[grid](*args, self.qkv, 0, 0, 0.0, ROW_SLOTS=True, ROW_POS=True,
                                             ONE_QUERY=variant == "lean", HB=0, **kw)

    def run(self, variant: str, block: int, warps: int):
        """(output, k cache, v cache) of one call on fresh copies of the caches."""
        kc, vc = self.kc.clone(), self.vc.clone()
        self.out.fill_(float("nan"))             # a variant that writes nothing cannot pass for the kernel
        self.launch(variant, block, warps, kc, vc)
        return self.out.clone(), kc, vc


def differences(case: Case, variant: str, block: int, warps: int) -> tuple[float, float, bool]:
    """(largest difference of the variant's output from the engine's kernel's, the output's largest value, whether
    their cache writes are equal)."""
    ref_o, ref_k, ref_v = case.run("kernel", 16, 1)
    o, k, v = case.run(variant, block, warps)
    return ((o.float() - ref_o.float()).abs().max().item(), ref_o.float().abs().max().item(),
            torch.equal(k, ref_k) and torch.equal(v, ref_v))


def compare(case: Case, variant: str, block: int, warps: int) -> str:
    diff, scale, same_cache = differences(case, variant, block, warps)
    return f"max diff {diff:.3g} (output scale {scale:.3g}), cache {'equal' if same_cache else 'DIFFERENT'}"


CHECKS = ((True, 40), (True, 63), (True, 64), (True, 129), (False, 15), (False, 3), (False, 0))


def check() -> None:
    """On the CPU (Triton's interpreter): every variant against the engine's kernel, small shapes."""
    for paged, pos in CHECKS:
        case = Case(3, pos, paged, "cpu", HQ=4, HKV=2, D=32)
        for variant in VARIANTS:
            for block in (16, 32) if paged else (16,):
                print(f"{'Talker' if paged else 'predictor'} pos={pos} {variant} block={block}: "
                      f"{compare(case, variant, block, 1)}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="64,256,512")
    p.add_argument("--parts", default="talker,predictor")
    p.add_argument("--check", action="store_true", help="compare the variants on the CPU (TRITON_INTERPRET=1)")
    args = p.parse_args()
    if args.check:
        check()
        return
    from bench.persistent import graph_ms
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    sets = []
    if "talker" in args.parts:
        sets += [(True, 40), (True, 109)]
    if "predictor" in args.parts:
        sets += [(False, 15)]
    configs = [("kernel", 16, 1)] + [(v, block, warps) for v in VARIANTS
                                     for block, warps in ((16, 1), (16, 2), (32, 1), (32, 2), (64, 2), (64, 4))]
    for B in (int(r) for r in args.rows.split(",")):
        for paged, pos in sets:
            case = Case(B, pos, paged, "cuda")
            mb = B * (pos + 1) * case.HKV * case.D * 2 * 2 / 1e6
            for variant, block, warps in configs:
                if not paged and block > 16:
                    continue                    # the predictor's slots hold 16 positions
                try:
                    t = 1e3 * graph_ms(lambda: case.launch(variant, block, warps), reps=1, rounds=7, calls=REPS)
                    note = compare(case, variant, block, warps)
                except Exception as e:      # a configuration Triton cannot compile
                    t, note = float("nan"), f"not run ({type(e).__name__}: {str(e)[:80]})"
                print(f"{'Talker' if paged else 'predictor'} B={B} pos={pos} {variant} block={block} warps={warps}: "
                      f"{t:.1f} us ({mb / t:.2f} TB/s of the cache); {note}", flush=True)


if __name__ == "__main__":
    main()
