"""The canary: a well-behaved native client that streams audio from a server the whole time a fuzz run
hammers it, in its own process (so the fuzzer's own CPU work never delays its clock).

It keeps two contexts in flight, staggered by half a context, so audio never pauses while the server
is healthy, sends a `ping` every second (it is never idle), reads everything at once, and records the
largest gap between two consecutive audio frames. Any error event, a close, or a failed start is a
canary failure: the server let a hostile client disturb a well-behaved one.

Driven over stdin/stdout, one JSON line per command:
    mark   -> what happened since the previous mark (max gap, frames, errors, ...), window reset
    stop   -> cancel, close, final report, exit

    python -m tests.fuzz.canary ws://127.0.0.1:PORT [--api-key KEY]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import struct
import sys
import threading
import time

HEADER = struct.Struct("<BBHIII")
FRAMES = 400                # per context: 32 s of audio, ~5 s of generation on the tiny CPU model
PING_S = 1.0


class Canary:
    def __init__(self, ws):
        self.ws = ws
        self.in_flight: dict[str, int] = {}       # context id -> frames received
        self.stream_of: dict[int, str] = {}
        self.n = 0
        self.last_audio: float | None = None
        self.pings: dict[int, float] = {}
        self.closed: str | None = None
        self.reset_window()

    def reset_window(self) -> None:
        self.w_max_gap = 0.0
        self.w_worst_at = None
        self.w_frames = 0
        self.w_errors: list = []
        self.w_done = 0
        self.w_pong_max = 0.0
        self.w_start = time.monotonic()

    def report(self) -> dict:
        now = time.monotonic()
        # a server that stopped streaming altogether: the open gap counts too
        gap = max(self.w_max_gap, now - self.last_audio if self.last_audio is not None and self.in_flight else 0.0)
        return {"max_gap_ms": round(1000 * gap, 1), "frames": self.w_frames, "errors": self.w_errors,
                "contexts_done": self.w_done, "pong_max_ms": round(1000 * self.w_pong_max, 1),
                "in_flight": len(self.in_flight), "closed": self.closed, "window_s": round(now - self.w_start, 1),
                "worst_gap_at_s": self.w_worst_at}

    async def send(self, **msg) -> None:
        await self.ws.send_str(json.dumps(msg))

    async def start_context(self) -> None:
        self.n += 1
        cid = f"canary-{self.n}"
        self.in_flight[cid] = 0
        await self.send(type="context.start", context_id=cid, fixed_frames=FRAMES, sampling={"seed": self.n})
        await self.send(type="text", context_id=cid, text=f"Canary number {self.n} keeps talking steadily.")
        await self.send(type="flush", context_id=cid)

    async def keep_streaming(self) -> None:
        while self.closed is None:
            youngest = f"canary-{self.n}"
            if len(self.in_flight) < 2 and (not self.in_flight or self.in_flight.get(youngest, FRAMES) >= FRAMES // 2):
                await self.start_context()
            await asyncio.sleep(0.02)

    async def keep_pinging(self) -> None:
        i = 0
        while self.closed is None:
            i += 1
            self.pings[i] = time.monotonic()
            await self.send(type="ping", id=i)
            await asyncio.sleep(PING_S)

    async def read(self) -> None:
        import aiohttp
        while True:
            msg = await self.ws.receive()
            now = time.monotonic()
            if msg.type == aiohttp.WSMsgType.BINARY:
                stream = HEADER.unpack_from(msg.data)[3]
                cid = self.stream_of.get(stream)
                if cid in self.in_flight:
                    self.in_flight[cid] += 1
                if self.last_audio is not None and self.in_flight:
                    gap = now - self.last_audio
                    if gap > self.w_max_gap:
                        self.w_max_gap, self.w_worst_at = gap, round(now - self.w_start, 2)
                self.last_audio = now
                self.w_frames += 1
            elif msg.type == aiohttp.WSMsgType.TEXT:
                ev = json.loads(msg.data)
                kind = ev.get("type")
                if kind == "context.started":
                    self.stream_of[ev["stream"]] = ev["context_id"]
                elif kind == "context.done":
                    self.in_flight.pop(ev["context_id"], None)
                    self.w_done += 1
                elif kind == "pong":
                    sent = self.pings.pop(ev.get("id"), None)
                    if sent is not None:
                        self.w_pong_max = max(self.w_pong_max, now - sent)
                elif kind == "error":
                    self.w_errors.append(ev)
                    if ev.get("context_id") in self.in_flight:
                        self.in_flight.pop(ev["context_id"])
            else:
                self.closed = f"{msg.type.name} code={self.ws.close_code} {msg.extra or ''}".strip()
                return


async def main(url: str, api_key: str | None) -> None:
    import aiohttp

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    loop = asyncio.get_running_loop()
    commands: asyncio.Queue = asyncio.Queue()

    def stdin_reader():      # a thread: asyncio has no portable async stdin
        for line in sys.stdin:
            loop.call_soon_threadsafe(commands.put_nowait, line.strip())
        loop.call_soon_threadsafe(commands.put_nowait, "stop")

    threading.Thread(target=stdin_reader, daemon=True).start()
    async with aiohttp.ClientSession() as session:
        async def connect() -> tuple[Canary, list]:
            ws = await session.ws_connect(url + "/v1/ws", headers=headers, heartbeat=None, max_msg_size=0)
            ready = json.loads((await ws.receive()).data)
            assert ready["type"] == "session.ready", ready
            canary = Canary(ws)
            return canary, [asyncio.create_task(c) for c in (canary.read(), canary.keep_streaming(), canary.keep_pinging())]

        canary, tasks = await connect()
        lost: list[str] = []       # connections that ended in this window (a canary reconnects: later phases go on)
        print(json.dumps({"ready": True}), flush=True)
        while True:
            try:
                cmd = await asyncio.wait_for(commands.get(), 0.2)
            except asyncio.TimeoutError:
                if canary.closed is not None:
                    lost.append(canary.closed)
                    for t in tasks:
                        t.cancel()
                    window = canary
                    try:
                        canary, tasks = await connect()
                    except Exception as e:        # noqa: BLE001 (reported; tried again on the next tick)
                        lost.append(f"reconnect failed: {e!r}")
                        continue
                    # the window goes on: its gaps, errors and frames, and the gap since the last audio
                    canary.w_max_gap, canary.w_errors = window.w_max_gap, window.w_errors
                    canary.w_frames, canary.w_start = window.w_frames, window.w_start
                    canary.w_worst_at, canary.last_audio = window.w_worst_at, window.last_audio
                continue
            if cmd == "mark":
                report = canary.report()
                report["closed"] = "; ".join(lost) or None
                print(json.dumps(report), flush=True)
                canary.reset_window()
                lost = []
            elif cmd == "stop":
                report = canary.report()
                report["closed"] = "; ".join(lost) or None
                if canary.closed is None:
                    canary.closed = "stopped"
                    await canary.send(type="cancel")
                    await asyncio.sleep(0.2)
                    await canary.ws.close()
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                print(json.dumps(report), flush=True)
                return


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("--api-key")
    args = p.parse_args()
    asyncio.run(main(args.url, args.api_key))
