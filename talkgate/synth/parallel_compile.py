"""A fresh start's compiles spread over helper processes.

On an empty compile cache, warm-up meets every kind of input of the compiled functions and every Triton
kernel one after another: 207-231 s of a 1.7B start on an H100, nearly all of it Dynamo, Inductor and
Triton compiling on one core (docs/benchmarks.md, issue 22). The kinds do not depend on each other, so
while the engine process loads the model, helper processes (`python -m talkgate.synth.parallel_compile`),
each with a model of the checkpoint's shapes (zeros: no weights read) and a runner of 2 slots, run some of
warm-up's parts once (Runner.compile_kinds), which compiles their kinds into the shared caches
(compile_cache.py: Inductor's and Triton's; precompiled.py: the traced functions, written whole or not at
all); the engine's own warm-up then loads them as a restart does. An engine process whose slots come from a
share of the GPU (runner_build.py) starts them once its weights are loaded and its slots sized, at its own
largest batch. A helper that fails or overruns costs only time: warm-up compiles whatever it finds missing.
Measured (H200, 1.7B): ready 67 s after the start on an empty cache, the longest helper (the decoder's step at
256 rows, one task then) 40 s after its 11-s load.

    helpers = start(root, device, dtype, decoder_dtype, max_prompt, max_frames, batch, marker)   # load_runner
    ... the engine process loads the model meanwhile ...
    helpers.wait()                      # all but the LATE tasks' helper
    ... warm-up; the engine serves; between steps, Runner.adopt_compiles: helpers.late_done() ...

Skipped where a warm-up of this code has run to its end with this cache (the runner's warmed marker), and
where fewer than two helpers fit (cores, GPU memory). One process per cache and device starts helpers (two lock
files beside the marker, one held until all but the LATE tasks' helper have ended, one until that one has): another
engine process on the same GPU (`--engines N`, or a model of the same shapes) waits for the first only, instead of
compiling the same kinds again, loads what they wrote, and takes the LATE tasks' kernels once the second is let go,
as the process that started them does (a fresh start of three 1.7B models waited 25 s longer for the LATE
tasks' helper, docs/benchmarks.md "Several models"). Engines on other GPUs start their own (the compiled
functions' guards name the device, so a kind compiled on one GPU is compiled again for another).
"""
from __future__ import annotations

import argparse
import fcntl
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from talkgate.system.childproc import die_with_parent, usable_cores

log = logging.getLogger("talkgate.parallel_compile")

# warm-up's parts (Runner.compile_kinds), with their seconds in 8 helpers at once on an empty cache, 1.7B on an
# H100 (docs/benchmarks.md, 2026-11-27): the longest go to helpers first. B: the largest batch.
TASKS = {"codes@2": 39, "early_convs@B": 32, "early_convs@1": 27, "prefill@max": 22, "late_convs@B": 21,
         "codes@B": 20, "codes@1": 20, "late_convs@1": 19, "prefill@16": 17, "talker@1": 11, "prefill@32": 9,
         "talker@B": 5, "decode@B": 4, "decode@1": 3, "talker@2": 2}
# The persistent kernels of two rows (synth/persistent.py): one Triton kernel took 52 s of them, 28 s of it in
# one compiler pass. Until their helper is done the engine runs two rows with the general kinds (0.6 ms a step
# slower at two rows) and is ready without them; then it captures the two-row graphs again (Runner.adopt_compiles).
# They share one helper: with one each (10 processes on an H100 machine) two 1.7B helpers failed as they started.
LATE = ("codes@2", "talker@2")
HELPER_GPU_BYTES = 4 << 30       # a helper's GPU memory beside the weights (its 2 slots, the step at B rows, CUDA's
                                 # context): 8,146-8,576 MiB a helper beside a 1.7B checkpoint's 4.52 GB of files (H100,
                                 # 2026-12-07)
CORES_PER_HELPER = 2             # Dynamo and Inductor on one, Inductor's parallel Triton compiles beside it
HELPER_LIMIT_S = 600.0           # a helper still running after this is taken for a hung compile and killed (warm-up
                                 # compiles the rest); the same bound as serve's --warmup-stall default


def plan(batch: int, helpers: int) -> list[list[str]]:
    """TASKS for a largest batch of `batch` rows: all but the LATE ones over `helpers` helpers, longest first, each
    to the least loaded helper so far; then the LATE ones, to a helper of their own (the last group)."""
    loads: list[tuple[float, list[str]]] = [(0.0, []) for _ in range(max(1, helpers))]
    for task, cost in sorted(TASKS.items(), key=lambda kv: -kv[1]):
        if task in LATE:
            continue
        i = min(range(len(loads)), key=lambda j: loads[j][0])
        loads[i] = (loads[i][0] + cost, loads[i][1] + [task.replace("@B", f"@{batch}")])
    return [tasks for _, tasks in loads if tasks] + [list(LATE)]


