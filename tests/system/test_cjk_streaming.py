"""Chinese streamed one character every 50 ms, without punctuation, against a real `talkgate serve` process
(tiny checkpoint, CPU, native WebSocket protocol): the first audio comes while the text is still streaming,
not after the flush (the streaming tokenizer commits a token once the vocabulary rules out a longer one)."""
from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from tests.serverproc import TalkgateServer

TEXT = "我们今天去公园散步然后一起吃午饭顺便看看新开的书店再坐地铁回家休息一下晚上继续工作"
INTERVAL_S = 0.05


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    with TalkgateServer(tiny_checkpoint) as srv:
        yield srv


def test_chinese_character_by_character_is_heard_before_the_flush(server):
    async def go():
        async with aiohttp.ClientSession() as s:
            ws = await s.ws_connect(server.ws_url + "/v1/ws")
            assert json.loads((await ws.receive(timeout=30)).data)["type"] == "session.ready"
            await ws.send_str(json.dumps({"type": "context.start", "context_id": "zh", "language": "chinese",
                                          "sampling": {"greedy": True}, "fixed_frames": 40}))
            got = {"first_audio": None, "timing": None, "done": None}

            async def read():
                async for msg in ws:
                    now = time.monotonic()
                    if msg.type == aiohttp.WSMsgType.BINARY and got["first_audio"] is None:
                        got["first_audio"] = now
                    elif msg.type == aiohttp.WSMsgType.TEXT:
                        ev = json.loads(msg.data)
                        assert ev["type"] != "error", ev
                        if ev["type"] in ("timing", "context.done"):
                            got["timing" if ev["type"] == "timing" else "done"] = ev
                        if ev["type"] == "context.done":
                            return

            reader = asyncio.create_task(read())
            t_first = time.monotonic()
            for ch in TEXT:
                await ws.send_str(json.dumps({"type": "text", "context_id": "zh", "text": ch}))
                await asyncio.sleep(INTERVAL_S)
            t_flush = time.monotonic()
            await ws.send_str(json.dumps({"type": "flush", "context_id": "zh"}))
            await asyncio.wait_for(reader, 60)
            await ws.close()
            return got, t_first, t_flush

    got, t_first, t_flush = asyncio.run(asyncio.wait_for(go(), 120))
    assert got["first_audio"] is not None and got["done"]["reason"] == "length", got
    first_ms, stream_ms = (got["first_audio"] - t_first) * 1e3, (t_flush - t_first) * 1e3
    print(f"first audio {first_ms:.0f} ms after the first character (server ttfa {got['timing']['ttfa_ms']} ms); "
          f"flush sent at {stream_ms:.0f} ms")
    # the stream lasts about 2 s: audio within its first half (measured on a 2-core CPU: about 130 ms)
    assert first_ms < stream_ms / 2, (first_ms, stream_ms)
