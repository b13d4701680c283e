"""serve --stream-lead against a real server (a gateway worker and an engine process): a WebSocket client's context
carries the lead to the engine, is told it in session.ready, and gets the very audio the HTTP endpoint (never paced)
makes for the same text and seed; where the engine here is fast enough for the lead to bind, no later than it."""
from __future__ import annotations

import asyncio
import json
import struct
import time

import aiohttp
import numpy as np
import pytest

from tests.serverproc import TalkgateServer

HEADER = struct.Struct("<BBHIII")
LEAD_S, FRAMES, TEXT, SEED = 0.3, 30, "A sentence long enough for the lead to matter here.", 3


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    with TalkgateServer(tiny_checkpoint, "--workers", "1", "--stream-lead", str(LEAD_S)) as srv:
        yield srv


async def over_http(s: aiohttp.ClientSession, url: str) -> tuple[bytes, float]:
    body = {"model": "tts", "input": TEXT, "voice": "ryan", "response_format": "pcm", "stream": True,
            "stream_format": "audio", "fixed_frames": FRAMES, "seed": SEED}
    async with s.post(url + "/v1/audio/speech", json=body) as r:
        assert r.status == 200
        chunks, times = [], []
        async for c in r.content.iter_any():
            chunks.append(c)
            times.append(time.perf_counter())
    return b"".join(chunks), times[-1] - times[0]


async def over_websocket(s: aiohttp.ClientSession, url: str) -> tuple[dict, bytes, list[tuple[int, float]]]:
    """session.ready, the context's PCM, and (its start in ms, seconds from the text's send to its arrival) per binary
    frame."""
    async with s.ws_connect(url + "/v1/ws") as ws:
        ready = json.loads((await ws.receive(timeout=60)).data)
        await ws.send_str(json.dumps({"type": "context.start", "context_id": "a", "voice": "ryan",
                                      "fixed_frames": FRAMES, "sampling": {"seed": SEED}}))
        await ws.send_str(json.dumps({"type": "text", "context_id": "a", "text": TEXT}))
        await ws.send_str(json.dumps({"type": "flush", "context_id": "a"}))
        sent = time.perf_counter()
        audio, arrivals = [], []
        while True:
            msg = await ws.receive(timeout=60)
            if msg.type == aiohttp.WSMsgType.BINARY:
                *_, start_ms = HEADER.unpack_from(msg.data)
                audio.append(msg.data[HEADER.size:])
                arrivals.append((start_ms, time.perf_counter() - sent))
                continue
            assert msg.type == aiohttp.WSMsgType.TEXT, msg
            event = json.loads(msg.data)
            assert event["type"] != "error", event
            if event["type"] == "context.done":
                return ready, b"".join(audio), arrivals


def test_a_websocket_context_runs_its_lead_ahead_and_speaks_as_the_unpaced_http_request(server):
    async def go():
        async with aiohttp.ClientSession() as s:
            http_pcm, http_s = await over_http(s, server.url)
            return http_pcm, http_s, *await over_websocket(s, server.ws_url)

    http_pcm, http_s, ready, ws_pcm, arrivals = asyncio.run(asyncio.wait_for(go(), 180))
    assert ready["limits"]["stream_lead_s"] == LEAD_S
    assert len(ws_pcm) == FRAMES * 1920 * 2
    assert np.array_equal(np.frombuffer(ws_pcm, "<i2"), np.frombuffer(http_pcm, "<i2"))     # timing only, never audio
    if http_s > (FRAMES - 1) * 0.08 - LEAD_S - 0.3:
        return          # the engine here is about real time (the 2-core build machine): the lead does not bind
    # the engine counts its player's time from the moment frame 0 could be made, after the text was sent (the real
    # player starts later, at frame 0's arrival: the lead is a bound from below on what it has to play)
    for start_ms, t in arrivals:
        assert t >= start_ms / 1000 - LEAD_S - 0.02, (start_ms, t)
    assert arrivals[-1][1] < (FRAMES - 1) * 0.08 - LEAD_S + 1.0      # woken for each frame when due


def test_talkgate_bench_says_the_servers_stream_lead(server, tmp_path):
    """`talkgate bench` reads the lead from each native session.ready: a paced server's figures say they are paced."""
    from talkgate.cli import bench

    out = tmp_path / "results"
    rc = bench.main(["--url", server.url, "--protocol", "native", "--lang", "en", "--bucket", "short", "--concurrency",
                     "2", "--requests", "2", "--warmup", "0", "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())["summary"]
    assert rc == 0 and summary["stream_leads_s"] == [LEAD_S]
    assert f"| {LEAD_S:g} s |" in (out / "summary.md").read_text()
