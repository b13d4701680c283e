"""Hostile and broken input against a real `talkgate serve` (tiny checkpoint, CPU), with small limits:
every bad input gets the protocol's error (never a silent close, an HTTP 500 inside a WebSocket or a
1011), no path leaks an engine slot, and the limits (idle, slow consumer, message rate, contexts per
connection) hold for every protocol. The figures are in docs/protocol.md (Limits)."""
from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from tests.fuzz.endpoints import DEEPGRAM
from tests.fuzz.faults import start_messages
from tests.fuzz.rawws import OP_BINARY, OP_PING, Frame, RawWebSocket
from tests.serverproc import TalkgateServer
from tests.system.test_gateway import StalledClient

KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}"}
CARTESIA_VOICE = {"mode": "id", "id": "ryan"}
PCM = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    args = ["--api-key", KEY, "--idle-timeout", "3", "--max-backlog-ms", "2000", "--max-messages-per-s", "50",
            "--max-contexts-per-connection", "3", "--max-text-chars", "400", "--max-contexts", "4"]
    with TalkgateServer(tiny_checkpoint, *args) as srv:
        yield srv


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


async def metrics(s: aiohttp.ClientSession, server) -> dict:
    async with s.get(server.url + "/metrics") as r:
        text = await r.text()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


async def frames_until_close(ws, timeout: float = 10) -> list:
    """Every frame until the socket closes: JSON objects, ("binary", n) and finally ("close", code, reason)."""
    out = []
    while True:
        msg = await ws.receive(timeout=timeout)
        if msg.type == aiohttp.WSMsgType.TEXT:
            out.append(json.loads(msg.data))
        elif msg.type == aiohttp.WSMsgType.BINARY:
            out.append(("binary", len(msg.data)))
        else:
            out.append(("close", ws.close_code, msg.extra))
            return out


HOSTILE = ["[" * 1000 + "]" * 1000, '{"text": "\\ud800 lone", "context_id": "c", "type": "text"}',
           '{"type": "text", "n": ' + "7" * 401 + "}", '{"type": "text", "x": NaN}',
           '{"type": 5, "context_id": ["list"], "text": {"a": 1}, "transcript": [1]}', '{"\u00e9t\u00e9": 1}']


@pytest.mark.parametrize("path, error_of", [
    ("/v1/ws", lambda m: m.get("type") == "error"),
    ("/v1/twilio?stream_sid=MZ1", lambda m: m.get("type") == "error"),
    ("/v1/text-to-speech/ryan/multi-stream-input?output_format=pcm_16000", lambda m: "error" in m),
    ("/tts/websocket", lambda m: m.get("type") == "error"),
])
def test_hostile_messages_get_the_protocols_error(server, path, error_of):
    """Each message once closed the socket with 1000 and no error (an exception in the handler)."""
    async def go():
        async with aiohttp.ClientSession() as s:
            ws = await s.ws_connect(server.ws_url + path, headers=AUTH)
            if path.startswith("/v1/ws") or path.startswith("/v1/twilio"):
                assert json.loads((await ws.receive()).data)["type"] == "session.ready"
            for raw in HOSTILE:
                await ws.send_str(raw)
                msg = json.loads((await ws.receive(timeout=10)).data)
                assert error_of(msg), (path, raw[:40], msg)
            await ws.close()
            return await metrics(s, server)

    values = run(go())
    assert values.get('talkgate_errors_total{code="internal_error"}', 0) == 0


def test_deepgram_errors_are_1008_closes_with_a_reason(server):
    async def go():
        out = []
        async with aiohttp.ClientSession() as s:
            for raw in HOSTILE:
                ws = await s.ws_connect(server.ws_url + "/v1/speak", headers={"Authorization": f"token {KEY}"})
                assert json.loads((await ws.receive()).data)["type"] == "Metadata"
                await ws.send_str(raw)
                msg = await ws.receive(timeout=10)
                out.append(json.loads(msg.data)["code"] if msg.type == aiohttp.WSMsgType.TEXT
                           else (ws.close_code, msg.extra.split(":")[0]))
                await ws.close()
        return out

    # malformed: a close frame; well-formed JSON of an unknown type: Deepgram's warning
    assert run(go()) == [(1008, "DATA-0000")] * 4 + ["UNKNOWN_MESSAGE_TYPE"] * 2


