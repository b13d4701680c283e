"""The gateway over real sockets against a real `talkgate serve` process (tiny checkpoint, CPU)."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import struct
import time

import aiohttp
import numpy as np
import pytest

from tests.serverproc import TalkgateServer

HEADER = struct.Struct("<BBHIII")
GREEDY = {"greedy": True}
SCHEMA = json.load(open(__import__("pathlib").Path(__file__).parents[2] / "docs" / "protocol.schema.json"))


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    args = ["--max-text-chars", "400", "--max-contexts-per-connection", "3", "--max-backlog-ms", "3000",
            "--max-message-bytes", "4096", "--shutdown-deadline", "5"]
    with TalkgateServer(tiny_checkpoint, *args) as srv:
        yield srv


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def check_schema(msg: dict) -> None:
    import jsonschema
    jsonschema.validate(msg, {**SCHEMA, "oneOf": [{"$ref": "#/$defs/server"}]})


class Client:
    """A native-protocol client that records everything it receives."""

    def __init__(self, ws):
        self.ws = ws
        self.events: list[dict] = []
        self.audio: dict[int, list[tuple[int, int, bytes]]] = {}   # stream -> [(seq, start_ms, payload)]
        self.order: list[tuple[str, object]] = []                  # ("json", type) / ("audio", stream)

    async def send(self, **msg) -> None:
        await self.ws.send_str(json.dumps(msg))

    async def recv(self, timeout: float = 60) -> dict | None:
        """Receive frames until the next JSON event; audio frames are recorded on the way."""
        while True:
            msg = await self.ws.receive(timeout=timeout)
            if msg.type == aiohttp.WSMsgType.BINARY:
                version, enc, _, stream, seq, start_ms = HEADER.unpack_from(msg.data)
                assert version == 1
                self.audio.setdefault(stream, []).append((seq, start_ms, msg.data[HEADER.size:]))
                self.order.append(("audio", stream))
            elif msg.type == aiohttp.WSMsgType.TEXT:
                ev = json.loads(msg.data)
                check_schema(ev)
                self.events.append(ev)
                self.order.append(("json", ev["type"]))
                return ev
            else:
                return None

    async def until(self, pred, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            ev = await self.recv(max(0.1, deadline - time.monotonic()))
            assert ev is not None, f"connection closed while waiting; got {self.events[-5:]}"
            if pred(ev):
                return ev


async def connect(session, server, **kw) -> Client:
    ws = await session.ws_connect(server.ws_url + "/v1/ws", **kw)
    c = Client(ws)
    ready = await c.recv()
    assert ready["type"] == "session.ready"
    return c


def pcm16(chunks) -> np.ndarray:
    return np.frombuffer(b"".join(p for _, _, p in sorted(chunks)), dtype="<i2").astype(np.float32) / 32768


async def speak(c: Client, cid: str, words: list[str], **start) -> dict:
    await c.send(type="context.start", context_id=cid, sampling=GREEDY, **start)
    started = await c.until(lambda e: e["type"] == "context.started" and e["context_id"] == cid)
    for w in words:
        await c.send(type="text", context_id=cid, text=w)
    await c.send(type="flush", context_id=cid)
    done = await c.until(lambda e: e["type"] in ("context.done", "error") and e.get("context_id") == cid)
    assert done["type"] == "context.done", done
    return started


def test_health_metrics_voices_and_page(server):
    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.get(server.url + "/health") as r:
                assert r.status == 200
                body = await r.json()
                assert body["model"]["untrained"] is True and "notice" in body["model"]
            async with s.get(server.url + "/v1/audio/voices") as r:
                voices = (await r.json())["voices"]
                assert {"id": "ryan", "object": "audio.voice", "name": "ryan", "type": "builtin"} in voices
            # cloning needs a Base checkpoint: said plainly, and a CustomVoice model lists no stored voices
            form = aiohttp.FormData()
            form.add_field("name", "x")
            form.add_field("consent", "yes")
            form.add_field("audio_sample", b"RIFF", filename="a.wav")
            async with s.post(server.url + "/v1/audio/voices", data=form) as r:
                assert r.status == 400 and (await r.json())["error"]["code"] == "cloning_unavailable"
            async with s.get(server.url + "/") as r:
                assert r.status == 200 and "<html" in (await r.text()).lower()
            async with s.get(server.url + "/metrics") as r:
                text = await r.text()
                for name in ("talkgate_ttfa_ms_bucket", "talkgate_event_loop_lag_seconds", "talkgate_contexts_active",
                             "talkgate_engine_step_seconds", "process_cpu_seconds_total"):
                    assert name in text, name
    run(go())


def test_websocket_compression_is_declined(server):
    """A client offering permessage-deflate (the websockets library does by default, as browsers do)
    gets plain frames: deflating audio costs CPU and saves nothing."""
    import websockets

    async def go():
        ws_url = server.url.replace("http", "ws", 1) + "/v1/ws"
        async with websockets.connect(ws_url) as ws:
            assert ws.response.headers.get("Sec-WebSocket-Extensions") is None
            assert json.loads(await ws.recv())["type"] == "session.ready"
            await ws.send(json.dumps({"type": "session.config"}))
            assert json.loads(await ws.recv())["type"] == "session.configured"
    run(go())


def test_text_deltas_to_opus_match_pcm_path(server):
    """The same greedy utterance as PCM and as Opus: the Opus packets decode (libopus) to the same audio."""
    import opuslib

    words = ["Hel", "lo the", "re, how ", "are you ", "today?"]

    async def go():
        async with aiohttp.ClientSession() as s:
            c = await connect(s, server)
            st_pcm = await speak(c, "p", words, fixed_frames=12, format={"encoding": "pcm_s16le", "sample_rate": 24000})
            st_opus = await speak(c, "o", words, fixed_frames=12, format={"encoding": "opus", "sample_rate": 24000})
            timing = [e for e in c.events if e["type"] == "timing"]
            assert len(timing) == 2 and all(e["ttfa_ms"] > 0 for e in timing)
            return c.audio[st_pcm["stream"]], c.audio[st_opus["stream"]]

    pcm_chunks, opus_packets = run(go())
    pcm = pcm16(pcm_chunks)
    assert len(pcm) == 12 * 1920
    assert [seq for seq, _, _ in opus_packets] == list(range(len(opus_packets)))
    # 20 ms packets covering the audio plus libopus' 2.5 ms lookahead (so the tail is not cut)
    assert len(opus_packets) == -(-(12 * 80 + 2.5) // 20)
    dec = opuslib.Decoder(24000, 1)
    decoded = np.concatenate([np.frombuffer(dec.decode(p, 480), dtype="<i2") for _, _, p in opus_packets])
    decoded = decoded.astype(np.float32) / 32768
    assert len(decoded) >= len(pcm)
    # libopus delays by its lookahead: align by cross-correlation, then compare
    lag = max(range(0, 400), key=lambda k: float(np.dot(decoded[k:k + 12000], pcm[:12000])))
    a, b = decoded[lag:lag + len(pcm)], pcm[:len(decoded) - lag]
    corr = float(np.corrcoef(a, b)[0, 1])
    assert corr > 0.8, (lag, corr)


def test_interleaved_contexts_equal_each_alone(server):
    async def go():
        async with aiohttp.ClientSession() as s:
            c = await connect(s, server)
            alone = await speak(c, "alone", ["One two three."], fixed_frames=8)
            await c.send(type="context.start", context_id="x", sampling=GREEDY, fixed_frames=8)
            # the tiny random model hardly hears its text: a seed is what sets y apart
            await c.send(type="context.start", context_id="y", sampling={"seed": 5}, fixed_frames=8)
            await c.send(type="text", context_id="x", text="One two ")
            await c.send(type="text", context_id="y", text="Something else entirely.")
            await c.send(type="text", context_id="x", text="three.")
            await c.send(type="flush", context_id="y")
            await c.send(type="flush", context_id="x")
            done = set()
            while done != {"x", "y"}:
                ev = await c.until(lambda e: e["type"] in ("context.done", "error"))
                assert ev["type"] == "context.done", ev
                done.add(ev["context_id"])
            streams = {e["context_id"]: e["stream"] for e in c.events if e["type"] == "context.started"}
            return c, streams, alone["stream"]

    c, streams, alone = run(go())
    # batch of 2 vs batch of 1: the same up to float rounding (a few int16 steps)
    np.testing.assert_allclose(pcm16(c.audio[streams["x"]]), pcm16(c.audio[alone]), atol=4 / 32768)
    assert not np.allclose(pcm16(c.audio[streams["y"]]), pcm16(c.audio[alone]), atol=1e-2)


def test_cancel_mid_utterance(server):
    async def go():
        async with aiohttp.ClientSession() as s:
            c = await connect(s, server)
            await c.send(type="context.start", context_id="long", fixed_frames=400)
            await c.send(type="text", context_id="long", text="A long utterance that we interrupt. " * 4)
            await c.send(type="flush", context_id="long")
            started = await c.until(lambda e: e["type"] == "context.started")
            await c.until(lambda e: e["type"] == "timing")
            await c.send(type="cancel")           # barge-in: every context
            ev = await c.until(lambda e: e["type"] == "context.cancelled")
            sent_before = len(c.audio[started["stream"]])
            await c.send(type="ping", id=7)
            pong = await c.until(lambda e: e["type"] == "pong")
            assert pong["id"] == 7
            await asyncio.sleep(0.5)
            await c.send(type="ping")
            await c.until(lambda e: e["type"] == "pong")
            return c, ev, started, sent_before

    c, ev, started, sent_before = run(go())
    stream = started["stream"]
    # no audio of that context after the answer
    idx = c.order.index(("json", "context.cancelled"))
    assert ("audio", stream) not in c.order[idx:]
    assert len(c.audio[stream]) == sent_before
    sent_ms = sum(len(p) for _, _, p in c.audio[stream]) / 2 / 24
    assert ev["audio_ms_sent"] == pytest.approx(sent_ms, abs=1)
    assert 0 < ev["audio_ms_sent"] < 400 * 80
    # the context is gone: messages for it are errors now
    async def after():
        async with aiohttp.ClientSession() as s:
            c2 = await connect(s, server)
            await c2.send(type="flush", context_id="long")
            return await c2.recv()
    assert run(after())["code"] == "unknown_context"


BAD_INPUTS = [
    ("{not json", "invalid_json"),
    ("[1, 2]", "invalid_message"),
    (json.dumps({"type": "dance"}), "unknown_type"),
    (json.dumps({"type": "text", "context_id": "a", "text": 5}), "invalid_message"),
    (json.dumps({"type": "text", "context_id": "bad id!", "text": "x"}), "invalid_message"),
    (json.dumps({"type": "flush", "context_id": "nope"}), "unknown_context"),
    (json.dumps({"type": "cancel", "context_id": "nope"}), "unknown_context"),
    (json.dumps({"type": "session.config", "voice": "nobody"}), "unknown_voice"),
    (json.dumps({"type": "session.config", "language": "klingon"}), "unknown_language"),
    (json.dumps({"type": "session.config", "format": {"encoding": "mulaw", "sample_rate": 48000}}), "invalid_format"),
    (json.dumps({"type": "session.config", "format": {"encoding": "wma", "sample_rate": 24000}}), "invalid_format"),
    (json.dumps({"type": "session.config", "sampling": {"temperature": -1}}), "invalid_params"),
    (json.dumps({"type": "context.start", "context_id": "v", "voice": "nobody"}), "unknown_voice"),
    # past 64 bits: refused at the start, not an overflow on the engine's thread (which stopped every session)
    (json.dumps({"type": "context.start", "context_id": "s", "sampling": {"seed": 2 ** 64}}), "invalid_params"),
    (json.dumps({"type": "text", "context_id": "big", "text": "x" * 401}), "text_too_long"),
    # what an adversarial run found closing the socket silently (1000, no error) or never finishing
    ("[" * 1000 + "]" * 1000, "invalid_json"),
    ('{"type": "text", "context_id": "u", "text": "\\ud800 lone surrogate"}', "invalid_message"),
    ('{"type": "ping", "id": ' + "9" * 401 + "}", "invalid_json"),
    ('{"type": "session.config", "speed": NaN}', "invalid_json"),
    ('{"type": "session.config", "speed": 1e400}', "invalid_json"),
    (json.dumps({"type": "session.config", "voice": ["ryan"]}), "invalid_message"),
    (json.dumps({"type": "session.config", "speed": True}), "invalid_message"),
    (json.dumps({"type": "session.config", "sampling": {"seed": 2 ** 64}}), "invalid_params"),
    (json.dumps({"type": "session.config", "format": {"encoding": "opus", "sample_rate": 48000, "x": 1}}),
     "invalid_format"),
    (json.dumps({"type": "context.start", "context_id": "m", "format": {"encoding": "mp3", "sample_rate": 24000}}),
     "invalid_format"),
    (json.dumps({"type": "context.start", "context_id": "f", "fixed_frames": 2.5}), "invalid_message"),
    (json.dumps({"type": "ping", "id": {"nested": [1]}}), "invalid_message"),
    (json.dumps({"type": "text", "context_id": "m", "text": "y" * 5000}), "message_too_large"),
]


def test_bad_input_gets_error_and_session_lives_on(server):
    async def go():
        async with aiohttp.ClientSession() as s:
            c = await connect(s, server)
            for raw, code in BAD_INPUTS:
                await c.ws.send_str(raw)
                ev = await c.until(lambda e: e["type"] == "error")
                assert ev["code"] == code, (raw[:60], ev)
                assert ev["message"]
            await c.ws.send_bytes(b"\x00\x01")
            assert (await c.until(lambda e: e["type"] == "error"))["code"] == "binary_not_allowed"
            # too many contexts (limit 3 in this server)
            for i in range(3):
                await c.send(type="context.start", context_id=f"c{i}")
                await c.until(lambda e: e["type"] == "context.started")
            await c.send(type="context.start", context_id="c3")
            assert (await c.until(lambda e: e["type"] == "error"))["code"] == "too_many_contexts"
            await c.send(type="context.start", context_id="c0")
            assert (await c.until(lambda e: e["type"] == "error"))["code"] == "context_exists"
            await c.send(type="text", context_id="c0", text="Some words.")
            await c.send(type="flush", context_id="c0")
            await c.send(type="text", context_id="c0", text="more")
            assert (await c.until(lambda e: e["type"] == "error"))["code"] == "context_closed"
            await c.send(type="cancel")
            # still alive and useful
            await speak(c, "ok", ["Still here."], fixed_frames=3)
    run(go())


class StalledClient:
    """A WebSocket client on a raw socket with a small receive buffer that stops reading: the server
    sees backpressure at once instead of after megabytes of kernel buffering."""

    def __init__(self, port: int, rcvbuf: int = 16384):
        import os
        import socket
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        assert head.startswith(b"HTTP/1.1 101"), head
        self.buf = b""

    def send(self, **msg) -> None:
        import os
        data, mask = json.dumps(msg).encode(), os.urandom(4)
        n = len(data)
        header = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0xFE]) + n.to_bytes(2, "big"))
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def frames(self, timeout: float):
        """(opcode, payload) of every frame until `timeout` s pass with nothing new."""
        self.sock.settimeout(timeout)
        while True:
            while True:
                if len(self.buf) >= 2:
                    n, off = self.buf[1] & 0x7F, 2
                    if n == 126:
                        n, off = int.from_bytes(self.buf[2:4], "big"), 4
                    elif n == 127:
                        n, off = int.from_bytes(self.buf[2:10], "big"), 10
                    if len(self.buf) >= off + n:
                        op, payload, self.buf = self.buf[0] & 0x0F, self.buf[off:off + n], self.buf[off + n:]
                        yield op, payload
                        continue
                break
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                return
            if not chunk:
                return
            self.buf += chunk


def test_slow_reader_is_cancelled_without_touching_others(server):
    slow = StalledClient(server.port)
    slow.send(type="context.start", context_id="s", fixed_frames=3000,
              format={"encoding": "pcm_f32le", "sample_rate": 48000})
    slow.send(type="text", context_id="s", text="Never read. " * 20)
    slow.send(type="flush", context_id="s")

    async def go():
        async with aiohttp.ClientSession() as s:
            fast = await connect(s, server)            # served normally meanwhile
            t = time.monotonic()
            await speak(fast, "f", ["Unaffected by the slow one."], fixed_frames=10)
            fast_s = time.monotonic() - t
            deadline = time.monotonic() + 90          # the server cancels the stalled context by itself
            while time.monotonic() < deadline:
                async with s.get(server.url + "/metrics") as r:
                    if 'talkgate_errors_total{code="slow_consumer"} 1.0' in await r.text():
                        return fast_s, True
                await asyncio.sleep(0.5)
            return fast_s, False

    fast_s, cancelled = asyncio.run(go())
    assert cancelled, "the stalled context was not cancelled"
    assert fast_s < 30
    events = [json.loads(p) for op, p in slow.frames(timeout=5) if op == 1]
    err = events[-1]
    assert err["type"] == "error" and err["code"] == "slow_consumer" and err["fatal"] is True
    slow.sock.close()


def test_openai_speech_streaming_and_whole(server):
    async def go():
        async with aiohttp.ClientSession() as s:
            body = {"model": "tts", "input": "Hello from the speech endpoint.", "voice": "ryan",
                    "response_format": "pcm", "stream": True, "stream_format": "audio", "fixed_frames": 10,
                    "seed": 3}
            async with s.post(server.url + "/v1/audio/speech", json=body) as r:
                assert r.status == 200 and r.headers["Content-Type"].startswith("audio/pcm")
                chunks = [c async for c in r.content.iter_any()]
            pcm = b"".join(chunks)
            assert len(pcm) == 10 * 1920 * 2
            async with s.post(server.url + "/v1/audio/speech", json={**body, "stream": False, "response_format": "wav"}) as r:
                assert r.status == 200 and r.headers["Content-Type"] == "audio/wav"
                wav = await r.read()
            async with s.post(server.url + "/v1/audio/speech", json={**body, "stream_format": "sse"}) as r:
                assert r.headers["Content-Type"].startswith("text/event-stream")
                sse = (await r.read()).decode()
            async with s.post(server.url + "/v1/audio/speech", json={**body, "speed": 2.0}) as r:
                fast = await r.read()
            errors = []
            for bad in ({"input": ""}, {"speed": 5}, {"voice": "nobody"}, {"response_format": "ogg"}, {"input": 5},
                        {"input": "x" * 5000}):
                async with s.post(server.url + "/v1/audio/speech", json={**body, **bad}) as r:
                    errors.append((r.status, (await r.json())["error"]["code"]))
            async with s.post(server.url + "/v1/audio/speech", data=b"{oops") as r:
                errors.append((r.status, (await r.json())["error"]["code"]))
            return pcm, wav, sse, errors, fast

    pcm, wav, sse, errors, fast = run(go())
    # speed 2: half the duration (time-stretched, pitch kept)
    assert abs(len(fast) / 2 - 10 * 1920 / 2) <= 0.03 * 10 * 1920 / 2
    import io
    import soundfile
    audio, rate = soundfile.read(io.BytesIO(wav), dtype="int16")
    assert rate == 24000 and len(audio) == 10 * 1920
    # same seed, same text: the streamed PCM and the WAV carry the same samples
    assert np.array_equal(audio, np.frombuffer(pcm, dtype="<i2"))
    events = [json.loads(line[6:]) for line in sse.split("\n\n") if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done"
    assert sum(len(base64.b64decode(e["audio"])) for e in events[:-1]) == len(pcm)
    assert errors == [(400, "invalid_request"), (400, "invalid_request"), (400, "unknown_voice"), (400, "invalid_format"),
                      (400, "invalid_request"), (400, "text_too_long"), (400, "invalid_json")]


def test_openai_disconnect_cancels(server):
    async def go():
        async with aiohttp.ClientSession() as s:
            body = {"input": "Long text. " * 20, "response_format": "pcm", "stream": True, "fixed_frames": 5000}
            async with s.post(server.url + "/v1/audio/speech", json=body) as r:
                await r.content.read(4000)
            await asyncio.sleep(1.0)
            async with s.get(server.url + "/metrics") as r:
                return await r.text()

    text = run(go())
    values = {l.split()[0]: float(l.split()[-1]) for l in text.splitlines() if l and not l.startswith("#")}
    assert values["talkgate_contexts_active"] == 0.0
    assert sum(v for k, v in values.items() if k.startswith("talkgate_engine_step_seconds_count")) > 0
    # the engine process's loop by phase: it stepped (turn, some of it on the model's compute) and waited
    loop = {k.split('phase="')[1].split('"')[0]: v for k, v in values.items()
            if k.startswith("talkgate_engine_loop_seconds_total")}
    assert set(loop) == {"receive", "turn", "peers", "idle"} and loop["turn"] > 0 and loop["idle"] > 0
    assert any(k.startswith("talkgate_engine_gpu_wait_seconds_total") for k in values)   # 0 on a CPU engine
    # the processes' heaps after start-up are frozen out of the garbage collector, whose pauses are measured
    assert min(v for k, v in values.items() if k.startswith("talkgate_engine_gc_frozen_objects")) > 10_000
    assert any(k.startswith("talkgate_engine_gc_seconds_total") for k in values)
    assert any(k.startswith("talkgate_worker_gc_pause_max_seconds") for k in values)
    # the loop threads' time waiting for a CPU (Linux schedstat), and the engine's turns over 40 ms
    if os.path.exists("/proc/thread-self/schedstat"):
        assert any(k.startswith('talkgate_engine_cpu_wait_seconds_total{engine="0"}') for k in values)
        assert any(k.startswith("talkgate_worker_cpu_wait_seconds{") for k in values)
    assert any(k.startswith('talkgate_engine_slow_turns_total{engine="0"}') for k in values)
    # each step's audio timed from the engine process to the worker
    assert sum(v for k, v in values.items() if k.startswith("talkgate_engine_step_delivery_seconds_count")) > 0


def test_api_key_and_origin(tiny_checkpoint):
    with TalkgateServer(tiny_checkpoint, "--api-key", "sekret", "--allow-origin", "https://app.example") as srv:
        async def go():
            out = {}
            async with aiohttp.ClientSession() as s:
                ws = await s.ws_connect(srv.ws_url + "/v1/ws")            # no key: must send auth first
                await ws.send_str(json.dumps({"type": "text", "context_id": "a", "text": "hi"}))
                err = json.loads((await ws.receive()).data)
                out["no_key"] = (err["code"], (await ws.receive()).type, ws.close_code)
                ws = await s.ws_connect(srv.ws_url + "/v1/ws")
                await ws.send_str(json.dumps({"type": "auth", "api_key": "sekret"}))
                out["first_message"] = json.loads((await ws.receive()).data)["type"]
                await ws.close()
                ws = await s.ws_connect(srv.ws_url + "/v1/ws?api_key=sekret")
                out["query"] = json.loads((await ws.receive()).data)["type"]
                await ws.close()
                ws = await s.ws_connect(srv.ws_url + "/v1/ws", headers={"Authorization": "Bearer sekret",
                                                                        "Origin": "https://evil.example"})
                await ws.receive()
                out["bad_origin"] = ws.close_code
                ws = await s.ws_connect(srv.ws_url + "/v1/ws", headers={"Authorization": "Bearer sekret",
                                                                        "Origin": "https://app.example"})
                out["good_origin"] = json.loads((await ws.receive()).data)["type"]
                await ws.close()
                async with s.post(srv.url + "/v1/audio/speech", json={"input": "x"}) as r:
                    out["http_no_key"] = r.status
            return out

        out = run(go())
    assert out == {"no_key": ("unauthorized", aiohttp.WSMsgType.CLOSE, 1008), "first_message": "session.ready",
                   "query": "session.ready", "bad_origin": 1008, "good_origin": "session.ready",
                   "http_no_key": 401}
