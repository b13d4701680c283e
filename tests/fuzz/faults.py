"""Faults that are not one bad message: disconnect storms, cancels racing audio, slow readers, idle
clients, floods, text that costs the server work, too many contexts on one socket."""
from __future__ import annotations

import asyncio
import base64
import json
import random
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import aiohttp

from tests.fuzz.endpoints import (
    CARTESIA, CARTESIA_PCM, CARTESIA_VOICE, DASHSCOPE, DEEPGRAM, DEEPGRAM_V2, EL_MULTI, EL_SINGLE, NATIVE, TWILIO,
    Conn, Reply, judge,
)
from tests.fuzz.rawws import OP_BINARY, OP_CLOSE, OP_TEXT, Ended, Frame, HandshakeRefused, RawWebSocket

HEADER = struct.Struct("<BBHIII")
PCM_BYTES_PER_MS = 48          # s16le mono 24 kHz
LONG_TEXT = "This sentence is long enough to keep the model talking for a good while. " * 8


# ----- what starts audio on each endpoint (raw frames, for storms and slow readers) -----
def start_messages(ep, tag: str) -> list[str]:
    if ep in (NATIVE, TWILIO):
        return [json.dumps(m) for m in ({"type": "context.start", "context_id": tag, "fixed_frames": 750},
                                        {"type": "text", "context_id": tag, "text": LONG_TEXT},
                                        {"type": "flush", "context_id": tag})]
    if ep is EL_MULTI:
        return [json.dumps({"text": LONG_TEXT, "context_id": tag, "flush": True})]
    if ep is EL_SINGLE:
        return [json.dumps({"text": LONG_TEXT, "flush": True})]
    if ep is CARTESIA:
        return [json.dumps({"context_id": tag, "model_id": "sonic-2", "transcript": LONG_TEXT, "continue": False,
                            "voice": CARTESIA_VOICE, "output_format": CARTESIA_PCM})]
    if ep is DASHSCOPE:
        return [json.dumps({"type": "input_text_buffer.append", "text": LONG_TEXT}),
                json.dumps({"type": "input_text_buffer.commit"})]
    return [json.dumps({"type": "Speak", "text": LONG_TEXT}), json.dumps({"type": "Flush"})]


def keepalive(ep) -> str | None:
    """A message that changes nothing, so a client that writes but never reads is not idle (Deepgram
    has none here: its KeepAlive is answered with a Warning, and the test needs no answers; DashScope
    neither: every event it has is answered or changes the session)."""
    if ep in (NATIVE, TWILIO):
        return json.dumps({"type": "ping"})
    if ep is EL_MULTI:
        return json.dumps({"text": "", "context_id": "keepalive"})
    if ep is CARTESIA:
        return json.dumps({"context_id": "keepalive", "cancel": True})
    if ep is DEEPGRAM_V2:
        return json.dumps({"type": "Configure"})       # nothing to configure: a small ConfigureSuccess
    return None


def audio_ms(ep, frame: Frame) -> float:
    """Audio time in one server frame (PCM s16le 24 kHz on every endpoint here)."""
    if frame.opcode == OP_BINARY:
        return (len(frame.payload) - (HEADER.size if ep is NATIVE else 0)) / PCM_BYTES_PER_MS
    if frame.opcode != OP_TEXT:
        return 0.0
    try:
        msg = json.loads(frame.payload)
    except ValueError:
        return 0.0
    data = (msg.get("audio") if ep in (EL_MULTI, EL_SINGLE) else msg.get("data") if msg.get("type") == "chunk"
            else msg.get("delta") if msg.get("type") == "response.audio.delta" else None)
    return len(base64.b64decode(data)) / PCM_BYTES_PER_MS if isinstance(data, str) else 0.0


def is_error_frame(ep, frame: Frame) -> bool:
    if frame.opcode == OP_CLOSE:
        return True
    if frame.opcode != OP_TEXT:
        return False
    try:
        return ep.is_error(json.loads(frame.payload))
    except ValueError:
        return False


# ----- disconnect storm -----
DROPS = ("close-frame", "fin", "rst", "half-close", "mid-frame")


