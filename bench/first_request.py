"""What a gateway worker's first request pays that later ones do not (issue 45: at 1 req/s each worker's first
request is in the p95), by the server's own stamps: `talkgate serve --workers 1 --trace-latency` is started RUNS
times; each time, once ready, N OpenAI HTTP speech requests one after another (PCM, a few fixed frames); then
the worker's stages (read -> parsed -> tokenized -> sent) of request 1 against the requests after it, p50 ms.

    python -m bench.first_request --model CKPT [--device cpu] [--runs 8] [--requests 8] [--tree DIR]

--tree: the repository whose talkgate is served (an earlier tree, to compare; default this one).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.latency_trace import read_traces
from talkgate.server.latency_trace import WORKER_BEFORE

BODY = {"input": "Hello there, this is a test.", "voice": "ryan", "response_format": "pcm", "fixed_frames": 4}


def serve_once(tree: Path, model: str, device: str, port: int, requests: int, trace: Path) -> list[list[float]]:
    """One server's requests' worker stages (ms each, in WORKER_BEFORE's order after `read`), in the order sent."""
    log = open(trace.with_suffix(".log"), "w")
    server = subprocess.Popen([sys.executable, "-m", "talkgate", "serve", "--model", model, "--device", device,
                               "--workers", "1", "--port", str(port), "--trace-latency", str(trace)],
                              cwd=tree, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not ready(port):
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the server did not get ready:\n" + trace.with_suffix(".log").read_text()[-2000:])
            time.sleep(0.2)
        time.sleep(1.0)
        for _ in range(requests):
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/audio/speech", json.dumps(BODY).encode(),
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                r.read()
            time.sleep(0.2)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
        log.close()
    return [[(t["stages"][b] - t["stages"][a]) / 1e6 for a, b in zip(WORKER_BEFORE, WORKER_BEFORE[1:])]
            for t in sorted(read_traces(str(trace)), key=lambda t: t["stages"]["read"])]


def ready(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=1).status == 200
    except OSError:
        return False


def table(runs: list[list[list[float]]]) -> str:
    """Request 1's stages (p50 over the runs, and each run's) against the later requests' (p50 of all)."""
    first = [run[0] for run in runs if run]
    later = [row for run in runs for row in run[1:]]
    lines = ["| stage | request 1 p50 ms | request 1, each run | requests 2+ p50 ms |", "| --- | --- | --- | --- |"]
    for k, stage in enumerate(WORKER_BEFORE[1:]):
        lines.append(f"| {stage} | {statistics.median(r[k] for r in first):.3f} | "
                     f"{' '.join(f'{r[k]:.2f}' for r in first)} | {statistics.median(r[k] for r in later):.3f} |")
    lines.append(f"| read -> sent | {statistics.median(sum(r) for r in first):.3f} | | "
                 f"{statistics.median(sum(r) for r in later):.3f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--port", type=int, default=8391)
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        runs = [serve_once(a.tree, a.model, a.device, a.port, a.requests, Path(tmp) / f"trace-{i}.jsonl")
                for i in range(a.runs)]
    print(f"{a.tree}: {a.runs} servers, {a.requests} requests each\n")
    print(table(runs))


if __name__ == "__main__":
    main()
