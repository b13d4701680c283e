"""Triton kernels' registers, stack frame and spills at real sizes, compiled for sm_90 on any machine (no GPU: Triton
compiles to a cubin, the cuobjdump that Triton's package carries reads its resource usage).

    python -m bench.kernel_resources [--file PATH] [--rows 1,2] [--preset 1.7b]
    python -m bench.kernel_resources --step [--rows 8,256] [--preset 1.7b]

Default: the persistent kernels (synth/persistent.py); --file: a persistent.py to compile instead of the package's (an
earlier one: `git show REV:talkgate/synth/persistent.py > /tmp/old.py`). --step: the many-row step's own kernels as
the engine launches them (the Talker's and code predictor's one-token attention and scaled SwiGLU, the two draws, the
codec decoder's window attention), each with how many of its programs an SM holds (registers, warps, shared memory)
and the waves its grid takes on an H100/H200's 132 SMs: at many rows a kernel's registers can decide its time (a
kernel read this way is a hypothesis until timed). The model is built on the meta device (no weights)."""
import argparse
import importlib.util
import math
import os
import re
import subprocess
import sys
import tempfile
import time

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

from talkgate.synth import attention, sample_kernel, scaled_swiglu, window_attention
from talkgate.synth.checkpoint import model_config
from talkgate.synth.codec_decoder import CodecDecoderConfig
from talkgate.synth.config import TTSConfig
from talkgate.synth.model import CodePredictor, Talker, fuse_projections
from talkgate.synth.random_speech_tokenizer import speech_tokenizer_config

SMS = 132
TARGET = GPUTarget("cuda", 90, 32)


def compile_usage(fn, args: tuple, kw: dict) -> dict:
    """Compile a JIT kernel for TARGET with a launch's arguments -> its resource usage (cuobjdump's line, registers and
    stack frame a thread (where ptxas spills, and where libdevice's sine keeps its range reduction), warps, shared
    memory) and the seconds the compile took."""
    backend = make_backend(TARGET)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kw)
    names = {p.name for p in fn.params}
    options, signature, constexprs, attrs = fn._pack_args(
        backend, {k: v for k, v in kw.items() if k not in names}, bound, specialization, options)
    t0 = time.perf_counter()
    kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET, options=options.__dict__)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    line = next((ln.strip() for ln in usage.splitlines() if "REG:" in ln), usage.strip()[-200:])
    found = {k: int(v) for k, v in re.findall(r"(REG|STACK):(\d+)", line)}
    return dict(line=line, regs=found.get("REG", 0), stack=found.get("STACK", 0), warps=kernel.metadata.num_warps,
                shared=kernel.metadata.shared, seconds=time.perf_counter() - t0)


