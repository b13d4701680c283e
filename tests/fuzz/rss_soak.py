"""Where the open fuzz server's memory goes under mixed load: the RSS of each of its processes over time.

    python -m tests.fuzz.rss_soak --seconds 600 --every 30 --settle 60 > /tmp/soak.tsv

Starts the open campaign server of tests/system/test_fuzz.py (same arguments, warm-up and canary), runs its
mixed load (`mixed_load`) for --seconds, lets the server settle for --settle seconds with only the
canary, and prints one line per process per sample: seconds, phase, process (supervisor, engine N,
worker N), pid, VmRSS, RssAnon, RssFile (MB), threads, open file descriptors, and the total. The
release check's RSS bound (harness.py, RSS_TOLERANCE) is over the total; this says which process
moves it, and whether it levels off (docs/reliability.md, the release check).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from talkgate.synth.checkpoint import create_checkpoint
from tests.system import test_fuzz
from tests.fuzz.harness import Campaign, Phase, children


def role(pid: int, server_pid: int) -> str:
    if pid == server_pid:
        return "supervisor"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    if b"talkgate.processes.engine_process" in argv:
        return "engine " + argv[argv.index(b"--index") + 1].decode()
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        cfg = next(e for e in env if e.startswith(b"TALKGATE_WORKER="))
        return f"worker {json.loads(cfg.split(b'=', 1)[1])['index']}"
    except (OSError, StopIteration):
        return f"pid {pid}"


def status_mb(pid: int) -> dict[str, float]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(rest.split()[0]) / 1024
            elif key == "Threads":
                out[key] = int(rest)
    return out


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def sample(server_pid: int, t0: float, phase: str) -> None:
    t = time.monotonic() - t0
    total = 0.0
    for pid in [server_pid, *children(server_pid)]:
        try:
            s = status_mb(pid)
        except OSError:
            continue
        total += s["VmRSS"]
        print(f"{t:.0f}\t{phase}\t{role(pid, server_pid)}\t{pid}\t{s['VmRSS']:.1f}\t{s['RssAnon']:.1f}\t"
              f"{s['RssFile']:.1f}\t{s['Threads']}\t{open_fds(pid)}", flush=True)
    print(f"{t:.0f}\t{phase}\ttotal\t-\t{total:.1f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--every", type=float, default=30)
    ap.add_argument("--settle", type=float, default=60)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        # the checkpoint of the test suite's tiny_checkpoint fixture
        ckpt = create_checkpoint(Path(tmp) / "tiny-custom_voice", preset="tiny", variant="custom_voice", seed=0)
        return soak(ckpt, args)


def soak(ckpt: Path, args) -> int:
    with Campaign(ckpt, *test_fuzz.OPEN_ARGS) as camp:
        pid, t0 = camp.server.pid, time.monotonic()
        print("s\tphase\tprocess\tpid\tVmRSS\tRssAnon\tRssFile\tthreads\tfds", flush=True)
        sample(pid, t0, "baseline")
        stop, state = threading.Event(), {"phase": "load"}

        def sampler():
            while not stop.wait(args.every):
                sample(pid, t0, state["phase"])

        threading.Thread(target=sampler, daemon=True).start()
        phase = Phase("soak", camp.server.log_mark(), 0.0, 0.0)

        asyncio.run(test_fuzz.mixed_load(camp, phase, args.seconds))
        state["phase"] = "settle"
        time.sleep(args.settle)
        stop.set()
        camp.canary.stop()
        camp.canary = None
        time.sleep(5)
        sample(pid, t0, "canary stopped")
        print(f"# {len(phase.failures)} failures; counts {dict(phase.counts)}", file=sys.stderr)
        for f in phase.failures[:10]:
            print("#", f[:300], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