def test_errors_after_the_upgrade_are_close_frames_not_http_500(server):
    """Unicode digits in numeric query parameters and non-ASCII API keys raised after the upgrade, and
    aiohttp wrote an HTTP 500 into the WebSocket stream."""
    async def go():
        async with aiohttp.ClientSession() as s:
            ws = await s.ws_connect(server.ws_url + "/v1/speak?sample_rate=%C2%B2", headers=AUTH)
            dg = await frames_until_close(ws)
            ws = await s.ws_connect(server.ws_url + "/v1/text-to-speech/ryan/stream-input?inactivity_timeout=%C2%B2",
                                    headers=AUTH)
            el = await frames_until_close(ws)
            ws = await s.ws_connect(server.ws_url + "/tts/websocket?api_key=%C3%A9t%C3%A9")
            bad_key = await frames_until_close(ws)
            ws = await s.ws_connect(server.ws_url + "/v1/text-to-speech/ryan/multi-stream-input")
            await ws.send_str(json.dumps({"xi_api_key": "\u00e9t\u00e9", "text": " ", "context_id": "c"}))
            bad_first = await frames_until_close(ws)
            ws = await s.ws_connect(server.ws_url + "/v1/ws")
            await ws.send_str("{junk")                     # auth after junk is refused: the first message decides
            junk_first = await frames_until_close(ws)
            ws = await s.ws_connect(server.ws_url + "/v1/ws", headers={"Authorization": f"bEaReR {KEY}"})
            ready = json.loads((await ws.receive()).data)["type"]
            await ws.close()
            return dg, el, bad_key, bad_first, junk_first, ready, await metrics(s, server)

    dg, el, bad_key, bad_first, junk_first, ready, values = run(go())
    assert dg[-1][:2] == ("close", 1008) and dg[-1][2].startswith("UNSUPPORTED_SAMPLE_RATE")
    assert el[0]["error"] == "invalid_inactivity_timeout" and el[-1][:2] == ("close", 1008)
    assert bad_key == [("close", 1008, "unauthorized")]
    assert bad_first[0]["error"] == "invalid_api_key" and bad_first[-1][:2] == ("close", 1008)
    assert junk_first[0]["code"] == "unauthorized" and junk_first[-1][:2] == ("close", 1008)
    assert ready == "session.ready"
    assert values.get('talkgate_errors_total{code="internal_error"}', 0) == 0


def test_openai_failures_free_their_contexts_and_http_errors_have_one_shape(server):
    """A lone surrogate in `input` answered 500 and kept its context: 16 requests filled the server."""
    async def go():
        out = []
        async with aiohttp.ClientSession(headers=AUTH) as s:
            before = await metrics(s, server)
            for _ in range(6):          # more than the server's 4 slots
                async with s.post(server.url + "/v1/audio/speech", data=b'{"input": "\\ud800 hello"}',
                                  headers={"Content-Type": "application/json"}) as r:
                    out.append((r.status, (await r.json())["error"]["code"]))
            requests = [("GET", "/nope", {}, None), ("GET", "/v1/audio/speech", {}, None),
                        ("POST", "/v1/audio/speech", {}, b"x" * 300_000),
                        ("POST", "/v1/audio/speech", {"Content-Type": "application/json"}, b"[" * 5000),
                        ("POST", "/v1/audio/speech", {"Content-Type": "application/json; charset=bogus"}, b"{}"),
                        ("POST", "/v1/audio/speech", {"Content-Encoding": "gzip"}, b"not gzip"),
                        ("POST", "/v1/audio/speech", {}, b'{"input": "hi", "speed": NaN}'),
                        ("POST", "/v1/audio/speech", {}, b'{"input": "hi", "seed": 18446744073709551616}')]
            for method, path, headers, body in requests:
                async with s.request(method, server.url + path, headers=headers, data=body) as r:
                    assert r.headers["Content-Type"].startswith("application/json"), (path, r.status)
                    out.append((r.status, (await r.json())["error"]["code"]))
            body = {"input": "Still serving.", "response_format": "pcm", "fixed_frames": 3}
            async with s.post(server.url + "/v1/audio/speech", json=body) as r:
                ok = (r.status, len(await r.read()))
            return out, ok, before, await metrics(s, server)

    out, ok, before, after = run(go())
    assert out == [(400, "invalid_message")] * 6 + [
        (404, "not_found"), (405, "method_not_allowed"), (413, "payload_too_large"), (400, "invalid_json"),
        (400, "invalid_json"), (400, "invalid_body"), (400, "invalid_json"), (400, "invalid_request")]
    assert ok == (200, 3 * 1920 * 2)
    assert after["talkgate_contexts_active"] == 0
    counted = sum(v - before.get(k, 0) for k, v in after.items() if k.startswith("talkgate_errors_total{"))
    assert counted == len(out)
    assert after.get('talkgate_errors_total{code="internal_error"}', 0) == 0


