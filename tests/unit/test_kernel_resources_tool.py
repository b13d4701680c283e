"""bench/kernel_resources.py: how many programs an SM holds by a kernel's registers, warps and shared memory, and
the step's own kernels compiled for sm_90 through the engine's launch calls on the CPU (Triton's CUDA backend and
the cuobjdump its package carries; no GPU), each with its registers read: the tool's own process, as it is run, since
the tests' TRITON_INTERPRET makes every kernel here an interpreted one."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton", reason="triton is part of the test extra (and of torch on CUDA)")

from bench.kernel_resources import per_sm  # noqa: E402


def test_programs_an_sm_holds_by_the_scarcest_resource():
    assert per_sm(168, 1, 0) == 12           # 168 x 32 = 5,376 registers a warp: 12 warps of 65,536
    assert per_sm(128, 1, 512) == 16
    assert per_sm(119, 1, 512) == 17         # a warp's 3,808 registers allocated as 3,840
    assert per_sm(53, 1, 512) == 32          # registers for 38: 32 blocks an SM at most
    assert per_sm(159, 8, 16384) == 1
    assert per_sm(79, 8, 4096) == 3
    assert per_sm(32, 4, 16) == 16           # 64 warps an SM
    assert per_sm(32, 1, 100 * 1024) == 2    # shared memory: 228 KB an SM


@pytest.mark.skipif(not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                                                    "cuobjdump")), reason="Triton's package carries no cuobjdump")
def test_the_steps_kernels_compile_for_sm90_and_their_registers_are_read():
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    tool = [sys.executable, "-m", "bench.kernel_resources", "--step", "--rows", "256", "--preset", "0.6b"]
    run = subprocess.run(tool, cwd=Path(__file__).parents[2], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    names = ["Talker one-token attention", "Talker scaled SwiGLU", "code predictor one-token attention",
             "code predictor scaled SwiGLU", "sample_kernel", "codebook0_kernel", "window_attention_kernel"]
    assert len(lines) == len(names)
    for name, line in zip(names, lines):
        m = re.match(rf"0\.6b rows 256 {name} \((\d+) warps\): (\d+) registers a thread, (\d+) bytes of stack "
                     rf"frame, (\d+) shared; (\d+) programs an SM: (\d+) programs in ([\d.]+) waves", line)
        assert m, line
        warps, regs, stack, shared, held, programs = (int(v) for v in m.groups()[:6])
        assert 0 < regs <= 255 and stack >= 0 and held == per_sm(regs, warps, shared)
        assert programs >= 256 and float(m[7]) == pytest.approx(programs / (held * 132), abs=0.006)
