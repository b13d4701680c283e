"""What the engine-process boundary costs per step (ipc/wire.py over ipc/channel.py), with synthetic steps:

    python -m bench.ipc --batches 1,256 --workers 1,8 --steps 2000

A stand-in engine process speaks the engine's side of the protocol (HELLO -> WELCOME and STATS, COMMANDS
read for the contexts' wire ids) and, for each step, hands every worker its rows as the engine process does
(wire.step_message + Outgoing.send, the code of ipc/engine_server.py EngineServer._deliver; timed) at a fixed
step period. Each worker is a real RemoteEngines on its own event loop and process, whose client only counts the
events it gets (no sessions, no encoding). Measured: the engine thread's time per step for all workers
(pack + send), each worker's time per STEP message (receive, decode, one AudioChunk per row, deliver), and
the one-way latency from the engine's send to the worker's deliver (both clocks are CLOCK_MONOTONIC).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time

import numpy as np

from talkgate.synth.api import FRAME_SAMPLES, AudioChunk, ContextParams, ModelInfo, OpenContext

INFO = ModelInfo(name="synthetic", model_type="custom_voice", size="-", untrained=True, voices=(), languages=("auto",))


def pct(values, q):
    return float(np.percentile(values, q)) if values else None


def engine_side(endpoint: str, workers: int, batch: int, steps: int, period_s: float, out) -> None:
    from talkgate.ipc import channel, wire
    from talkgate.ipc.engine_server import DIRECT_BYTES, SEND_BUFFER
    listener = channel.listen(endpoint)
    flusher = channel.Flusher()
    conns: list[tuple] = []                             # (socket, Reader, Outgoing, wire ids of its contexts)
    per_worker = batch // workers
    while sum(len(c[3]) for c in conns) < per_worker * workers:
        if (sock := channel.accept(listener, SEND_BUFFER)) is not None:
            conns.append((sock, channel.Reader(), channel.Outgoing(sock, flusher.watch, DIRECT_BYTES), []))
        for sock, reader, outgoing, ids in conns:
            channel.receive(sock, reader)
            for parts in reader.messages():
                kind = bytes(parts[0])
                if kind == wire.HELLO:
                    outgoing.send(wire.welcome_message(0, os.getpid(), INFO, "", {"free_slots": 4096,
                                                                                  "state": "ready"}))
                elif kind == wire.COMMANDS:
                    ids += [c[1] for c in wire.decode(parts[1])[1] if c[0] == wire.OPEN]
        time.sleep(0.001)
    block = np.random.default_rng(0).standard_normal((batch, FRAME_SAMPLES)).astype(np.float32)
    times, seq = [], 0
    next_t = time.perf_counter()
    for step in range(steps):
        time.sleep(max(0.0, next_t - time.perf_counter()))
        next_t += period_s
        seq += 1
        now = time.perf_counter()
        # what Engine._emit_audio hands deliver: rows of the step's one copied block (not timed: in-process too)
        batches = [(outgoing, [AudioChunk(c, block[p * per_worker + i], step, 1, now) for i, c in enumerate(ids)])
                   for p, (_, _, outgoing, ids) in enumerate(conns)]
        t0 = time.perf_counter()
        for outgoing, events in batches:        # the engine process's EngineServer._deliver
            outgoing.send(wire.step_message(seq, 4096, events))
        times.append(time.perf_counter() - t0)
        for sock, reader, _, _ in conns:
            channel.receive(sock, reader)
            reader.messages()                           # acknowledgements
    time.sleep(0.5)
    out.put({"engine_ms": [1000 * t for t in times[steps // 10:]]})
    flusher.close()
    for sock, *_ in conns:
        sock.close()
    listener.close()


def worker_side(endpoint: str, index: int, contexts: int, steps: int, out) -> None:
    from talkgate.ipc.remote_engines import RemoteEngines

    class Timed(RemoteEngines):
        def _handle(self, engine, frames, events):
            t0 = time.perf_counter()
            super()._handle(engine, frames, events)
            handle_ms.append(1000 * (time.perf_counter() - t0))

    handle_ms, latency_ms = [], []

    def deliver(events):
        now = time.perf_counter()
        if isinstance(events[0], AudioChunk):                   # not the engine_failed of the stand-in's exit
            latency_ms.append(1000 * (now - events[0].t_emitted))

    async def go():
        remote = Timed([endpoint], worker=index)
        remote.start()
        await remote.wait_info()
        while not remote.ready:
            await asyncio.sleep(0.01)
        client = remote.connect(deliver)
        remote.submit(client, [OpenContext(i, ContextParams()) for i in range(contexts)])
        while len(latency_ms) < steps:                  # one deliver call per STEP message
            await asyncio.sleep(0.05)
        remote.close()

    asyncio.run(go())
    skip = len(handle_ms) // 10
    out.put({"worker_ms": handle_ms[skip:], "latency_ms": latency_ms[skip:]})


def measure(batch: int, workers: int, steps: int, period_s: float) -> dict:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        endpoint = f"ipc://{d}/e.ipc"
        procs = [ctx.Process(target=engine_side, args=(endpoint, workers, batch, steps, period_s, out))]
        procs += [ctx.Process(target=worker_side, args=(endpoint, w, batch // workers, steps, out))
                  for w in range(workers)]
        for p in procs:
            p.start()
        try:
            results = [out.get(timeout=300) for _ in procs]
        finally:
            for p in procs:
                p.join(5)
                if p.is_alive():
                    p.kill()
    engine = next(r["engine_ms"] for r in results if "engine_ms" in r)
    worker = [v for r in results if "worker_ms" in r for v in r["worker_ms"]]
    latency = [v for r in results if "latency_ms" in r for v in r["latency_ms"]]
    return {"batch": batch, "workers": workers, "steps": steps, "period_ms": 1000 * period_s,
            "engine_ms_per_step": {"mean": statistics.mean(engine), "p50": pct(engine, 50), "p99": pct(engine, 99)},
            "worker_ms_per_message": {"mean": statistics.mean(worker), "p50": pct(worker, 50), "p99": pct(worker, 99)},
            "latency_ms": {"p50": pct(latency, 50), "p99": pct(latency, 99), "max": max(latency)}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,256")
    p.add_argument("--workers", default="1,8", help="worker processes the rows are split over")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--period-ms", type=float, default=10.0, help="one step every this many ms")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    rows = []
    for batch in map(int, args.batches.split(",")):
        for workers in map(int, args.workers.split(",")):
            if workers > batch:
                continue
            r = measure(batch, workers, args.steps, args.period_ms / 1000)
            rows.append(r)
            e, w, lat = r["engine_ms_per_step"], r["worker_ms_per_message"], r["latency_ms"]
            print(f"batch {batch:4d}, {workers} worker(s): engine {e['p50']:.3f} ms/step (mean {e['mean']:.3f}, p99 "
                  f"{e['p99']:.3f}); worker {w['p50']:.3f} ms/message (mean {w['mean']:.3f}, p99 {w['p99']:.3f}); "
                  f"send -> deliver p50 {lat['p50']:.3f} p99 {lat['p99']:.3f} ms", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