def per_sm(regs: int, warps: int, shared: int) -> int:
    """Programs of one kernel an sm_90 SM holds at once: 64K registers (a warp's allocated in units of 256), 64 warps,
    228 KB of shared memory (1 KB a block reserved), 32 blocks."""
    by_regs = 65536 // (-(-regs * 32 // 256) * 256) // warps if regs else 32
    by_shared = 233472 // (shared + 1024)
    return min(32, by_regs, 64 // warps, by_shared)


class Compiled:
    """Stands in for a JIT kernel: a launch compiles it for TARGET and records its resource usage and grid under its
    label (the kernel's name unless set), once a label."""

    def __init__(self, fn, found: dict):
        self.fn, self.found, self.label = fn, found, None

    def __getitem__(self, grid):
        def launch(*args, **kw):
            key = self.label or self.fn.__name__
            if key not in self.found:
                self.found[key] = dict(compile_usage(self.fn, args, kw), programs=math.prod(grid))
        return launch


DT = torch.bfloat16
META = torch.device("meta")


def empty(*shape, dtype=DT) -> torch.Tensor:
    return torch.empty(*shape, device=META, dtype=dtype)


def meta_models(preset: str, slots: int) -> tuple[Talker, CodePredictor]:
    """The preset's Talker (its paged cache for `slots` contexts) and code predictor on the meta device, fused and set
    up as the engine loads them: real shapes, no weights."""
    cfg = TTSConfig.parse(model_config(preset, "custom_voice"))
    with META:
        talker = Talker(cfg.talker).to(DT)
        predictor = CodePredictor(cfg.talker.predictor, cfg.talker.dims.hidden_size).to(DT)
    fuse_projections(talker, predictor)
    talker.setup_cache(slots, 1024, META, DT)
    predictor.setup(META)
    return talker, predictor


def step_kernels(preset: str, rows: list[int]) -> None:
    """--step: each of the many-row step's Triton kernels, launched through the engine's own calls on meta tensors
    (the engine takes them from 3 rows; at 1-2 the persistent kernels run instead)."""
    slots_n = max(rows)
    talker, predictor = meta_models(preset, slots_n)
    dec = CodecDecoderConfig.from_dict(speech_tokenizer_config())
    jit = [(m, name, getattr(m, name)) for m, name in (
        (attention, "one_token_attention_kernel"), (scaled_swiglu, "scaled_swiglu_kernel"),
        (sample_kernel, "sample_kernel"), (sample_kernel, "codebook0_kernel"),
        (window_attention, "window_attention_kernel"))]
    compiled = {name: Compiled(fn, {}) for _, name, fn in jit}
    for m, name, _ in jit:
        setattr(m, name, compiled[name])
    try:
        for B in rows:
            found: dict = {}
            for c in compiled.values():
                c.found = found
            launch_step(B, slots_n, talker, predictor, dec, compiled)
            for key, u in found.items():
                n = per_sm(u["regs"], u["warps"], u["shared"])
                print(f"{preset} rows {B} {key} ({u['warps']} warps): {u['regs']} registers a thread, {u['stack']} "
                      f"bytes of stack frame, {u['shared']} shared; {n} programs an SM: {u['programs']} programs in "
                      f"{u['programs'] / (n * SMS):.2f} waves of {SMS} SMs (compiled in {u['seconds']:.1f} s, "
                      f"triton {triton.__version__})")
    finally:
        for m, name, fn in jit:
            setattr(m, name, fn)


def launch_step(B: int, slots_n: int, talker: Talker, predictor: CodePredictor, dec, compiled: dict) -> None:
    """The step's Triton kernels at B rows through the engine's own calls (each kernel a Compiled: launched, it
    compiles), labelled where one kernel serves two models."""
    long_rows, long_slots = empty(B, dtype=torch.long), empty(slots_n, dtype=torch.long)
    rope = empty(B, talker.layers[0].self_attn.head_dim, dtype=torch.float32)
    for label, model, x, attend in (
            ("Talker", talker, empty(B, talker.hidden_size), lambda attn, x: attn.one_token(
                x, 1e-6, rope, rope, talker.k_cache[0], talker.v_cache[0], long_rows, long_rows, talker.page_table)),
            ("code predictor", predictor, empty(B, predictor.cfg.dims.hidden_size), lambda attn, x:
                attn.new_positions(x, 1e-6, predictor.cos[1:2], predictor.sin[1:2],
                                   empty(B, attn.n_kv, predictor.groups, attn.head_dim),
                                   empty(B, attn.n_kv, predictor.groups, attn.head_dim), 1))):
        layer = model.layers[0]
        compiled["one_token_attention_kernel"].label = f"{label} one-token attention"
        attend(layer.self_attn, x)
        compiled["scaled_swiglu_kernel"].label = f"{label} scaled SwiGLU"
        scaled_swiglu.scaled_swiglu(empty(B, layer.mlp.gate_up_weight.shape[0]), x, 1e-6)
    f32, flags = empty(slots_n, dtype=torch.float32), empty(slots_n, dtype=torch.bool)
    sample_kernel.sample(empty(B, predictor.cfg.vocab_size), f32, long_slots, f32, flags, long_slots, long_rows, 0,
                         long_rows)
    V0 = talker.cfg.vocab_size
    sample_kernel.codebook0(empty(B, V0), long_rows, empty(slots_n, V0, dtype=torch.bool), empty(V0, dtype=torch.bool),
                            talker.cfg.codec_eos, empty(B, dtype=torch.bool), f32, f32, long_slots, f32, flags,
                            long_slots, long_rows)
    D, kv = dec.attn_head_dim, dec.num_key_value_heads
    window_attention.window_attention(
        empty(B, (dec.num_attention_heads + 2 * kv) * D, dtype=torch.float16), long_rows, long_rows,
        empty(slots_n, dec.sliding_window, 2, kv, D, dtype=torch.float16), empty(D // 2, dtype=torch.float32),
        dec.num_attention_heads)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", help="a persistent.py to compile (default: the package's)")
    ap.add_argument("--rows", default="1,2")
    ap.add_argument("--preset", default="1.7b")
    ap.add_argument("--step", action="store_true", help="the many-row step's kernels instead of the persistent ones")
    a = ap.parse_args()
    if a.step:
        return step_kernels(a.preset, [int(r) for r in a.rows.split(",")])
    if a.file:
        spec = importlib.util.spec_from_file_location("persistent_under_test", a.file)
        kernels = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = kernels
        spec.loader.exec_module(kernels)
    else:
        from talkgate.synth import persistent as kernels
    kernels.programs = lambda device: SMS
    talker, predictor = meta_models(a.preset, 8)
    jit = kernels.talker_kernel, kernels.predictor_kernel
    for rows in map(int, a.rows.split(",")):
        found: dict = {}
        kernels.talker_kernel, kernels.predictor_kernel = (Compiled(fn, found) for fn in jit)
        x = empty(rows, talker.hidden_size)
        kernels.talker_step(talker, x, empty(rows, 128, dtype=torch.float32), empty(rows, 128, dtype=torch.float32),
                            empty(rows, dtype=torch.long), empty(rows, dtype=torch.long))
        sampling = type("Rows", (), dict(
            sub_temperature=empty(rows, dtype=torch.float32), sub_top_k=empty(rows, dtype=torch.long),
            sub_top_p=empty(rows, dtype=torch.float32), sub_greedy=empty(rows, dtype=torch.bool),
            seed=empty(rows, dtype=torch.long)))
        kernels.predict(predictor, x, x, sampling, empty(rows, dtype=torch.long), empty(rows, dtype=torch.long))
        for name, u in found.items():
            print(f"{a.preset} {name} rows {rows}: {u['line']}, dynamic shared {u['shared']} (compiled in "
                  f"{u['seconds']:.1f} s, triton {triton.__version__})")


if __name__ == "__main__":
    main()