def test_idle_client_with_an_open_context_is_closed_and_its_slot_freed(server):
    """The idle timeout once never fired while a context was open: an idle client held slots forever."""
    async def go():
        async with aiohttp.ClientSession(headers=AUTH) as s:
            ws = await s.ws_connect(server.ws_url + "/v1/ws")
            await ws.receive()
            await ws.send_str(json.dumps({"type": "text", "context_id": "a", "text": "Waiting for the rest "}))
            t = time.monotonic()
            frames = await frames_until_close(ws, timeout=30)
            waited = time.monotonic() - t
            await asyncio.sleep(0.3)
            return frames, waited, await metrics(s, server)

    frames, waited, values = run(go())
    errors = [f for f in frames if isinstance(f, dict) and f["type"] == "error"]
    assert errors[-1]["code"] == "idle_timeout" and frames[-1][:2] == ("close", 1000)
    assert 3 <= waited < 20
    assert values["talkgate_contexts_active"] == 0


class PacedReader(StalledClient):
    """A raw-socket client with a small receive buffer that reads at real time (a player pulling audio)."""

    def read_paced(self, bytes_per_s: float, until_type: str, timeout: float = 60) -> list[dict]:
        t0, got, buf, events = time.monotonic(), 0, b"", []
        self.sock.settimeout(0.05)
        while time.monotonic() - t0 < timeout:
            allowed = int((time.monotonic() - t0) * bytes_per_s) + 16384 - got
            if allowed > 0:
                try:
                    chunk = self.sock.recv(min(allowed, 65536))
                except TimeoutError:
                    chunk = None
                if chunk == b"":
                    return events
                if chunk:
                    got += len(chunk)
                    self.buf += chunk
            else:
                time.sleep(0.01)
            for op, payload in self.parsed():
                if op == 1:
                    events.append(json.loads(payload))
                    if events[-1]["type"] in (until_type, "error"):
                        return events
        return events

    def parsed(self):
        """The whole frames in the buffer (server frames: unmasked)."""
        while len(self.buf) >= 2:
            n, off = self.buf[1] & 0x7F, 2
            if n == 126:
                n, off = int.from_bytes(self.buf[2:4], "big"), 4
            elif n == 127:
                n, off = int.from_bytes(self.buf[2:10], "big"), 10
            if len(self.buf) < off + n:
                return
            op, payload, self.buf = self.buf[0] & 0x0F, self.buf[off:off + n], self.buf[off + n:]
            yield op, payload


def test_a_client_reading_at_real_time_is_neither_slow_nor_idle(server):
    """Generation runs ahead of a real-time reader; its backlog grows past --max-backlog-ms (2 s) and its
    audio lasts past the idle timeout (3 s) with no message from it: it must get all of it."""
    c = PacedReader(server.port)
    c.send(type="auth", api_key=KEY)
    c.send(type="context.start", context_id="r", fixed_frames=75, format={"encoding": "pcm_s16le", "sample_rate": 24000})
    c.send(type="text", context_id="r", text="Read at the pace of a player. " * 3)
    c.send(type="flush", context_id="r")
    events = c.read_paced(24000 * 2 * 1.1, "context.done")
    c.sock.close()
    assert events[-1]["type"] == "context.done" and events[-1]["frames"] == 75, events[-3:]


