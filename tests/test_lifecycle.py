"""/health (liveness), /ready (readiness) and the drain, against real `talkgate serve` processes (tiny, CPU)."""
from __future__ import annotations

import asyncio
import json
import signal
import time

import aiohttp

from tests.serverproc import TalkgateServer


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


async def get(http: aiohttp.ClientSession, url: str) -> tuple[int, dict]:
    async with http.get(url) as r:
        return r.status, await r.json()


def test_health_and_ready_from_warm_up_to_ready(tiny_checkpoint):
    # 1024 slots: the CPU warm-up runs one step at the largest batch, which takes seconds on the tiny model,
    # so the server is seen answering while it is still warming up
    with TalkgateServer(tiny_checkpoint, "--max-contexts", "1024", wait="listening") as srv:
        async def go():
            seen = []
            async with aiohttp.ClientSession() as http:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    health, ready = await get(http, srv.url + "/health"), await get(http, srv.url + "/ready")
                    seen.append((health, ready))
                    if ready[0] == 200:
                        break
                    await asyncio.sleep(0.02)
            return seen

        seen = run(go())
    (h0, b0), (r0, s0) = seen[0]
    assert h0 == 200 and b0["status"] == "ok" and b0["state"] == "starting" and b0["model"]["untrained"] is True
    assert r0 == 503 and s0["ready"] is False and s0["state"] == s0["reason"] == "starting"
    assert all(h == 200 for (h, _), _ in seen)
    assert all(r == 503 and body["reason"] == "starting" for _, (r, body) in seen[:-1])
    (h, health), (r, ready) = seen[-1]
    assert r == 200 and ready == {"ready": True, "state": "ready", "free_slots": 1024, "slots": 1024,
                                  "model": health["model"]}
    assert health["state"] == "ready"


class Native:
    """A native-protocol client: the events it got, the audio bytes per stream, how the socket closed."""

    def __init__(self, ws):
        self.ws, self.events, self.audio = ws, [], 0

    async def send(self, **msg) -> None:
        await self.ws.send_str(json.dumps(msg))

    async def until(self, kind: str) -> dict | None:
        """Events up to the first of type `kind`; None when the socket closed first."""
        while True:
            msg = await self.ws.receive(timeout=60)
            if msg.type == aiohttp.WSMsgType.BINARY:
                self.audio += len(msg.data) - 16
            elif msg.type == aiohttp.WSMsgType.TEXT:
                self.events.append(json.loads(msg.data))
                if self.events[-1]["type"] == kind:
                    return self.events[-1]
            else:
                return None


def test_drain_finishes_contexts_answers_probes_then_closes_1001(tiny_checkpoint):
    """SIGTERM while two contexts wait for more text: /ready says draining at once, /health still
    answers, new sessions and HTTP requests are refused; the context whose text then ends finishes,
    the other is cut off at the deadline, and both sockets close with 1001."""
    deadline_s = 8
    with TalkgateServer(tiny_checkpoint, "--max-contexts", "2", "--shutdown-deadline", str(deadline_s)) as srv:
        async def go():
            out = {}
            async with aiohttp.ClientSession() as http:
                clients = []
                for cid, frames in (("finishes", 30), ("cut", 200)):    # fixed_frames: no eos by chance
                    c = Native(await http.ws_connect(srv.ws_url + "/v1/ws"))
                    await c.until("session.ready")
                    await c.send(type="context.start", context_id=cid, fixed_frames=frames)
                    await c.send(type="text", context_id=cid, text="An LLM is still streaming this sentence ")
                    await c.until("timing")              # audio flows; the text has not ended
                    clients.append(c)
                finishes, cut = clients
                out["full"] = await get(http, srv.url + "/ready")
                srv.proc.send_signal(signal.SIGTERM)
                out["log_start"] = srv.wait_output("draining for up to")
                out["ready"] = await get(http, srv.url + "/ready")
                out["health"] = await get(http, srv.url + "/health")
                late = await http.ws_connect(srv.ws_url + "/v1/ws")
                out["late_ws"] = ((await late.receive()).type, late.close_code)
                async with http.post(srv.url + "/v1/audio/speech", json={"input": "Too late."}) as r:
                    out["late_http"] = (r.status, (await r.json())["error"]["code"])
                t = time.monotonic()
                await finishes.send(type="text", context_id="finishes", text="to its end.")
                await finishes.send(type="flush", context_id="finishes")
                out["done"] = await finishes.until("context.done")
                out["done_before_deadline"] = time.monotonic() - t < deadline_s
                out["finishes_close"] = (await finishes.until("never"), finishes.ws.close_code)
                out["cut_close"] = (await cut.until("never"), cut.ws.close_code, [e["type"] for e in cut.events])
            return out

        out = run(go())
        assert srv.proc.wait(30) == 0
        log = srv.log()
    assert out["full"][0] == 503 and out["full"][1]["reason"] == "full" and out["full"][1]["free_slots"] == 0
    assert "2 context(s) in flight, 2 WebSocket connection(s) open, 2 of them" in out["log_start"]
    assert f"up to {deadline_s} s" in out["log_start"]
    assert out["ready"][0] == 503 and out["ready"][1]["reason"] == "draining"
    assert out["health"][0] == 200 and out["health"][1]["state"] == "draining"
    assert out["late_ws"] == (aiohttp.WSMsgType.CLOSE, 1001)
    assert out["late_http"] == (503, "shutting_down")
    assert out["done"]["reason"] == "length" and out["done"]["frames"] == 30 and out["done_before_deadline"]
    assert out["finishes_close"] == (None, 1001)
    assert out["cut_close"] == (None, 1001, ["session.ready", "context.started", "timing"])
    assert "drain deadline reached after" in log and "cutting off 1 context(s) in flight" in log
    assert "closed 2 WebSocket connection(s) with 1001" in log and "talkgate: stopped" in log


def test_a_second_signal_cuts_the_drain_short(tiny_checkpoint):
    with TalkgateServer(tiny_checkpoint, "--shutdown-deadline", "600") as srv:
        async def go():
            async with aiohttp.ClientSession() as http:
                c = Native(await http.ws_connect(srv.ws_url + "/v1/ws"))
                await c.until("session.ready")
                await c.send(type="context.start", context_id="open", fixed_frames=200)
                await c.send(type="text", context_id="open", text="A context whose text never ends ")
                await c.until("timing")
                srv.proc.send_signal(signal.SIGINT)
                srv.wait_output("draining for up to 600 s")
                srv.proc.send_signal(signal.SIGINT)
                return await c.until("never"), c.ws.close_code

        assert run(go()) == (None, 1001)
        assert srv.proc.wait(30) == 0
    assert "drain cut short by a second signal after" in srv.log() and "cutting off 1 context(s)" in srv.log()
