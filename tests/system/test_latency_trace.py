"""`talkgate serve --trace-latency PATH` on the tiny checkpoint (CPU, an engine process and a worker): each HTTP and
native WebSocket request (whole text, and text streamed in deltas) leaves one line with every stage, in order, and
python -m bench.latency_trace prints the budget."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import aiohttp
import pytest

from talkgate.server.latency_trace import STAGES
from tests.serverproc import TalkgateServer


@pytest.fixture(scope="module")
def traced(tiny_checkpoint, tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "latency.jsonl"
    with TalkgateServer(tiny_checkpoint, "--trace-latency", str(path)) as srv:
        yield srv, path


async def http_request(url: str) -> None:
    body = {"input": "Hello from the speech endpoint.", "voice": "ryan", "response_format": "pcm", "stream": True,
            "stream_format": "audio", "fixed_frames": 6}
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/audio/speech", json=body) as r:
        assert r.status == 200
        await r.read()


async def ws_request(ws_url: str, deltas: list[str]) -> None:
    async with aiohttp.ClientSession() as s, s.ws_connect(ws_url + "/v1/ws") as ws:
        assert json.loads((await ws.receive(timeout=30)).data)["type"] == "session.ready"
        await ws.send_str(json.dumps({"type": "context.start", "context_id": "a", "fixed_frames": 6}))
        for delta in deltas:
            await ws.send_str(json.dumps({"type": "text", "context_id": "a", "text": delta}))
            await asyncio.sleep(0.04)           # an LLM's 25 tokens a second
        await ws.send_str(json.dumps({"type": "flush", "context_id": "a"}))
        await until_done(ws)


async def until_done(ws) -> None:
    """The connection's messages up to its context's context.done, none an error."""
    async for msg in ws:
        if msg.type == aiohttp.WSMsgType.TEXT:
            ev = json.loads(msg.data)
            assert ev["type"] != "error", ev
            if ev["type"] == "context.done":
                return


def wait_for_lines(path, n: int, timeout_s: float = 10.0) -> list[dict]:
    """The trace's lines once there are n (the line is written with the first audio, the client may be faster)."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        if len(lines) >= n or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def test_every_stage_in_order_for_http_and_websocket_and_the_summary(traced):
    srv, path = traced

    async def go():
        await http_request(srv.url)
        await ws_request(srv.ws_url, ["Hello there, this is streamed text."])
        await ws_request(srv.ws_url, ["Hello", ",", " this", " is", " streamed", "."])

    asyncio.run(asyncio.wait_for(go(), 120))
    lines = wait_for_lines(path, 3)
    assert [t["endpoint"] for t in lines] == ["http:openai", "ws:native", "ws:native"], lines
    for t in lines:
        assert t["model"] is None, t                                # the default model, the one served
        assert list(t["stages"]) == list(STAGES) and t["held_ms"] == 0.0, t     # no first token alone here
        times = list(t["stages"].values())
        assert times == sorted(times) and t["opened"] <= times[0], t
        assert times[-1] - times[0] < 30e9, t
    http, whole, streamed = lines
    assert http["opened"] == http["stages"]["read"]                 # the request carried the text
    assert streamed["stages"]["read"] - streamed["opened"] >= 30e6  # the first id waited for the second delta
    out = subprocess.run([sys.executable, "-m", "bench.latency_trace", str(path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    for row in ("| engine_received | engine |", "| decoded | engine |", "| written | worker |",
                "| total: read -> written |", "| text wait: opened -> read |"):
        assert row in out.stdout, out.stdout


def test_a_held_first_audio_is_traced_when_it_goes_out(traced):
    """A first token committed alone ("好的") has its frame 0 held (sessions/session.py first_hold_s): its line is
    written once that audio goes out, after the hold and before the next text, and says how long it was held."""
    from talkgate.sessions.session import FIRST_HOLD_MAX_S, FIRST_HOLD_S

    srv, path = traced
    before = len(wait_for_lines(path, 0, 0))

    async def go() -> list[dict]:
        async with aiohttp.ClientSession() as s, s.ws_connect(srv.ws_url + "/v1/ws") as ws:
            assert json.loads((await ws.receive(timeout=30)).data)["type"] == "session.ready"
            await ws.send_str(json.dumps({"type": "context.start", "context_id": "zh", "language": "chinese",
                                          "fixed_frames": 6}))
            await ws.send_str(json.dumps({"type": "text", "context_id": "zh", "text": "好的"}))
            while (await ws.receive(timeout=30)).type != aiohttp.WSMsgType.BINARY:
                pass                                # its first audio, with no more text
            lines = await asyncio.to_thread(wait_for_lines, path, before + 1)
            await ws.send_str(json.dumps({"type": "text", "context_id": "zh", "text": "，我们走吧。"}))
            await ws.send_str(json.dumps({"type": "flush", "context_id": "zh"}))
            await until_done(ws)
            return lines

    lines = asyncio.run(asyncio.wait_for(go(), 120))
    assert len(lines) == before + 1, lines
    t = lines[-1]
    assert t["endpoint"] == "ws:native" and list(t["stages"]) == list(STAGES), t
    times = list(t["stages"].values())
    assert times == sorted(times), t
    held_ms = t["held_ms"]
    assert 0.75 * FIRST_HOLD_S * 1e3 <= held_ms < 1000 * FIRST_HOLD_MAX_S + 200, t
    assert (t["stages"]["encoded"] - t["stages"]["received"]) / 1e6 >= held_ms, t    # the hold is in that stage
    assert len(wait_for_lines(path, before + 2, 1.0)) == before + 1         # one line a request
