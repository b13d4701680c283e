"""One-way latency of a small message between two processes at a low rate (each message after an idle gap, as a
1-req/s server sees them): the engine boundary's transport (ipc/channel.py: an AF_UNIX stream socket written by
the sending thread) against ZMQ ROUTER/DEALER over ipc:// (the boundary before 2026-11-29, with an I/O thread in
each process; measured when pyzmq is installed), each received on an asyncio loop (a gateway worker) and in a
blocking poll (an engine process waiting for commands).

    python -m bench.wakeup --messages 300 --gap-ms 20 [--spin]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import select
import struct
import tempfile
import time

import numpy as np

HEAD = struct.Struct("<Iq")         # payload length, send time (CLOCK_MONOTONIC ns)


def have_zmq() -> bool:
    try:
        import zmq  # noqa: F401
    except ImportError:
        return False
    return True


def sender(kind: str, path: str, n: int, gap_s: float, size: int, ready) -> None:
    payload = b"x" * size
    ready.wait()
    time.sleep(0.2)
    if kind == "zmq":
        import zmq
        ctx = zmq.Context(io_threads=1)
        s = ctx.socket(zmq.DEALER)
        s.connect("ipc://" + path)
        time.sleep(0.3)
        for _ in range(n):
            time.sleep(gap_s)
            s.send_multipart([b"M", HEAD.pack(size, time.monotonic_ns()), payload], copy=False)
        time.sleep(0.2)
        s.close(linger=100)
        ctx.term()
    else:
        from talkgate.ipc import channel
        s = channel.connect("ipc://" + path)
        out = channel.Outgoing(s)
        for _ in range(n):
            time.sleep(gap_s)
            out.send([b"M", HEAD.pack(size, time.monotonic_ns()), payload])
            while out.pending:
                out.flush()
        time.sleep(0.2)
        s.close()


def take_until(n: int, lat: list, wait: str, fd: int, take, poll_once) -> None:
    """Call take() as messages come until lat holds n: on an asyncio loop's reader of fd, after each poll_once()
    that says something came, or spinning."""
    if wait == "loop":
        loop = asyncio.new_event_loop()
        done = loop.create_future()

        def readable():
            take()
            if len(lat) >= n and not done.done():
                done.set_result(None)
        loop.add_reader(fd, readable)
        loop.call_soon(readable)            # ZMQ's descriptor is edge-triggered: what came before is read now
        loop.run_until_complete(asyncio.wait_for(done, 60))
        loop.close()
        return
    while len(lat) < n:
        if wait == "spin" or poll_once():
            take()


def receiver(kind: str, wait: str, path: str, n: int, ready, out) -> None:
    lat = []
    if kind == "zmq":
        import zmq
        ctx = zmq.Context(io_threads=1)
        s = ctx.socket(zmq.ROUTER)
        s.bind("ipc://" + path)
        ready.set()

        def take():
            while True:
                try:
                    frames = s.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    return
                lat.append(time.monotonic_ns() - HEAD.unpack(frames[2])[1])
        take_until(n, lat, wait, s.FD, take, lambda: s.poll(1000, zmq.POLLIN))
        s.close(linger=0)
        ctx.term()
    else:
        from talkgate.ipc import channel
        srv = channel.listen("ipc://" + path)
        ready.set()
        while (c := channel.accept(srv)) is None:
            time.sleep(0.001)
        reader = channel.Reader()

        def take():
            try:
                while channel.receive(c, reader):
                    pass
            except channel.Closed:
                pass
            now = time.monotonic_ns()
            lat.extend(now - HEAD.unpack(parts[1])[1] for parts in reader.messages())
        p = select.poll()
        p.register(c.fileno(), select.POLLIN)
        take_until(n, lat, wait, c.fileno(), take, lambda: p.poll(1000))
        c.close()
        srv.close()
    out.put(lat)


def run(kind: str, wait: str, n: int, gap_s: float, size: int) -> dict:
    path = os.path.join(tempfile.mkdtemp(), "s")
    ready, out = mp.Event(), mp.Queue()
    r = mp.Process(target=receiver, args=(kind, wait, path, n, ready, out))
    s = mp.Process(target=sender, args=(kind, path, n, gap_s, size, ready))
    r.start()
    s.start()
    lat = np.array(out.get(timeout=120)[5:]) / 1e6
    r.join()
    s.join()
    return {"transport": kind, "receiver": wait, "n": len(lat), "p50_ms": round(float(np.percentile(lat, 50)), 3),
            "p95_ms": round(float(np.percentile(lat, 95)), 3), "max_ms": round(float(lat.max()), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=300)
    ap.add_argument("--gap-ms", type=float, default=20.0)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--spin", action="store_true", help="also a receiver that spins on a non-blocking read")
    a = ap.parse_args()
    waits = ["loop", "poll"] + (["spin"] if a.spin else [])
    for wait in waits:
        for kind in (("zmq", "unix") if have_zmq() else ("unix",)):
            print(json.dumps(run(kind, wait, a.messages, a.gap_ms / 1000, a.size)), flush=True)


if __name__ == "__main__":
    main()