def test_a_stalled_reader_is_cancelled_soon(server):
    """The slow-consumer rule counted after the socket buffer: a client that read nothing was cancelled
    only after ~26 s of audio. Now the socket buffer counts: about --max-backlog-ms (2 s) after it stops."""
    slow = StalledClient(server.port)
    slow.send(type="auth", api_key=KEY)
    slow.send(type="context.start", context_id="s", fixed_frames=3000,
              format={"encoding": "pcm_f32le", "sample_rate": 48000})
    slow.send(type="text", context_id="s", text="Never read. " * 20)
    t = time.monotonic()
    slow.send(type="flush", context_id="s")

    async def wait_cancelled():
        async with aiohttp.ClientSession() as s:
            while time.monotonic() - t < 60:
                if (await metrics(s, server)).get('talkgate_errors_total{code="slow_consumer"}', 0) >= 1:
                    return time.monotonic() - t
                await asyncio.sleep(0.1)

    took = run(wait_cancelled())
    print(f"stalled reader cancelled after {took:.1f} s")
    events = [json.loads(p) for op, p in slow.frames(timeout=5) if op == 1]
    slow.sock.close()
    assert took is not None and took < 10, took
    errors = [e for e in events if e["type"] == "error"]
    assert errors[0]["code"] == "slow_consumer" and errors[0]["fatal"] is True
    assert [e["code"] for e in errors[1:]] in ([], ["idle_timeout"])     # it still reads nothing: idle


def test_message_rate_and_contexts_per_connection_hold_for_every_protocol(server):
    async def go():
        async with aiohttp.ClientSession(headers=AUTH) as s:
            ws = await s.ws_connect(server.ws_url + "/v1/ws")
            await ws.receive()
            for i in range(400):                      # the limit: 50 a second, bursts of 5 s worth (250)
                await ws.send_str(json.dumps({"type": "ping", "id": i}))
            flood = await frames_until_close(ws)
            ws = await s.ws_connect(server.ws_url + "/tts/websocket")
            for cid in "abcd":                        # Cartesia contexts were unbounded (20,000 accepted)
                await ws.send_str(json.dumps({"context_id": cid, "transcript": "Hi ", "continue": True,
                                              "voice": CARTESIA_VOICE, "output_format": PCM}))
            errors = []
            while not errors:
                m = json.loads((await ws.receive(timeout=10)).data)
                if m["type"] == "error":
                    errors.append(m)
            await ws.send_str(json.dumps({"context_id": "e", "transcript": "x", "voice": {},
                                          "output_format": PCM}))
            while (m := json.loads((await ws.receive(timeout=10)).data))["type"] != "error":
                pass
            await ws.close()
            return flood, errors[0], m

    flood, too_many, empty_voice = run(go())
    assert flood[-2]["code"] == "rate_limited" and flood[-1][:2] == ("close", 1008)
    assert 250 <= sum(1 for f in flood if isinstance(f, dict) and f["type"] == "pong") < 400
    assert too_many["error_code"] == "too_many_contexts" and too_many["context_id"] == "d"
    assert too_many["status_code"] == 400
    assert empty_voice["error_code"] == "invalid_voice"


def test_a_client_that_stops_reading_past_the_heartbeat_gets_a_close_frame(tiny_checkpoint):
    """The heartbeat pings a client 20 s after its last message and drops it when no pong follows within 10 s. A
    client that stopped reading has the ping unread in its socket behind its audio; dropped with the end of the
    stream alone, it read its audio and then EOF, no code, no reason (the soak's Deepgram cut reader, which sends
    nothing while it waits). A Deepgram client (no keepalive) that reads nothing for 34 s, with --max-backlog-ms too
    large for a slow_consumer cut, then reads without answering the ping: its audio, then close 1008."""
    with TalkgateServer(tiny_checkpoint, "--api-key", KEY, "--max-backlog-ms", "600000") as srv:
        ws = RawWebSocket.connect(srv.port, DEEPGRAM.path(), AUTH, rcvbuf=4096)
        for m in start_messages(DEEPGRAM, "unread"):
            ws.send_text(m)
        time.sleep(34)
        frames, end = ws.frames_until_close(10)
        ws.close()
    assert any(f.opcode == OP_BINARY for f in frames) and any(f.opcode == OP_PING for f in frames)
    assert isinstance(end, Frame), f"{end} after {sum(len(f.payload) for f in frames)} bytes"
    assert (end.close_code, end.close_reason) == (1008, "keepalive ping timeout")