def _storm_client(port: int, ep, drop: str, wait_s: float, headers: dict) -> None:
    try:
        ws = RawWebSocket.connect(port, ep.path(), headers, timeout=10)
    except (HandshakeRefused, OSError):
        return
    try:
        for m in start_messages(ep, "storm"):
            ws.send_text(m)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            f = ws.recv_frame(max(0.01, deadline - time.monotonic()))
            if isinstance(f, Ended) or f.opcode == OP_CLOSE:
                break
        if drop == "close-frame":
            ws.send_close(1000)
            ws.close()
        elif drop == "fin":
            ws.close()
        elif drop == "rst":
            ws.abort()
        elif drop == "half-close":
            ws.sock.shutdown(socket.SHUT_WR)
            ws.recv_frame(0.3)
            ws.close()
        else:      # a frame cut in the middle, then a reset
            ws.send_raw(b"\x81\xfe\x01\x00" + b"\x00" * 4 + b"{" * 10)
            ws.abort()
    except OSError:
        ws.abort()


def _http_storm_client(port: int, wait_s: float, headers: dict) -> None:
    body = json.dumps({"input": LONG_TEXT, "response_format": "pcm", "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        sock.sendall(f"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{head}"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        sock.settimeout(wait_s)
        try:
            sock.recv(4096)
        except (TimeoutError, OSError):
            pass
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


async def disconnect_storm(camp, phase, n_sockets: int, rng: random.Random, wave: int = 8) -> None:
    """Sockets of every endpoint start audio and vanish mid-stream, `wave` at a time (so the fuzz never
    takes the canary's engine slots): close frame, FIN, RST, half-close, a frame cut in half."""
    eps = [NATIVE, TWILIO, EL_MULTI, EL_SINGLE, CARTESIA, DEEPGRAM, DEEPGRAM_V2, DASHSCOPE, "http"]
    with ThreadPoolExecutor(wave) as pool:
        loop = asyncio.get_running_loop()
        done = 0
        while done < n_sockets:
            jobs = []
            for _ in range(min(wave, n_sockets - done)):
                ep, drop, wait = rng.choice(eps), rng.choice(DROPS), rng.uniform(0.0, 0.6)
                if ep == "http":
                    jobs.append(loop.run_in_executor(pool, _http_storm_client, camp.server.port, wait, camp.auth_headers))
                else:
                    jobs.append(loop.run_in_executor(pool, _storm_client, camp.server.port, ep, drop, wait,
                                                     camp.auth_headers))
                phase.counts["storm sockets"] += 1
            await asyncio.gather(*jobs)
            done += len(jobs)


# ----- cancels racing audio -----
async def cancel_races(camp, phase, rounds: int, rng: random.Random) -> None:
    """Start, then cancel at a random moment (before the first audio, right after it, later), by id or
    all at once; after the cancel's answer no audio of that context may come."""
    async with aiohttp.ClientSession() as s:
        await asyncio.gather(_native_races(camp, phase, s, rounds, rng),
                             *(race(camp, phase, s, rounds // 2, rng) for race in (
                                 _deepgram_races, _cartesia_races, _el_races, _deepgram_v2_races, _dashscope_races)))


async def _native_races(camp, phase, s, rounds, rng) -> None:
    conn, _ = await Conn.open(NATIVE, s, camp.server.ws_url, headers=camp.auth_headers)
    streams: dict[str, int] = {}
    for i in range(rounds):
        cid = f"r{i}" if rng.random() < 0.8 else "same"
        for m in ({"type": "context.start", "context_id": cid, "fixed_frames": 200},
                  {"type": "text", "context_id": cid, "text": "Cancel me at some point."}, {"type": "flush", "context_id": cid}):
            await conn.send(json.dumps(m))
        when = rng.choice(("now", "first-audio", "later"))
        seen = Reply()
        if when != "now":
            seen = await conn.collect(lambda it: isinstance(it, bytes), 5)
            if when == "later":
                seen.items += (await conn.drain(rng.uniform(0.05, 0.3))).items
        cancel = {"type": "cancel"} if rng.random() < 0.3 else {"type": "cancel", "context_id": cid}
        reply = await conn.exchange(json.dumps(cancel))         # up to the probe, answered after the cancel
        after = await conn.exchange(json.dumps({"type": "ping", "id": f"race{i}"}))
        judge(NATIVE, f"cancel race {i} ({when}): {json.dumps(cancel)}", reply, phase, False)
        for it in seen.jsons() + reply.jsons():
            if it.get("type") == "context.started":
                streams[it["context_id"]] = it["stream"]
        stream = streams.get(cid)
        items = reply.items + after.items
        at = next((k for k, it in enumerate(items) if isinstance(it, dict) and it.get("context_id") == cid
                   and it.get("type") == "context.cancelled"), None)
        late = [] if at is None else [b for b in items[at:] if isinstance(b, bytes) and HEADER.unpack_from(b)[3] == stream]
        if late:
            phase.fail("audio after cancel", f"native: {len(late)} audio frames of stream {stream} after "
                       "context.cancelled")
        phase.counts["cancel races"] += 1
        if conn.closed is not None:
            phase.fail("cancel race", f"native: connection ended: {reply.brief()}")
            return
    await conn.close()


async def _deepgram_races(camp, phase, s, rounds, rng) -> None:
    conn, _ = await Conn.open(DEEPGRAM, s, camp.server.ws_url, headers=camp.auth_headers)
    for i in range(rounds):
        await conn.send(json.dumps({"type": "Speak", "text": "Clear me soon. " * 3}))
        await conn.send(json.dumps({"type": "Flush"}))
        if rng.random() < 0.7:
            await conn.collect(lambda it: isinstance(it, bytes), 5)
        await conn.send(json.dumps({"type": "Clear"}))
        reply = await conn.collect(lambda it: isinstance(it, dict) and it.get("type") == "Cleared", 20)
        after = await conn.exchange(json.dumps({"type": f"Probe-race{i}"}))
        judge(DEEPGRAM, f"Clear race {i}", reply, phase, False)
        if any(isinstance(b, bytes) for b in after.items):
            phase.fail("audio after cancel", f"deepgram: {sum(isinstance(b, bytes) for b in after.items)} audio "
                       f"frames after Cleared")
        phase.counts["cancel races"] += 1
        if conn.closed is not None:
            phase.fail("cancel race", f"deepgram: connection ended: {reply.brief()}")
            return
    await conn.close()


async def _deepgram_v2_races(camp, phase, s, rounds, rng) -> None:
    """Flux Interrupt: the audio not yet written is dropped before SpeechInterrupted, so none follows it."""
    conn, _ = await Conn.open(DEEPGRAM_V2, s, camp.server.ws_url, headers=camp.auth_headers)
    for i in range(rounds):
        await conn.send(json.dumps({"type": "Speak", "text": "Interrupt me soon. " * 3}))
        await conn.send(json.dumps({"type": "Flush"}))
        # an Interrupt before any audio of the session is a Warning (nothing to cut): the first round waits for it
        if i == 0 or rng.random() < 0.7:
            await conn.collect(lambda it: isinstance(it, bytes), 5)
        await conn.send(json.dumps({"type": "Interrupt"}))
        reply = await conn.collect(lambda it: isinstance(it, dict) and it.get("type") in ("SpeechInterrupted", "Warning"),
                                   20)
        after = await conn.exchange(DEEPGRAM_V2.probe(10 ** 6 + i))
        judge(DEEPGRAM_V2, f"Interrupt race {i}", reply, phase, False)
        if reply.answered and reply.jsons()[-1]["type"] == "SpeechInterrupted" and \
                any(isinstance(b, bytes) for b in after.items):
            phase.fail("audio after cancel", f"deepgram v2: {sum(isinstance(b, bytes) for b in after.items)} audio "
                       f"frames after SpeechInterrupted")
        phase.counts["cancel races"] += 1
        if conn.closed is not None:
            phase.fail("cancel race", f"deepgram v2: connection ended: {reply.brief()}")
            return
    await conn.close()


async def _dashscope_races(camp, phase, s, rounds, rng) -> None:
    """DashScope response.cancel: every response not yet done ends `cancelled`, and no delta of it follows."""
    conn, _ = await Conn.open(DASHSCOPE, s, camp.server.ws_url, headers=camp.auth_headers)
    for i in range(rounds):
        await conn.send(json.dumps({"type": "input_text_buffer.append", "text": "Cancel me soon. " * 3}))
        await conn.send(json.dumps({"type": "input_text_buffer.commit"}))
        if rng.random() < 0.7:
            await conn.collect(lambda it: isinstance(it, dict) and it.get("type") == "response.audio.delta", 5)
        reply = await conn.exchange(json.dumps({"type": "response.cancel"}))
        judge(DASHSCOPE, f"response.cancel race {i}", reply, phase, False)
        items = reply.jsons() + (await conn.drain(0.2)).jsons()
        done: set[str] = set()
        late = []
        for m in items:
            if m.get("type") == "response.done":
                done.add(m["response"]["id"])
            elif m.get("type") == "response.audio.delta" and m.get("response_id") in done:
                late.append(m)
        if late:
            phase.fail("audio after cancel", f"dashscope: {len(late)} deltas of a response after its response.done")
        phase.counts["cancel races"] += 1
        if conn.closed is not None:
            phase.fail("cancel race", f"dashscope: connection ended: {reply.brief()}")
            return
    await conn.close()


async def _cartesia_races(camp, phase, s, rounds, rng) -> None:
    conn, _ = await Conn.open(CARTESIA, s, camp.server.ws_url, headers=camp.auth_headers)
    for i in range(rounds):
        cid = f"r{i}"
        await conn.send(json.dumps({"context_id": cid, "model_id": "sonic-2", "transcript": "Cancel me. " * 3,
                                    "continue": False, "voice": CARTESIA_VOICE, "output_format": CARTESIA_PCM}))
        if rng.random() < 0.7:
            await conn.collect(lambda it: isinstance(it, dict) and it.get("context_id") == cid, 5)
        reply = await conn.exchange(json.dumps({"context_id": cid, "cancel": True}))
        judge(CARTESIA, f"cancel race {i}", reply, phase, False)
        after = await conn.drain(0.2)
        late = [m for m in after.jsons() if m.get("context_id") == cid]
        if late:
            phase.fail("audio after cancel", f"cartesia: {len(late)} messages of context {cid} after its cancel was "
                       f"answered: {json.dumps(late[0])[:100]}")
        phase.counts["cancel races"] += 1
        if conn.closed is not None:
            return
    await conn.close()


async def _el_races(camp, phase, s, rounds, rng) -> None:
    conn, _ = await Conn.open(EL_MULTI, s, camp.server.ws_url, path=EL_MULTI.path(), headers=camp.auth_headers)
    for i in range(rounds):
        cid = f"r{i}"
        await conn.send(json.dumps({"text": "Barge in on me, ", "context_id": cid}))
        await conn.send(json.dumps({"text": "I am still talking ", "context_id": cid}))
        if rng.random() < 0.7:      # unflushed text may not speak yet: wait a little for audio, not for long
            await conn.collect(lambda it: isinstance(it, dict) and it.get("contextId") == cid and it.get("audio"), 1.5)
        await conn.send(json.dumps({"context_id": cid, "close_context": True}))
        reply = await conn.collect(lambda it: isinstance(it, dict) and it.get("contextId") == cid and it.get("isFinal"), 20)
        judge(EL_MULTI, f"barge-in race {i}", reply, phase, False)
        after = await conn.exchange(json.dumps({"text": "", "context_id": "keepalive"}))
        after.items += (await conn.drain(0.2)).items
        late = [m for m in after.jsons() if m.get("contextId") == cid and m.get("audio")]
        if late:
            phase.fail("audio after cancel", f"elevenlabs: {len(late)} audio messages of {cid} after its isFinal")
        phase.counts["cancel races"] += 1
        if conn.closed is not None:
            return
    await conn.close()


# ----- slow readers -----
def _slow_reader(port: int, ep, headers: dict, stop: threading.Event) -> dict:
    """Start a long utterance, keep writing keepalives, never read until `stop`; then read it all.
    -> the audio received before the first error or close, and how the stream went."""
    ws = RawWebSocket.connect(port, ep.path(), headers, rcvbuf=4096)
    for m in start_messages(ep, "slow"):
        ws.send_text(m)
    while not stop.wait(0.5):
        try:
            if keepalive(ep) is not None:
                ws.send_text(keepalive(ep))
        except OSError:
            break
    frames, end = ws.frames_until_close(8)
    ws.close()
    received, stopped_by, finished = 0.0, None, False
    for f in frames + ([end] if isinstance(end, Frame) else []):
        if f.opcode == OP_TEXT and any(m in f.payload for m in (b'"context.done"', b'"isFinal":true', b'"type":"done"',
                                                                 b'"Flushed"', b'"response.audio.done"')):
            finished = True         # the whole utterance went out: it was never cancelled
            break
        if is_error_frame(ep, f):
            stopped_by = f.payload[:160] if f.opcode == OP_TEXT else f"close {f.close_code} {f.close_reason!r}"
            break
        received += audio_ms(ep, f)
    return {"audio_ms": received, "stopped_by": stopped_by, "finished": finished,
            "end": end.how if isinstance(end, Ended) else f"close {end.close_code}"}


async def slow_readers(camp, phase, max_backlog_ms: int, settle_timeout_s: float = 60.0) -> None:
    """A client that stops reading must be cancelled once the audio it has not taken, counted anywhere on
    the server (socket buffer included), passes max_backlog_ms: the audio it finally reads before the
    error is at most that plus what its own small receive buffer holds (< 1 s here)."""
    eps = [NATIVE, DEEPGRAM, CARTESIA, EL_MULTI, DEEPGRAM_V2, DASHSCOPE]
    stop = threading.Event()
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(len(eps)) as pool:
        jobs = [loop.run_in_executor(pool, _slow_reader, camp.server.port, ep, camp.auth_headers, stop) for ep in eps]
        try:
            # the server ends them by itself: wait until no context but the canary's is left
            t0 = time.monotonic()
            await asyncio.sleep(1.0)
            async with aiohttp.ClientSession() as s:
                while time.monotonic() - t0 < settle_timeout_s:
                    m = await camp.server.metrics(s)
                    if (m.get("talkgate_contexts_active") or 0) <= 2:
                        break
                    await asyncio.sleep(0.5)
            waited = time.monotonic() - t0
        finally:        # the readers stop however this ends: the pool's exit waits for them
            stop.set()
        results = await asyncio.gather(*jobs, return_exceptions=True)
    for ep, r in zip(eps, results):
        if isinstance(r, BaseException):
            phase.fail("slow reader", f"{ep.name}: {r!r}")
            continue
        if r["stopped_by"] is None:
            phase.fail("slow reader not cancelled", f"{ep.name}: {r['audio_ms'] / 1000:.1f} s of audio and no error "
                       f"({'finished' if r['finished'] else r['end']}) after {waited:.0f} s of not reading")
        elif r["audio_ms"] > max_backlog_ms + 1000:
            phase.fail("slow reader cancelled late", f"{ep.name}: {r['audio_ms'] / 1000:.1f} s of unread audio reached "
                       f"the client before the error (limit {max_backlog_ms / 1000:g} s + 1 s): {r['stopped_by']!r}")
        else:
            phase.errors_answered += 1


# ----- idle clients -----
async def idle_clients(camp, phase, idle_s: float) -> None:
    """No message for the idle timeout: closed with the protocol's reason, whether or not a context is
    open (an open context holds an engine slot)."""
    cases = [
        (NATIVE, None, [{"type": "context.start", "context_id": "i"}, {"type": "text", "context_id": "i", "text": "Idle "}]),
        (NATIVE, None, []),
        (TWILIO, None, [{"type": "text", "context_id": "i", "text": "Idle "}]),
        (CARTESIA, None, [{"context_id": "i", "transcript": "Idle ", "continue": True, "voice": CARTESIA_VOICE,
                           "output_format": CARTESIA_PCM}]),
        (DEEPGRAM, None, [{"type": "Speak", "text": "Idle "}]),
        (DEEPGRAM_V2, None, [{"type": "Speak", "text": "Idle "}]),
        (DASHSCOPE, None, [{"type": "input_text_buffer.append", "text": "Idle "}]),
        (DASHSCOPE, None, []),
        (EL_MULTI, {"inactivity_timeout": str(int(idle_s))}, [{"text": "Idle ", "context_id": "i"}]),
    ]

    async def one(s, ep, query, msgs):
        path = ep.path(**query) if query else None
        conn, _ = await Conn.open(ep, s, camp.server.ws_url, path=path, headers=camp.auth_headers)
        for m in msgs:
            await conn.send(json.dumps(m))
        reply = await conn.collect(None, idle_s + 8)
        what = f"idle for {idle_s + 8:g} s " + ("with an open context" if msgs else "with nothing open")
        if conn.closed is None:
            phase.fail("idle client kept", f"{ep.name}: {what}: still open, {reply.brief()}")
        else:
            judge(ep, what, reply, phase, False, normal_end=True)
        await conn.close()

    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(one(s, *c) for c in cases))


# ----- floods -----
async def floods(camp, phase, n: int) -> None:
    """Thousands of small messages without pause: all answered, or refused with an error and a reason
    (a rate limit); the canary streams on."""
    plans = [(NATIVE, lambda i: json.dumps({"type": "ping", "id": i}), lambda it: it.get("type") == "pong"),
             (TWILIO, lambda i: json.dumps({"type": "ping", "id": i}), lambda it: it.get("type") == "pong"),
             (DEEPGRAM, lambda i: json.dumps({"type": "Flush"}), lambda it: it.get("type") == "Flushed"),
             (DEEPGRAM_V2, lambda i: json.dumps({"type": "Configure"}), lambda it: it.get("type") == "ConfigureSuccess"),
             (DASHSCOPE, lambda i: json.dumps({"type": "input_text_buffer.clear"}),
              lambda it: it.get("type") == "input_text_buffer.cleared"),
             (EL_MULTI, lambda i: json.dumps({"text": "", "context_id": "k"}), None),
             (CARTESIA, lambda i: json.dumps({"context_id": f"x{i}", "cancel": True}), None)]

    async def one(s, ep, make, answer):
        conn, _ = await Conn.open(ep, s, camp.server.ws_url, headers=camp.auth_headers)
        mark = 10 ** 6
        reader = asyncio.create_task(conn.collect(lambda it: ep.answers_probe(it, mark), 120))
        for i in range(n):
            if not await conn.send(make(i)):
                break
            if i % 200 == 0:
                await asyncio.sleep(0)
        await conn.send(ep.probe(mark))
        reply = await reader
        if reply.answered:
            reply.items.pop()
        judge(ep, f"a flood of {n} messages", reply, phase, False)
        if answer is not None and conn.closed is None:
            got = sum(1 for it in reply.jsons() if answer(it))
            if got < n and not any(ep.is_error(it) for it in reply.jsons()):
                phase.fail("flood", f"{ep.name}: {got} of {n} answered and no error")
        phase.counts["flood messages"] += n
        await conn.close()

    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(one(s, *p) for p in plans))