def helper_count(cores: int, free_gpu_bytes: int, weight_bytes: int) -> int:
    """Helpers that fit for the tasks but the LATE ones: CORES_PER_HELPER cores each (the LATE tasks' helper,
    mostly one core of Triton's compiler, comes on top), the weights and HELPER_GPU_BYTES each in the GPU's free
    memory, the LATE tasks' helper's too; at most one per task."""
    most = len(TASKS) - len(LATE)
    return max(0, min(most, cores // CORES_PER_HELPER, free_gpu_bytes // (weight_bytes + HELPER_GPU_BYTES) - 1))


def hold(lock: Path) -> int | None:
    """An open descriptor holding the lock file `lock` (closing it releases the lock; so does the process's
    end, however it ends), or None where another process holds it."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _import_compiler() -> None:
    """What loading the first compiled artifact imports (2 s of the warm-up that follows), while helpers work."""
    import torch._dynamo  # noqa: F401
    import torch._inductor.codecache  # noqa: F401
    import torch._inductor.output_code  # noqa: F401


class Helpers:
    """The helper processes of one fresh start, holding the cache's locks: wait() returns once all but the LATE
    tasks' helper (the last group) have ended, and lets the first lock go; late_done() says when that helper has
    ended, and lets the LATE lock go then (beside it, the LATE_OK file where the helper compiled its tasks)."""

    def __init__(self, procs: list[subprocess.Popen], groups: list[list[str]], lock: int | None,
                 late_lock: int | None, late_ok_path: Path):
        self.procs, self.groups, self.t0 = procs, groups, time.perf_counter()
        self.lock, self.late_lock, self.late_ok_path = lock, late_lock, late_ok_path
        self.late = len(procs) - 1                     # plan() puts the LATE tasks last
        self.ended: dict[int, float] = {}
        self.late_ok: bool | None = None

    def wait(self) -> None:
        _import_compiler()
        while any(i not in self.ended for i in range(self.late)):
            self._poll()
            time.sleep(0.05)
        if self.lock is not None:               # another engine process of this cache may load their kinds now
            os.close(self.lock)
            self.lock = None
        last = max(range(self.late), key=self.ended.get)
        log.info("compile helpers done in %.1f s (the last: %s); %s %s", self.ended[last], ",".join(self.groups[last]),
                 ",".join(self.groups[self.late]), "too" if self.late in self.ended else "in the background")

    def late_done(self) -> bool | None:
        """None while the LATE tasks' helper runs; then whether it compiled them (the lock is let go then)."""
        if self.late_ok is not None:
            return self.late_ok
        self._poll()
        if self.late not in self.ended:
            return None
        self.late_ok = self.procs[self.late].returncode == 0
        if self.late_lock is not None:
            if self.late_ok:
                self.late_ok_path.touch()
            os.close(self.late_lock)
            self.late_lock = None
        log.info("compile helper for %s %s after %.1f s", ",".join(self.groups[self.late]),
                 "done" if self.late_ok else "failed", self.ended[self.late])
        return self.late_ok

    def wait_late(self) -> bool:
        """Wait for the LATE tasks' helper too (`talkgate warmup`); whether it compiled them."""
        while (ok := self.late_done()) is None:
            time.sleep(0.1)
        return ok

    def _poll(self) -> None:
        late = time.perf_counter() - self.t0 > HELPER_LIMIT_S
        for i, proc in enumerate(self.procs):
            if i in self.ended:
                continue
            if late and proc.poll() is None:
                proc.kill()
            if proc.poll() is not None:
                self.ended[i] = time.perf_counter() - self.t0
                if proc.returncode:
                    log.warning("compile helper for %s ended with %s: warm-up compiles what it left",
                                ",".join(self.groups[i]), proc.returncode)


class OtherProcessHelpers:
    """Another process's helpers filling the same cache: wait() returns once that process releases the first lock
    (all but its LATE tasks' helper ended, or it died), at most HELPER_LIMIT_S later; late_done() is None while it
    holds the LATE lock, then whether its LATE tasks' helper compiled them (the LATE_OK file)."""

    def __init__(self, locks: tuple[Path, Path], late_ok_path: Path):
        self.locks, self.late_ok_path, self.t0 = locks, late_ok_path, time.perf_counter()

    def wait(self) -> None:
        _import_compiler()
        while (fd := hold(self.locks[0])) is None:
            if time.perf_counter() - self.t0 > HELPER_LIMIT_S:
                log.warning("the compile helpers of another process still hold %s after %.0f s: warm-up compiles "
                            "what they left", self.locks[0], HELPER_LIMIT_S)
                return
            time.sleep(0.1)
        os.close(fd)
        log.info("another process's compile helpers done %.1f s later", time.perf_counter() - self.t0)

    def late_done(self) -> bool | None:
        fd = hold(self.locks[1])
        if fd is None:
            return None
        os.close(fd)
        return self.late_ok_path.exists()

    def wait_late(self) -> bool:
        while (ok := self.late_done()) is None:
            time.sleep(0.1)
        return ok


def start(root: Path, device, dtype, decoder_dtype, max_prompt: int, max_frames: int, batch: int,
          marker: Path) -> Helpers | OtherProcessHelpers | None:
    """Helpers compiling warm-up's kinds, unless `marker` (a finished warm-up) exists or fewer than two fit;
    started before this process loads the model (their GPU memory is counted from the checkpoint's files).
    Where another process's helpers are filling this cache, those to wait for."""
    import torch

    if marker.exists():
        return None
    name = f"compile-helpers-{str(device).replace(':', '')}"
    locks = (marker.parent / f"{name}.lock", marker.parent / f"{name}.late.lock")
    late_ok_path = marker.parent / f"{name}.late-ok"
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        # the LATE lock first: a process that finds it held while the first is free comes after another's
        # helpers have done all but the LATE tasks, and waits for those only
        late_lock = hold(locks[1])
        lock = hold(locks[0]) if late_lock is not None else None
    except OSError as e:                # a read-only cache: nothing a helper compiled could be kept either
        log.warning("fresh compile cache: no compile helpers, their lock cannot be written (%s)", e)
        return None
    if lock is None:
        if late_lock is not None:
            os.close(late_lock)
        log.info("fresh compile cache: another process's compile helpers fill it; waiting for them")
        return OtherProcessHelpers(locks, late_ok_path)
    late_ok_path.unlink(missing_ok=True)       # an earlier start's, whose warm-up did not end
    free, _ = torch.cuda.mem_get_info(device)
    weights = sum(p.stat().st_size for p in Path(root).rglob("*.safetensors"))
    cores = usable_cores()
    n = helper_count(cores, free - weights, weights)       # this process loads the weights too
    if n < 2:
        log.info("fresh compile cache: compiling in warm-up (%d cores, %.1f GiB free: room for %d helpers)",
                 cores, free / 2**30, n)
        os.close(lock)
        os.close(late_lock)
        return None
    groups = plan(batch, n)
    total = sum(TASKS.values())
    procs = []
    for tasks in groups:
        # Inductor's parallel Triton compiles: a share of the cores by the helper's expected work
        share = sum(TASKS[t.replace(f"@{batch}", "@B")] for t in tasks) / total
        env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS=str(max(2, round(cores * share))))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "talkgate.synth.parallel_compile", "--model", str(root), "--device", str(device),
             "--dtype", str(dtype).removeprefix("torch."), "--decoder-dtype", str(decoder_dtype).removeprefix("torch."),
             "--max-prompt", str(max_prompt), "--max-frames", str(max_frames), "--batch", str(batch),
             "--tasks", ",".join(tasks)], env=env))
    log.info("fresh compile cache: %d helper processes compile %s", len(procs),
             "; ".join(",".join(tasks) for tasks in groups))
    return Helpers(procs, groups, lock, late_lock, late_ok_path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m talkgate.synth.parallel_compile",
                                description="a compile helper of a fresh start (started by load_runner)")
    p.add_argument("--model", required=True)
    p.add_argument("--device", required=True)
    p.add_argument("--dtype", required=True)
    p.add_argument("--decoder-dtype", required=True)
    p.add_argument("--max-prompt", type=int, required=True)
    p.add_argument("--max-frames", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--tasks", required=True, help="comma-separated: prefill, PART@1, PART@2, PART@<batch>")
    args = p.parse_args(argv)
    die_with_parent()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s compile-helper %(name)s %(levelname)s %(message)s")
    import torch

    from talkgate.synth.loader import load_tts
    from talkgate.synth.runner import Runner, compile_folder

    t0 = time.perf_counter()
    device = torch.device(args.device)
    dtype, decoder_dtype = getattr(torch, args.dtype), getattr(torch, args.decoder_dtype)
    tts = load_tts(args.model, device=device, dtype=dtype, decoder_dtype=decoder_dtype, weights=False)   # shapes
    cuda = device.type == "cuda"
    runner = Runner(tts, num_slots=2, max_frames=args.max_frames, max_prompt=args.max_prompt, max_batch=args.batch,
                    device=device, dtype=dtype, cuda_graphs=False,
                    compile_folder=compile_folder(tts.config, tts.path, device, dtype, decoder_dtype) if cuda else None)
    torch.backends.cudnn.benchmark = False       # its algorithm choices die with this process
    loaded = time.perf_counter()
    runner.compile_kinds(args.tasks.split(","))
    log.info("%s compiled in %.1f s after a %.1f s load: %s", args.tasks, time.perf_counter() - loaded, loaded - t0,
             ", ".join(f"{what} {sec:.1f} s" for what, sec in runner.warmup_profile))
    logging.shutdown()
    os._exit(0)         # what is compiled is on disk: not the seconds Inductor's worker pool takes to wind down


if __name__ == "__main__":
    sys.exit(main())
