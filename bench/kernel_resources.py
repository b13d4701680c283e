"""The persistent kernels' registers, stack frame and spills at real sizes, compiled for sm_90 on any machine (no GPU:
Triton compiles to a cubin, the cuobjdump that Triton's package carries reads its resource usage).

    python -m bench.kernel_resources [--file PATH] [--rows 1,2] [--preset 1.7b]

--file: a persistent.py to compile instead of the package's (an earlier one: `git show REV:talkgate/synth/persistent.py
> /tmp/old.py`). The model is built on the meta device (no weights); one program per SM of an H100/H200 (132)."""
import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

from talkgate.synth.checkpoint import model_config
from talkgate.synth.config import TTSConfig
from talkgate.synth.model import CodePredictor, Talker, fuse_projections

SMS = 132
TARGET = GPUTarget("cuda", 90, 32)


class Compiled:
    """Stands in for a JIT kernel: a launch compiles it for TARGET and records its resource usage."""

    def __init__(self, fn, found: dict):
        self.fn, self.found = fn, found

    def __getitem__(self, grid):
        def launch(*args, **kw):
            if self.fn.__name__ in self.found:
                return
            backend = make_backend(TARGET)
            binder = create_function_from_signature(self.fn.signature, self.fn.params, backend)
            bound, specialization, options = binder(*args, **kw)
            names = {p.name for p in self.fn.params}
            options, signature, constexprs, attrs = self.fn._pack_args(
                backend, {k: v for k, v in kw.items() if k not in names}, bound, specialization, options)
            t0 = time.perf_counter()
            kernel = triton.compile(ASTSource(self.fn, signature, constexprs, attrs), target=TARGET,
                                    options=options.__dict__)
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(kernel.asm["cubin"])
                f.flush()
                tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
                usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
            line = next((ln.strip() for ln in usage.splitlines() if "REG:" in ln), usage.strip()[-200:])
            self.found[self.fn.__name__] = (time.perf_counter() - t0, f"{line}, dynamic shared {kernel.metadata.shared}")
        return launch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", help="a persistent.py to compile (default: the package's)")
    ap.add_argument("--rows", default="1,2")
    ap.add_argument("--preset", default="1.7b")
    a = ap.parse_args()
    if a.file:
        spec = importlib.util.spec_from_file_location("persistent_under_test", a.file)
        kernels = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = kernels
        spec.loader.exec_module(kernels)
    else:
        from talkgate.synth import persistent as kernels
    kernels.programs = lambda device: SMS
    cfg = TTSConfig.parse(model_config(a.preset, "custom_voice"))
    dev, dt = torch.device("meta"), torch.bfloat16
    with dev:
        talker = Talker(cfg.talker).to(dt)
        predictor = CodePredictor(cfg.talker.predictor, cfg.talker.dims.hidden_size).to(dt)
    fuse_projections(talker, predictor)
    talker.setup_cache(8, 1024, dev, dt)
    predictor.setup(dev)
    jit = kernels.talker_kernel, kernels.predictor_kernel
    for rows in map(int, a.rows.split(",")):
        found: dict = {}
        kernels.talker_kernel, kernels.predictor_kernel = (Compiled(fn, found) for fn in jit)
        empty = lambda *shape, dtype=dt: torch.empty(*shape, device=dev, dtype=dtype)
        x = empty(rows, talker.hidden_size)
        kernels.talker_step(talker, x, empty(rows, 128, dtype=torch.float32), empty(rows, 128, dtype=torch.float32),
                            empty(rows, dtype=torch.long), empty(rows, dtype=torch.long))
        sampling = type("Rows", (), dict(
            sub_temperature=empty(rows, dtype=torch.float32), sub_top_k=empty(rows, dtype=torch.long),
            sub_top_p=empty(rows, dtype=torch.float32), sub_greedy=empty(rows, dtype=torch.bool),
            seed=empty(rows, dtype=torch.long)))
        kernels.predict(predictor, x, x, sampling, empty(rows, dtype=torch.long), empty(rows, dtype=torch.long))
        for name, (seconds, line) in found.items():
            print(f"{a.preset} {name} rows {rows}: {line} (compiled in {seconds:.1f} s, triton {triton.__version__})")


if __name__ == "__main__":
    main()