# ----- text that costs the server work -----
async def unspaced_text(camp, phase, deltas: int = 2000, size: int = 10) -> None:
    """Streamed text without whitespace (a long URL, Chinese without punctuation) in `deltas` small
    deltas: the server takes them at once (its cost per delta bounded by the delta) and the canary
    streams on."""
    url = ("https://example.com/" + "abcdefghij" * (deltas * size // 10))[:deltas * size]
    chinese = ("这是一段没有标点符号的很长的中文文本用来测试" * (deltas * size // 20 + 1))[:deltas * size]

    async def native(s):
        conn, _ = await Conn.open(NATIVE, s, camp.server.ws_url, headers=camp.auth_headers)
        await conn.send(json.dumps({"type": "context.start", "context_id": "u"}))
        t0 = time.monotonic()
        for i in range(deltas):
            await conn.send(json.dumps({"type": "text", "context_id": "u", "text": url[i * size:(i + 1) * size]}))
        reply = await conn.exchange(json.dumps({"type": "cancel"}), timeout=60)
        return conn, reply, time.monotonic() - t0, NATIVE

    async def cartesia(s):
        conn, _ = await Conn.open(CARTESIA, s, camp.server.ws_url, headers=camp.auth_headers)
        t0 = time.monotonic()
        for i in range(deltas):
            m = {"context_id": "u", "transcript": chinese[i * size:(i + 1) * size], "continue": True}
            if i == 0:
                m.update(voice=CARTESIA_VOICE, output_format=CARTESIA_PCM, model_id="sonic-2")
            await conn.send(json.dumps(m, ensure_ascii=False))
        reply = await conn.exchange(json.dumps({"context_id": "u", "cancel": True}), timeout=60)
        return conn, reply, time.monotonic() - t0, CARTESIA

    async with aiohttp.ClientSession() as s:
        for conn, reply, took, ep in await asyncio.gather(native(s), cartesia(s)):
            judge(ep, f"{deltas} unspaced deltas of {size} characters", reply, phase, False)
            if took > 10:
                phase.fail("slow text", f"{ep.name}: {deltas} deltas of {size} characters without whitespace took "
                           f"{took:.1f} s to be taken and answered (the cost of a delta must be bounded by the delta)")
            await conn.close()


# ----- contexts per connection -----
PACE_AFTER = 800      # messages sent at once: within the default burst of --max-messages-per-s (200/s for 5 s)
PACE_PER_S = 150      # then this many a second, below its average


async def contexts_per_connection(camp, phase, limit: int, extra: int) -> None:
    """No protocol lets one socket open more than `limit` contexts: each one beyond gets an error."""
    async with aiohttp.ClientSession() as s:
        # Cartesia: contexts without text hold no engine slot but are state on the server all the same
        conn, _ = await Conn.open(CARTESIA, s, camp.server.ws_url, headers=camp.auth_headers)
        n = limit + extra
        for i in range(n):
            await conn.send(json.dumps({"context_id": f"k{i}", "model_id": "sonic-2", "continue": True,
                                        "voice": CARTESIA_VOICE, "output_format": CARTESIA_PCM}))
            if i % 100 == 99 and i >= PACE_AFTER:
                await asyncio.sleep(100 / PACE_PER_S)       # under --max-messages-per-s, or it closes with 1008
            elif i % 500 == 0:
                await asyncio.sleep(0)
        reply = await conn.exchange(json.dumps({"context_id": "after", "cancel": True}), timeout=60)
        refused = {m.get("context_id") for m in reply.jsons() if m.get("type") == "error"}
        beyond = {f"k{i}" for i in range(limit, n)}
        if not beyond <= refused:
            phase.fail("contexts per connection", f"cartesia: {n} contexts opened on one socket, "
                       f"{len(beyond - refused)} of the {extra} beyond the limit of {limit} accepted")
        judge(CARTESIA, f"{n} contexts on one socket", reply, phase, False)
        phase.errors_answered += len(refused)
        await conn.close()
        # every protocol with contexts, with text (engine contexts)
        for ep, make in ((NATIVE, lambda i: {"type": "text", "context_id": f"n{i}", "text": "Hold on."}),
                         (TWILIO, lambda i: {"type": "text", "context_id": f"n{i}", "text": "Hold on."}),
                         (EL_MULTI, lambda i: {"text": "Hold on. ", "context_id": f"n{i}"}),
                         (CARTESIA, lambda i: {"context_id": f"n{i}", "transcript": "Hold on.", "continue": True,
                                               "voice": CARTESIA_VOICE, "output_format": CARTESIA_PCM})):
            conn, _ = await Conn.open(ep, s, camp.server.ws_url, headers=camp.auth_headers)
            for i in range(limit):
                judge(ep, f"context {i + 1} of {limit}", await conn.exchange(json.dumps(make(i))), phase, False)
            over = await conn.exchange(json.dumps(make(limit)))
            judge(ep, f"context {limit + 1} on one socket (limit {limit})", over, phase, True)
            await conn.close()