def test_http_connections_that_send_nothing_or_stop_mid_request_are_closed_after_the_idle_timeout(server):
    """aiohttp keeps a connection that has sent no request (or half of one) for its keep-alive timeout, an hour by
    default, and a handler reading a body waits for it for ever: a client that opens connections and sends nothing
    or a few bytes held them, and the worker's descriptors, that long. Every such connection closes after the idle
    timeout (3 s here); one that stopped in its body gets 408 request_timeout in the API's shape first."""
    head = lambda method, path, length, ctype="application/json": (
        f"{method} {path} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {KEY}\r\nContent-Type: {ctype}\r\n"
        f"Content-Length: {length}\r\n\r\n").encode()
    boundary = "b0undary"
    upload = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"audio_sample\"; filename=\"a.wav\"\r\n"
              f"Content-Type: audio/wav\r\n\r\nRIFF").encode()
    sent = {
        "nothing": b"",
        "half a head": b"POST /v1/audio/speech HTTP/1.1\r\nHost: t\r\n",
        "a request, then nothing": b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n",
        "half a speech body": head("POST", "/v1/audio/speech", 200) + b'{"model": "tts-1", ',
        "half an upload": head("POST", "/v1/audio/voices", 100_000, f"multipart/form-data; boundary={boundary}")
        + upload,
    }

    async def until_closed(first: bytes) -> tuple[float, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        t0 = time.monotonic()
        writer.write(first)
        got = await asyncio.wait_for(reader.read(), 30)          # to the server's end of the stream
        writer.close()
        return time.monotonic() - t0, got

    async def main():
        return dict(zip(sent, await asyncio.gather(*(until_closed(b) for b in sent.values()))))

    closed = run(main())
    assert all(2.5 < seconds < 6 for seconds, _ in closed.values()), closed
    assert closed["nothing"][1] == closed["half a head"][1] == b""
    assert closed["a request, then nothing"][1].startswith(b"HTTP/1.1 200")
    for name in ("half a speech body", "half an upload"):
        status, _, body = closed[name][1].partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 408") and b"Connection: close" in status, name
        assert json.loads(body)["error"]["code"] == "request_timeout", name


def test_connections_past_the_cap_are_answered_503_then_closed_and_past_the_hard_cap_closed_at_once(tiny_checkpoint):
    """A worker held every TCP connection it accepted, bounded only by its open-file limit (often huge in containers):
    a client opening connections took the descriptors that voice uploads, logs and the engines' sockets need. With
    --max-connections 2 and one worker: 4 connections of any kind (2 x the WebSocket sessions) are served; the next
    ones have their request answered 503 too_many_connections (the API's own shape, Retry-After) and close (a probe's
    as ever: an orchestrator must not restart a full server), or close after 1 s unasked; past 4 + 64 a connection is closed as it is accepted; once connections close, requests are
    served again."""
    from talkgate.sessions.limits import OVER_CAP, open_connections

    cap, hard = open_connections(2)
    assert (cap, hard) == (4, 4 + OVER_CAP)

    async def response(first: bytes, port: int) -> tuple[float, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        t0 = time.monotonic()
        writer.write(first)
        got = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return time.monotonic() - t0, got

    health = b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    models = b"GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n"
    speech = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
              b"\r\n{}")

    async def main(port: int):
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(cap)]
        await asyncio.sleep(0.3)                     # accepted by the worker
        answered = await response(models, port)
        probed = await response(health.replace(b"Connection: close\r\n", b""), port)
        openai_shaped = await response(speech, port)
        unasked = await response(b"", port)
        over = [await asyncio.open_connection("127.0.0.1", port) for _ in range(hard - cap)]
        await asyncio.sleep(0.3)
        at_once = await response(b"", port)          # the hard cap's: closed as accepted, long before 1 s
        for _, w in held + over:
            w.close()
        await asyncio.sleep(0.5)
        again = await response(health, port)
        metrics = await response(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", port)
        return answered, probed, openai_shaped, unasked, at_once, again, metrics[1].decode()

    with TalkgateServer(tiny_checkpoint, "--workers", "1", "--max-connections", "2") as srv:
        answered, probed, openai_shaped, unasked, at_once, again, metrics = run(main(srv.port))
    for _, got in (answered, openai_shaped):
        head, _, body = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503") and b"Connection: close" in head and b"Retry-After: 1" in head, head
        assert json.loads(body)["error"]["code"] == "too_many_connections", body
    head = probed[1].partition(b"\r\n\r\n")[0]      # a liveness probe is answered as ever, then the close
    assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" in head, probed
    assert unasked[1] == b"" and 0.8 < unasked[0] < 3, unasked
    assert at_once[1] == b"" and at_once[0] < 0.5, at_once
    assert again[1].startswith(b"HTTP/1.1 200"), again
    refused = [line for line in metrics.splitlines() if line.startswith('talkgate_errors_total{code="too_many_connections"}')]
    assert refused and float(refused[0].split()[-1]) >= 5, refused   # the 4 past the cap (the probe's too), the hard one
