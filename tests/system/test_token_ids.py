"""Text as token ids against a real `talkgate serve` process (mini checkpoint, CPU, native WebSocket): a context
streamed as its text's token ids speaks exactly what the same text streamed as text deltas speaks (greedy, the
same frames), and its first audio comes before its last id is sent. The mini checkpoint, not the tiny one: the tiny
one's random weights speak the same audio whatever the text, so that equal audio would prove nothing."""
from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from talkgate.loadgen.measure import token_deltas
from talkgate.synth.checkpoint import create_checkpoint
from talkgate.synth.tokenizer import QwenTokenizer
from tests.serverproc import TalkgateServer

TEXT = "Thanks for calling, your order shipped this morning and should arrive on Thursday."
OTHER = "Zebras quietly dance under purple moons while the old lighthouse keeper hums a tune."
INTERVAL_S = 0.04       # 25 tokens a second, as an LLM streams


@pytest.fixture(scope="module")
def mini_checkpoint(tmp_path_factory):
    return create_checkpoint(tmp_path_factory.mktemp("ckpt") / "mini", preset="mini", variant="custom_voice", seed=0)


@pytest.fixture(scope="module")
def server(mini_checkpoint):
    with TalkgateServer(mini_checkpoint) as srv:
        yield srv


async def speak(ws, cid: str, messages: list[dict]) -> tuple[bytes, float, float]:
    """One context: its messages one every INTERVAL_S, then a flush -> (its audio, the time of its first audio and
    of its last message, monotonic)."""
    await ws.send_str(json.dumps({"type": "context.start", "context_id": cid, "sampling": {"greedy": True},
                                  "fixed_frames": 24, "format": {"encoding": "pcm_f32le", "sample_rate": 24000}}))
    audio, first = [], []

    async def read():
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.BINARY:
                first.append(time.monotonic())
                audio.append(msg.data[16:])             # the 16-byte header, then the samples
            elif msg.type == aiohttp.WSMsgType.TEXT:
                ev = json.loads(msg.data)
                assert ev["type"] != "error", ev
                if ev["type"] == "context.done":
                    return

    reader = asyncio.create_task(read())
    for m in messages:
        await ws.send_str(json.dumps({"type": "text", "context_id": cid, **m}))
        await asyncio.sleep(INTERVAL_S)
    t_last = time.monotonic()
    await ws.send_str(json.dumps({"type": "flush", "context_id": cid}))
    await asyncio.wait_for(reader, 60)
    return b"".join(audio), first[0], t_last


def test_ids_speak_what_the_text_speaks_and_are_heard_while_they_stream(server, mini_checkpoint):
    tokenizer = QwenTokenizer.from_dir(mini_checkpoint)
    ids = tokenizer.encode(TEXT)
    deltas = token_deltas(TEXT)
    assert len(ids) > 12

    async def go():
        async with aiohttp.ClientSession() as s:
            ws = await s.ws_connect(server.ws_url + "/v1/ws")
            assert json.loads((await ws.receive(timeout=30)).data)["type"] == "session.ready"
            as_text = await speak(ws, "text", [{"text": d} for d in deltas])
            as_ids = await speak(ws, "ids", [{"ids": [i]} for i in ids])
            other, _, _ = await speak(ws, "other", [{"ids": [i]} for i in tokenizer.encode(OTHER)])
            await ws.close()
            return as_text, as_ids, other

    (text_audio, _, _), (ids_audio, first, last), other = asyncio.run(asyncio.wait_for(go(), 120))
    assert len(ids_audio) == 24 * 1920 * 4 and ids_audio == text_audio
    assert other != text_audio      # another text speaks other audio: the equality above says something
    assert first < last             # heard while the ids still stream, not at the flush
