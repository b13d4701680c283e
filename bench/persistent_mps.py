"""The persistent kernels (synth/persistent.py) of several processes at once on one GPU, as engine processes that
share it under CUDA MPS run them: whether two grid-barrier kernels ever wait for each other for ever, launched as
cooperative grids (the engine's way) and plainly; and what a cooperative launch costs a process alone.

    python -m bench.persistent_mps --procs 3 --seconds 20 [--plain] [--json out.json]

Each process builds the Talker and code predictor at a published size (random weights, bench.persistent.build),
compiles the kernels, waits until every process is ready, then runs the Talker's step and the predictor's frame
at one row in a loop (ten launches of each in flight, then a synchronize) and reports its count twice a second.
A process whose count stops for --stall seconds has stalled (the GPU waits for ever): every process is killed then.
Run it with CUDA_MPS_PIPE_DIRECTORY set to a running daemon's pipe folder to make the processes MPS clients.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time


def child(size: str, seconds: float, plain: bool) -> None:
    import torch

    from bench.persistent import DEV, DT, build, sampler
    from talkgate.synth import persistent

    persistent.COOPERATIVE = not plain
    talker, predictor = build(size)
    H = talker.hidden_size
    g = torch.Generator(device=DEV).manual_seed(1)
    x, hidden, code0 = (torch.randn(1, H, device=DEV, generator=g).to(DT) for _ in range(3))
    slots, pos = torch.tensor([1], device=DEV), torch.tensor([40], device=DEV)
    cos, sin = (t[:, 0].contiguous() for t in talker.rope(pos[:, None]))
    s = sampler(1)

    def once():
        persistent.talker_step(talker, x, cos, sin, slots, pos)
        persistent.predict(predictor, hidden, code0, s.p, s.counter, s.slots)

    once()
    torch.cuda.synchronize()
    print("ready", flush=True)
    sys.stdin.readline()
    n, t0 = 0, time.perf_counter()
    last = t0
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            once()
        torch.cuda.synchronize()
        n += 10
        if time.perf_counter() - last >= 0.5:
            print("count", n, flush=True)
            last = time.perf_counter()
    print("done", n, round(time.perf_counter() - t0, 3), flush=True)


class Proc:
    def __init__(self, args, i: int):
        cmd = [sys.executable, "-m", "bench.persistent_mps", "--child", "--size", args.size,
               "--seconds", str(args.seconds)] + (["--plain"] if args.plain else [])
        self.i = i
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  start_new_session=True)
        self.ready = threading.Event()
        self.count, self.changed, self.done = 0, time.monotonic(), None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            word, *rest = line.split()
            if word == "ready":
                self.ready.set()
            elif word == "count":
                self.count, self.changed = int(rest[0]), time.monotonic()
            elif word == "done":
                self.done = (int(rest[0]), float(rest[1]))

    def kill(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", type=int, default=3)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--size", default="1.7b")
    p.add_argument("--plain", action="store_true", help="plain launches, not cooperative grids")
    p.add_argument("--stall", type=float, default=15.0)
    p.add_argument("--json")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args.size, args.seconds, args.plain)
    procs = [Proc(args, i) for i in range(args.procs)]
    stalled = []
    try:
        for pr in procs:
            if not pr.ready.wait(600):
                raise SystemExit(f"process {pr.i} never got ready (exit {pr.p.poll()})")
        for pr in procs:
            pr.changed = time.monotonic()
            pr.p.stdin.write("go\n")
            pr.p.stdin.flush()
        while any(pr.done is None for pr in procs):
            time.sleep(0.2)
            now = time.monotonic()
            stalled = [pr.i for pr in procs if pr.done is None and now - pr.changed > args.stall]
            if stalled or any(pr.p.poll() not in (None, 0) for pr in procs):
                break
    finally:
        for pr in procs:
            if pr.done is None:
                pr.kill()
    result = {"procs": args.procs, "size": args.size, "launch": "plain" if args.plain else "cooperative",
              "mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")), "stalled": stalled,
              "iterations_per_s": [round(pr.done[0] / pr.done[1], 1) if pr.done else None for pr in procs],
              "counts": [pr.count for pr in procs]}
    print(json.dumps(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
