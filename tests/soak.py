"""The soak: a real `talkgate serve` under the whole mix for N minutes, with process and disk faults on a schedule
(issue 50; docs/reliability.md, "The soak").

    python -m tests.soak --minutes 60 --seed 1 --out /tmp/soak          # as root: the voice store on a small tmpfs

Starts `talkgate serve` on the tiny Base checkpoint (CPU, TLS with a certificate made here, supervisor + 2 workers +
an engine process, an API key, the voice store on a tmpfs of --store-mb), measures its capacity (native sessions a
second at --capacity-concurrency, unless --capacity gives it), then drives --load of it as an open-loop mix over
every WebSocket protocol (tests/fuzz clients), HTTP whole and streamed, streamed text, cancels and barge-ins, voice
uploads and deletions; slow readers and reconnect storms in turns; and, spread evenly over the run, the faults:
SIGKILL of a worker, SIGKILL of the engine process, the voice store's disk full, the store read-only (with a restart
while it is), a kill of every worker mid-upload, a stored voice file truncated, SIGTERM drain and restart.

Writes to --out: samples.csv (each process's VmRSS, descriptors and threads every --sample-s), sessions.csv (every
session: kind, start, end, outcome, close code), faults.csv, checks.json, report.md, rss.svg (each process's RSS over
the run); prints the verdict and exits 0 when it passes, 1 when not.
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import random
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from talkgate.synth.checkpoint import create_checkpoint
from tests.fuzz.endpoints import CARTESIA, DEEPGRAM, EL_MULTI, EL_SINGLE, NATIVE, TWILIO, Conn, Reply
from tests.fuzz.faults import audio_ms, is_error_frame, keepalive, start_messages
from tests.fuzz.rawws import OP_TEXT, Ended, Frame, HandshakeRefused, RawWebSocket
from tests.fuzz.rss_soak import open_fds, role, status_mb
from tests.serverproc import TalkgateServer, descendants
from tests.tlscert import self_signed
from tests.voicetools import AUTH, KEY, audio_file, voice_form

SESSION_TIMEOUT_S = 60.0
MAX_IN_FLIGHT = 24              # the engine's 32 slots (--max-contexts) keep room for the storms' sockets
# how long each fault may take until /ready answers 200 again (docs/operations.md: a process is restarted at once)
RECOVERY_LIMIT_S = {"worker SIGKILL": 30, "engine SIGKILL": 60, "drain and restart": 120, "disk full": 5,
                    "read-only store and restart": 120, "kill mid-upload": 30, "voice file truncated": 5}
STORM_SOCKETS = 40
SLOW_QUIET_S, SLOW_MOST_S = 15, 240   # a slow reader hangs after 15 s without a message; bounded at 240 s
CUT_UNREAD_S = 25               # a cut reader reads nothing this long: the engine makes far more than --max-backlog-ms
CUT_RCVBUF = 4096               # ... and its socket takes little of it (no TCP window growing to megabytes)
CUT_ENDPOINTS = (NATIVE, DEEPGRAM, CARTESIA, EL_MULTI)   # in turn
MAX_BACKLOG_MS, GRACE_MS = 10_000, 1000     # the server's --max-backlog-ms (its default) and min(1 s, that)
CUT_SLACK_MS = 500              # a cut reader's measure of the audio made: the marker's way in and the rule's tick
# a cut reader's marker: a message answered at once, in the order of the server's queue (its reply follows every
# frame queued before the server read it), and how to know the reply; none changes the utterance
CUT_MARKERS = {
    NATIVE: (json.dumps({"type": "ping", "id": "marker"}),
             lambda m: m.get("type") == "pong" and m.get("id") == "marker"),
    DEEPGRAM: (json.dumps({"type": "KeepAlive"}), lambda m: m.get("type") == "Warning"),    # no KeepAlive: a Warning
    CARTESIA: (json.dumps({"context_id": "marker", "cancel": "now"}), lambda m: m.get("context_id") == "marker"),
    EL_MULTI: (json.dumps({"context_id": "marker", "close_context": True}),
               lambda m: m.get("contextId") == "marker" and m.get("isFinal") is True),
}
FD_SLACK, THREAD_SLACK = 4, 2   # a storm's descriptors and threads are back within this of the level before it
TEXT = "The soak keeps speaking while the faults come and go."
ENDPOINTS = (NATIVE, TWILIO, EL_MULTI, EL_SINGLE, CARTESIA, DEEPGRAM)
HEAP_PROBE = Path(__file__).parent / "heapprobe"


@dataclass
class Outcome:
    kind: str
    start: float
    end: float = 0.0
    ok: bool = False
    detail: str = ""
    close_code: int | None = None      # the server's close code; None when it closed without one
    closed_by_server: bool = False
    others: int = 0             # a cut reader: the sessions running while it ran, and how many of them failed
    others_failed: int = 0


@dataclass
class FaultRecord:
    name: str
    start: float
    ready_s: float = -1.0
    within_limit: bool = False
    failed_sessions: int = 0
    sessions_in_window: int = 0
    voices_intact: bool = False
    detail: str = ""
    end: float = 0.0
    clear_error: bool | None = None     # a disk fault: the upload answered 500 voice_store_unavailable


@dataclass
class Soak:
    args: argparse.Namespace
    tmp: Path
    store: Path
    cert: Path
    key: Path
    ckpt: Path
    t0: float = field(default_factory=time.monotonic)
    server: TalkgateServer | None = None
    outcomes: list[Outcome] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    storms: list[dict] = field(default_factory=list)
    levels: dict[str, dict] = field(default_factory=dict)        # "end": descriptors and threads at rest at the end
    acked_voices: dict[str, str] = field(default_factory=dict)   # name -> id, what the server acknowledged
    lost_voices: dict[str, str] = field(default_factory=dict)    # voices a fault owns (the truncated file)
    log_lines: list[str] = field(default_factory=list)           # every server's output, restarts included
    uploads: int = 0
    deletions: int = 0
    voice_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    final_voice_check: str = ""
    in_flight: set = field(default_factory=set)                  # the sessions, slow readers and storms running
    storm_tasks: set = field(default_factory=set)
    paused: bool = False                                         # a storm holds new sessions back (storm())
    quiet: asyncio.Lock = field(default_factory=asyncio.Lock)   # a storm and a fault never overlap

    def now(self) -> float:
        return time.monotonic() - self.t0

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cert))

    def start_server(self) -> None:
        env = {}
        if self.args.trace_heap:     # tests/heapprobe: every process of the server answers SIGUSR2 with a heap probe
            env = {"TALKGATE_HEAP_PROBE": str(self.args.trace_heap),
                   "PYTHONPATH": os.pathsep.join([str(HEAP_PROBE), os.environ.get("PYTHONPATH", "")])}
        self.server = TalkgateServer(
            self.ckpt, "--workers", "2", "--api-key", KEY, "--voice-store", str(self.store), "--max-contexts", "32",
            "--ssl-certfile", str(self.cert), "--ssl-keyfile", str(self.key), "--seed", "1", timeout_s=300, env=env)
        self.server.__enter__()

    def stop_server(self, sig: int = signal.SIGTERM) -> int | None:
        code = self.server.stop(sig, timeout_s=90)
        self.server.__exit__(None, None, None)
        self.log_lines += self.server.output
        return code


# ----- sessions: each returns an Outcome and never raises -----
async def _speak(soak: Soak, http, kind: str, rng: random.Random) -> Outcome:
    out = Outcome(kind, soak.now())
    ws = soak.server.ws_url
    try:
        if kind == "http":
            fmt = rng.choice(["pcm", "wav", "mp3", "opus"])
            async with http.post(soak.server.url + "/v1/audio/speech", headers=AUTH, json={
                    "input": TEXT, "response_format": fmt, "fixed_frames": 8, "stream": rng.random() < 0.5}) as r:
                body = await r.read()
                out.ok, out.detail = r.status == 200 and len(body) > 0, f"HTTP {r.status}"
        else:
            await _ws_session(soak, http, ws, kind, rng, out)
    except (aiohttp.ClientError, ConnectionError, asyncio.TimeoutError, OSError) as e:
        out.detail = f"{type(e).__name__}: {e}"[:200]
    out.end = soak.now()
    return out


def _done(ep, item) -> bool:
    if not isinstance(item, dict):
        return False
    if ep in (NATIVE, TWILIO):
        return item.get("type") in ("context.done", "error")
    if ep is CARTESIA:
        return item.get("type") in ("done", "error")
    if ep is DEEPGRAM:
        return item.get("type") == "Flushed"
    return bool(item.get("isFinal")) or "error" in item


def _opening(ep, kind: str, rng: random.Random) -> list[dict]:
    """The messages of one utterance; `streamed` sends its text in word deltas."""
    words = TEXT.split(" ")
    deltas = [w + " " for w in words] if kind == "streamed" else [TEXT]
    if ep in (NATIVE, TWILIO):
        start = [{"type": "context.start", "context_id": "c", "fixed_frames": 10}] if ep is NATIVE else []
        return start + [{"type": "text", "context_id": "c", "text": d} for d in deltas] + \
            [{"type": "flush", "context_id": "c"}]
    if ep is EL_MULTI:
        if kind == "barge-in":      # the agent's text still streaming, not flushed, when the user speaks over it
            return [{"text": " ", "context_id": "c"}] + [{"text": w + " ", "context_id": "c"} for w in words]
        return [{"text": " ", "context_id": "c"}] + [{"text": d, "context_id": "c"} for d in deltas] + \
            [{"context_id": "c", "flush": True}, {"context_id": "c", "close_context": True}]
    if ep is EL_SINGLE:
        # stream-input ends its input with an empty text (ElevenLabs' end-of-input message; sessions/elevenlabs.py
        # `_on_single`): the rest is spoken, then isFinal and close 1000. {"text": "", "flush": true} is a flush
        # of nothing, after which the server waits for more text (and closes input_timeout_exceeded after 20 s).
        return [{"text": " "}] + [{"text": d} for d in deltas] + [{"text": ""}]
    if ep is CARTESIA:
        fmt = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}
        return [{"context_id": "c", "model_id": "sonic-2", "transcript": d, "continue": i < len(deltas) - 1,
                 "voice": {"mode": "id", "id": "ryan"}, "output_format": fmt} for i, d in enumerate(deltas)]
    return [{"type": "Speak", "text": d} for d in deltas] + [{"type": "Flush"}]


async def _ws_session(soak: Soak, http, ws: str, kind: str, rng: random.Random, out: Outcome) -> None:
    ep = {"native": NATIVE, "streamed": NATIVE, "cancel": NATIVE, "twilio": TWILIO, "el-multi": EL_MULTI,
          "barge-in": EL_MULTI, "el-single": EL_SINGLE, "cartesia": CARTESIA, "deepgram": DEEPGRAM}[kind]
    conn, greet = await Conn.open(ep, http, ws, headers=AUTH)
    try:
        if ep.greeting is not None and not greet.answered:
            out.detail = "no greeting: " + greet.brief()[:150]
            return
        for m in _opening(ep, kind, rng):
            await conn.send(json.dumps(m))
        if kind == "cancel":
            await asyncio.sleep(rng.uniform(0.0, 0.5))
            await conn.send(json.dumps({"type": "cancel", "context_id": "c"}))
        elif kind == "barge-in":       # the user speaks over the agent: the context goes, a new one follows
            await asyncio.sleep(rng.uniform(0.05, 0.5))
            for m in ({"context_id": "c", "close_context": True}, {"text": "Sorry, go on. ", "context_id": "d"},
                      {"context_id": "d", "flush": True}, {"context_id": "d", "close_context": True}):
                await conn.send(json.dumps(m))
        if kind == "cancel":
            await _judge_cancel(conn, out)
        elif kind == "barge-in":
            await _judge_barge_in(conn, out)
        else:
            r = await conn.collect(lambda i: _done(ep, i), SESSION_TIMEOUT_S)
            errors = [i for i in r.jsons() if ep.is_error(i)]
            out.ok = r.answered and not errors
            out.detail = "" if out.ok else (r.brief()[:200] if not r.answered else json.dumps(errors[0])[:200])
            if ep is EL_SINGLE and out.ok:      # stream-input ends with the server's close 1000 after isFinal
                if conn.closed is None:
                    await conn.drain(5)
                if conn.closed is None or conn.abrupt or conn.closed[0] != 1000:
                    out.ok = False
                    out.detail = f"stream-input not closed 1000 after isFinal: {conn.closed} abrupt={conn.abrupt}"
    finally:
        if conn.closed is not None:
            out.closed_by_server = True
            out.close_code = None if conn.abrupt or conn.closed[0] in (None, 1005, 1006) else conn.closed[0]
        await conn.close()


def _is_audio(item) -> bool:
    return isinstance(item, bytes) or (isinstance(item, dict) and isinstance(item.get("audio"), str))


async def _judge_cancel(conn: Conn, out: Outcome) -> None:
    """The runner cancelled context c (native): a success when the context ends `context.cancelled` with no audio
    after it, or, when the cancel came too late, `context.done` and then the cancel answered `unknown_context`
    (docs/protocol.md: every context ends with exactly one of done, cancelled or an error)."""
    r = await conn.collect(lambda i: isinstance(i, dict) and i.get("type") in ("context.cancelled", "error"),
                           SESSION_TIMEOUT_S)
    js = r.jsons()
    last = js[-1] if r.answered else {}
    if last.get("type") == "context.cancelled" and last.get("context_id") == "c":
        after = await conn.collect(None, 0.5)     # nothing of the cancelled context follows its context.cancelled
        late = [i for i in after.items if _is_audio(i)]
        out.ok = not late
        out.detail = "cancelled" if out.ok else f"{len(late)} audio frames after context.cancelled"
    elif last.get("code") == "unknown_context" and any(i.get("type") == "context.done" for i in js):
        out.ok, out.detail = True, "done before the cancel (answered unknown_context)"
    else:
        out.detail = "cancel not answered with context.cancelled: " + r.brief()[:180]


async def _judge_barge_in(conn: Conn, out: Outcome) -> None:
    """ElevenLabs multi-stream-input barge-in: context c closed with its text not flushed (it stops, purged) or
    flushed already (its audio finishes); either way c answers isFinal with no audio of c after it, and context d
    then speaks to its isFinal. ElevenLabs names the context `contextId` in what it sends."""
    r = await conn.collect(lambda i: isinstance(i, dict) and i.get("contextId") == "d" and i.get("isFinal"),
                           SESSION_TIMEOUT_S)
    items = r.jsons()
    errors = [i for i in items if "error" in i]
    final_c = next((n for n, i in enumerate(items) if i.get("contextId") == "c" and i.get("isFinal")), None)
    late_c = [] if final_c is None else [i for i in items[final_c + 1:] if i.get("contextId") == "c" and _is_audio(i)]
    out.ok = r.answered and not errors and final_c is not None and not late_c
    out.detail = "" if out.ok else (json.dumps(errors[0])[:200] if errors else "no isFinal for c" if final_c is None
                                    and r.answered else f"{len(late_c)} audio of c after its isFinal" if late_c
                                    else r.brief()[:200])


async def _slow_readers(soak: Soak, http, cut_ep) -> list[Outcome]:
    """A slow reader (kept or cut, _slow_reader) and a cut reader (_cut_reader) at once; no fault overlaps them:
    what ends them is the server's judgement of them."""
    async with soak.quiet:
        return list(await asyncio.gather(_slow_reader_run(soak, http), _cut_reader(soak, cut_ep)))


def is_marker(ep, frame: Frame) -> bool:
    """Is `frame` the reply to a cut reader's marker (CUT_MARKERS)?"""
    if frame.opcode != OP_TEXT:
        return False
    try:
        msg = json.loads(frame.payload)
    except ValueError:
        return False
    return isinstance(msg, dict) and CUT_MARKERS[ep][1](msg)


def _cut_reader_run(port: int, tls: ssl.SSLContext, ep) -> tuple[list[Frame], Frame | Ended]:
    """A client of `ep` that starts a long utterance and reads nothing for CUT_UNREAD_S (keepalives written, so it is
    not idle: ElevenLabs ends a context without new text for 20 s), with a receive buffer of CUT_RCVBUF and no
    buffer of its own in between (aiohttp's client, over TLS, takes megabytes off the socket unread), then writes its
    marker (CUT_MARKERS) and reads what the server sent, answering pings as RFC 6455 asks (the heartbeat's ping
    waits unread behind the audio): -> the frames (pings left out) and how the stream ended."""
    ws = RawWebSocket.connect(port, ep.path(), AUTH, rcvbuf=CUT_RCVBUF, tls=tls)
    try:
        for m in start_messages(ep, "cut"):
            ws.send_text(m)
        deadline = time.monotonic() + CUT_UNREAD_S
        while time.monotonic() < deadline:
            time.sleep(0.5)
            if keepalive(ep) is not None:
                try:
                    ws.send_text(keepalive(ep))
                except OSError:         # the server closed it: what it sent is read below
                    break
        try:
            ws.send_text(CUT_MARKERS[ep][0])
        except OSError:                 # closed: no reply then, what it sent is read below
            pass
        return ws.frames_until_close(SLOW_QUIET_S, pong=True)
    finally:
        ws.close()


async def _cut_reader(soak: Soak, ep) -> Outcome:
    """A client far behind real time (_cut_reader_run), judged by the server's rule (docs/protocol.md, Limits): a
    context is cancelled with the protocol's `slow_consumer` error when over --max-backlog-ms of its audio waits
    unread on the server while its client is behind real time by over min(1 s, that) (over 4096 messages or 16 MiB
    queued: close 1008 `slow_consumer`); the connection then kept or closed with a code (Deepgram: 1008
    `slow_consumer`). Cut that way, it passes.

    Not cut, it passes only when the rule did not call for a cut: the server had made at most MAX_BACKLOG_MS +
    GRACE_MS + CUT_SLACK_MS of its audio by the time the client read again (engine slower than real time: a client
    that reads nothing is then not behind by the rule). Measured: the audio read before the reply to the marker the
    client writes as it starts reading. The server's outbox is one queue in order, so every frame of the utterance
    made before the server read the marker is ahead of the reply and every frame made after it behind; not cut,
    nothing of it was dropped. So that audio is what the server had made by the time it read the marker (a little
    after the client resumed: the measure can only be larger than what it had made then, never smaller), and since
    the unread audio only grows while the client reads nothing, its largest. Not cut with more than that, not cut
    without the marker's reply, any other error, or a close without a code fails it. The sessions running meanwhile
    are judged as always, and report() counts those of them that failed outside any fault's window against it."""
    out = Outcome("cut reader", soak.now())
    loop = asyncio.get_running_loop()
    try:
        frames, end = await loop.run_in_executor(None, _cut_reader_run, soak.server.port, soak.ssl_context(), ep)
    except (OSError, HandshakeRefused, ssl.SSLError) as e:
        out.detail, out.end = f"{ep.name}: {type(e).__name__}: {e}"[:200], soak.now()
        return out
    out.end = soak.now()
    marker = next((n for n, f in enumerate(frames) if is_marker(ep, f)), None)
    audio = sum(audio_ms(ep, f) for f in frames) / 1000
    made = sum(audio_ms(ep, f) for f in frames[:marker]) / 1000 if marker is not None else None
    frames = [f for n, f in enumerate(frames) if n != marker]
    first = next((n for n, f in enumerate(frames) if is_error_frame(ep, f)), None)
    done = any(f.opcode == OP_TEXT and any(m in f.payload for m in (b'"context.done"', b'"isFinal":true',
                                                                    b'"type":"done"', b'"Flushed"')) for f in frames)
    if isinstance(end, Frame):          # a close frame
        out.closed_by_server = True
        out.close_code = end.close_code if end.close_code not in (None, 1005, 1006) else None
        how = f"close {end.close_code} {end.close_reason!r}"
    else:
        out.closed_by_server = end.how != "timeout"      # a timeout: the connection left open, as it may be
        how = "left open" if end.how == "timeout" else f"ended by {end.how}, no close frame"
    cut = first is not None and b"slow_consumer" in frames[first].payload
    cut_by_close = isinstance(end, Frame) and end.close_code == 1008 and "slow_consumer" in end.close_reason
    limit = (MAX_BACKLOG_MS + GRACE_MS + CUT_SLACK_MS) / 1000
    coded = not (out.closed_by_server and out.close_code is None)
    if (cut or cut_by_close) and coded:
        out.ok = True
        out.detail = f"{ep.name}: cut: {'slow_consumer error' if cut else 'close 1008 slow_consumer'} after " \
            f"{audio:.1f} s of audio read; then {how}"
    elif first is None and made is not None and made <= limit and coded:
        out.ok = True
        out.detail = f"{ep.name}: kept by the rule: {made:.1f} s of audio made by the resume (<= {limit:.1f} s); " \
            f"{audio:.1f} s read; then {how}"
    else:
        out.detail = f"{ep.name}: " + (f"other error {frames[first].payload[:150]!r}" if first is not None else
                                       "not cut, no reply to the marker" if made is None else
                                       f"not cut with {made:.1f} s of audio made by the resume (> {limit:.1f} s)"
                                       + (": the whole utterance" if done else "")) + \
            f"; {audio:.1f} s of audio read; then {how}"
    return out


async def _slow_reader_run(soak: Soak, http) -> Outcome:
    """Starts a long utterance (750 frames) and reads nothing for 8 s (aiohttp's client over TLS takes megabytes off
    the socket meanwhile, so the server mostly sees a client that reads: the cut reader is the one far behind), then
    reads on, as the fuzz suite's slow-reader phase judges one (tests/fuzz/faults.py): the
    server either kept it (the whole utterance, context.done) or cut it off as documented (docs/protocol.md,
    Limits: the `slow_consumer` error, the context cancelled; or close 1008 `slow_consumer` when its connection's
    write queue is full), never silently: a close without that, a close without a code, or SLOW_QUIET_S without any
    message (a hang; a long utterance on a loaded CPU engine may be slower than real time, so no single deadline)
    fails it. Runs beside a cut reader (_slow_readers)."""
    out = Outcome("slow reader", soak.now())
    try:
        conn, greet = await Conn.open(NATIVE, http, soak.server.ws_url, headers=AUTH)
        for m in start_messages(NATIVE, "slow"):
            await conn.send(m)
        await asyncio.sleep(8)
        items, deadline, hang = [], time.monotonic() + SLOW_MOST_S, False
        end = lambda i: isinstance(i, dict) and i.get("type") in ("error", "context.done")     # noqa: E731
        while conn.closed is None and time.monotonic() < deadline:
            part = await conn.collect(end, SLOW_QUIET_S)
            items += part.items
            if part.answered:
                break
            if not part.items and conn.closed is None:
                hang = True
                break
        js = [i for i in items if isinstance(i, dict)]
        err = next((i for i in js if i.get("type") == "error"), None)
        done = any(i.get("type") == "context.done" for i in js)
        closed = conn.closed
        if conn.closed is not None:
            out.closed_by_server = True
            out.close_code = None if conn.abrupt or conn.closed[0] in (None, 1005, 1006) else conn.closed[0]
        if err is not None:
            out.ok = err.get("code") == "slow_consumer"
            out.detail = f"cut: {err.get('code')}" + ("" if out.ok else f" {json.dumps(err)[:150]}")
        elif done:
            out.ok, out.detail = True, "kept: context.done"
        elif closed is not None and out.close_code == 1008 and "slow_consumer" in (closed[1] or ""):
            out.ok, out.detail = True, "cut: close 1008 slow_consumer"
        else:
            out.detail = ("hang: %d s without a message" % SLOW_QUIET_S if hang else
                          f"silent end: close {closed} abrupt={conn.abrupt}" if closed else "not over in %d s"
                          % SLOW_MOST_S) + "; " + Reply(items=items).brief()[:120]
        await conn.send(json.dumps({"type": "cancel"}))
        await conn.close()
    except (aiohttp.ClientError, ConnectionError, asyncio.TimeoutError, OSError) as e:
        out.detail = f"{type(e).__name__}: {e}"[:200]
    out.end = soak.now()
    return out


async def _storm_socket(soak: Soak, http, rng: random.Random) -> None:
    ep = rng.choice(ENDPOINTS)
    try:
        conn, _ = await Conn.open(ep, http, soak.server.ws_url, headers=AUTH)
        for m in start_messages(ep, "storm"):
            await conn.send(m)
        await conn.collect(None, rng.uniform(0.0, 0.6))
        if rng.random() < 0.5 and conn.ws._conn is not None:     # vanish: TCP reset, no close frame
            conn.ws._conn.transport.abort()
        await conn.close()
    except (aiohttp.ClientError, ConnectionError, asyncio.TimeoutError, OSError):
        pass


def process_levels(root_pid: int) -> dict[str, tuple[int, int]]:
    """role -> (descriptors, threads) of every live process of the server."""
    levels = {}
    for pid in [root_pid, *descendants(root_pid)]:
        try:
            levels[role(pid, root_pid)] = (open_fds(pid), status_mb(pid)["Threads"])
        except OSError:
            pass
    return levels


def _at_level(before: dict, after: dict) -> bool:
    return all(r in after and after[r][0] <= fd + FD_SLACK and after[r][1] <= th + THREAD_SLACK
               for r, (fd, th) in before.items())


async def storm(soak: Soak, http, rng: random.Random) -> None:
    """A reconnect storm, then whether each process's descriptors and threads return to their level before it.
    Both levels are taken at rest: new sessions are held back and those running (each holds a socket in a worker
    and a context in the engine, up to MAX_IN_FLIGHT of them) are let finish first, and no fault runs meanwhile
    (soak.quiet), so what differs is what the storm left behind, not the load of the moment."""
    async with soak.quiet:
        soak.paused = True
        try:
            me = asyncio.current_task()
            others = [t for t in soak.in_flight if t is not me and t not in soak.storm_tasks]
            if others:
                await asyncio.wait(others, timeout=SLOW_MOST_S + 30)
            await asyncio.sleep(6)     # closed sockets linger up to 5 s (LingeringClose)
            before = process_levels(soak.server.proc.pid)
            t = soak.now()
            for _ in range(STORM_SOCKETS // 8):
                await asyncio.gather(*(_storm_socket(soak, http, rng) for _ in range(8)))
            deadline, after = time.monotonic() + 30, {}
            while time.monotonic() < deadline:
                await asyncio.sleep(2)
                after = process_levels(soak.server.proc.pid)
                if _at_level(before, after):
                    break
            soak.storms.append({"t": round(t), "before": before, "after": after, "back": _at_level(before, after)})
        finally:
            soak.paused = False


# ----- voices -----
async def upload_voice(soak: Soak, http, name: str) -> tuple[int, dict]:
    data = voice_form(name, audio_file(2.0, seed=len(name)))
    async with http.post(soak.server.url + "/v1/audio/voices", data=data, headers=AUTH) as r:
        body = await r.json(content_type=None)
        if r.status in (200, 201):
            soak.acked_voices[name] = body["id"]
            soak.uploads += 1
        return r.status, body


async def voice_cycle(soak: Soak, http, rng: random.Random, n: int) -> Outcome:
    """Upload a voice, speak with one, delete the oldest past four (the store stays a few voices)."""
    out = Outcome("voice", soak.now())
    try:
        async with soak.voice_lock:
            status, body = await upload_voice(soak, http, f"soak-{soak.args.seed}-{n}")
            out.ok, out.detail = status in (200, 201), f"upload HTTP {status} {json.dumps(body)[:120]}"
            while len(soak.acked_voices) > 4:
                name = next(iter(soak.acked_voices))
                async with http.delete(f"{soak.server.url}/v1/audio/voices/{soak.acked_voices[name]}",
                                       headers=AUTH) as r:
                    if r.status not in (200, 204):
                        out.ok, out.detail = False, f"delete HTTP {r.status}"
                        break
                    del soak.acked_voices[name]
                    soak.deletions += 1
    except (aiohttp.ClientError, ConnectionError, asyncio.TimeoutError, OSError, ValueError) as e:
        out.detail = f"{type(e).__name__}: {e}"[:200]
    out.end = soak.now()
    return out


async def check_voices(soak: Soak, http) -> str:
    """'' when the listing holds exactly the acknowledged voices and each resolves; else what differs."""
    async with soak.voice_lock:
        async with http.get(soak.server.url + "/v1/audio/voices", headers=AUTH) as r:
            listed = {v["name"]: v["id"] for v in (await r.json())["voices"] if str(v.get("name", "")).startswith("soak-")}
        problems = []
        if listed != soak.acked_voices:
            problems.append(f"listed {sorted(listed)} acknowledged {sorted(soak.acked_voices)}")
        for name, vid in listed.items():
            async with http.get(f"{soak.server.url}/v1/audio/voices/{vid}", headers=AUTH) as r:
                if r.status != 200:
                    problems.append(f"{name} listed but GET answers {r.status}")
        return "; ".join(problems)


# ----- faults -----
def pid_of(soak: Soak, what: str) -> int | None:
    root = soak.server.proc.pid
    return next((p for p in descendants(root) if role(p, root).startswith(what)), None)


async def wait_ready(soak: Soak, http, limit_s: float) -> float:
    """Seconds until /ready answers 200 (after the fault's processes are gone and back), -1 past limit_s."""
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        try:
            async with http.get(soak.server.url + "/ready", timeout=aiohttp.ClientTimeout(total=3)) as r:
                if r.status == 200:
                    return time.monotonic() - start
        except (aiohttp.ClientError, ConnectionError, asyncio.TimeoutError, OSError):
            pass
        await asyncio.sleep(0.25)
    return -1.0


def wait_replaced(soak: Soak, what: str, old: int, limit_s: float) -> None:
    """Until a process of role `what` other than `old` lives (the supervisor restarted it), at most limit_s."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and pid_of(soak, what) in (None, old):
        time.sleep(0.2)


def fill(path: Path) -> None:
    """Fill the filesystem of `path` to ENOSPC."""
    with open(path, "wb") as f:
        block = b"\0" * 65536
        for _ in range(100000):        # far more than any --store-mb
            try:
                f.write(block)
                f.flush()
            except OSError:
                return


def _store_unavailable(status: int, body) -> bool:
    return status == 500 and isinstance(body, dict) and isinstance(body.get("error"), dict) and \
        body["error"].get("code") == "voice_store_unavailable"


async def run_fault(soak: Soak, http, name: str, rng: random.Random) -> FaultRecord:
    rec = FaultRecord(name, soak.now())
    loop = asyncio.get_running_loop()
    limit = RECOVERY_LIMIT_S[name]
    if name in ("worker SIGKILL", "engine SIGKILL"):
        what = "worker" if name == "worker SIGKILL" else "engine"
        victim = pid_of(soak, what)
        os.kill(victim, signal.SIGKILL)
        await loop.run_in_executor(None, wait_replaced, soak, what, victim, limit)
    elif name == "drain and restart":
        code = await loop.run_in_executor(None, soak.stop_server)
        rec.detail = f"exit status {code}"
        await loop.run_in_executor(None, soak.start_server)
    elif name == "disk full":
        # the load's own voice uploads wait while the disk is full: one the fill overtook would be refused 500
        # voice_store_unavailable as it should, and counted as a session failed beside a fault that stops no process
        async with soak.voice_lock:
            filler = soak.store / "filler"
            fill(filler)
            status, body = await upload_voice(soak, http, f"soak-full-{rec.start:.0f}")
            rec.detail = f"upload on a full disk: HTTP {status} {body.get('error', {}).get('code', body)}"
            rec.clear_error = _store_unavailable(status, body)
            if not rec.clear_error:
                rec.detail += " (expected 500 voice_store_unavailable)"
            filler.unlink()
    elif name == "read-only store and restart":
        subprocess.run(["mount", "-o", "remount,ro", str(soak.store)], check=True)
        try:
            status, body = await upload_voice(soak, http, f"soak-ro-{rec.start:.0f}")
            rec.detail = f"upload on a read-only store: HTTP {status} {body.get('error', {}).get('code', body)}"
            rec.clear_error = _store_unavailable(status, body)
            await loop.run_in_executor(None, soak.stop_server)
            try:
                await loop.run_in_executor(None, soak.start_server)     # start-up must not need a writable store
                rec.detail += "; restarted while read-only"
            except RuntimeError as e:
                rec.detail += "; start-up FAILED while read-only: " + str(e).splitlines()[-1][:200]
                rec.ready_s = -2.0
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(soak.store)], check=True)
        if rec.ready_s == -2.0:
            soak.log_lines += soak.server.output
            await loop.run_in_executor(None, soak.start_server)
    elif name == "kill mid-upload":
        name_ = f"soak-{soak.args.seed}-killed-{rec.start:.0f}"
        async with soak.voice_lock:
            task = asyncio.ensure_future(upload_voice(soak, http, name_))
            await asyncio.sleep(rng.uniform(0.05, 0.4))
            victims = [p for p in descendants(soak.server.proc.pid) if role(p, soak.server.proc.pid).startswith("worker")]
            for p in victims:
                os.kill(p, signal.SIGKILL)
            try:
                status, _ = await task
                rec.detail = f"upload answered {status} before the kill"
            except (aiohttp.ClientError, ConnectionError, OSError, ValueError) as e:
                rec.detail = f"upload cut: {type(e).__name__}"
        for p in victims:
            await loop.run_in_executor(None, wait_replaced, soak, "worker", p, limit)
        ready = await wait_ready(soak, http, limit)
        async with http.get(soak.server.url + "/v1/audio/voices", headers=AUTH) as r:
            listed = {v["name"]: v["id"] for v in (await r.json())["voices"]}
        if name_ in listed and name_ not in soak.acked_voices:     # stored whole before the kill: it counts
            soak.acked_voices[name_] = listed[name_]
            rec.detail += "; the voice was stored whole"
        rec.ready_s = ready
    elif name == "voice file truncated":
        async with soak.voice_lock:
            if soak.acked_voices:
                name_, vid = next(iter(soak.acked_voices.items()))
                path = soak.store / "voices" / f"{vid}.json"
                data = path.read_bytes()
                path.write_bytes(data[: len(data) // 2])
                soak.lost_voices[name_] = soak.acked_voices.pop(name_)   # the disk lost it: it must vanish whole
                rec.detail = f"{name_}: {len(data)} -> {len(data) // 2} bytes"
    failed_start = rec.ready_s == -2.0
    if rec.ready_s < 0:
        rec.ready_s = await wait_ready(soak, http, limit)
        if rec.ready_s >= 0:            # from the fault: a restart's start_server has waited for ready already
            rec.ready_s = soak.now() - rec.start
    rec.within_limit = 0 <= rec.ready_s <= limit and not failed_start
    problems = await check_voices(soak, http)
    rec.voices_intact = not problems
    if problems:
        rec.detail += "; voices: " + problems
    rec.end = soak.now()
    return rec


FAULTS = ("worker SIGKILL", "engine SIGKILL", "disk full", "kill mid-upload", "voice file truncated",
          "read-only store and restart", "drain and restart")
SESSIONLESS_FAULTS = ("disk full", "voice file truncated")     # no process goes: no session may fail in their window
DISK_FAULTS = ("disk full", "read-only store and restart")      # an upload must be refused 500 voice_store_unavailable


# ----- load -----
async def measure_capacity(soak: Soak, http, seconds: float, concurrency: int) -> float:
    """Native sessions completed a second with `concurrency` clients back to back."""
    rng, done = random.Random(0), 0
    deadline = time.monotonic() + seconds

    async def client():
        nonlocal done
        while time.monotonic() < deadline:
            if (await _speak(soak, http, "native", rng)).ok:
                done += 1

    start = time.monotonic()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return done / (time.monotonic() - start)


MIX = {"native": 3, "streamed": 2, "cancel": 1, "barge-in": 1, "twilio": 1, "el-multi": 1, "el-single": 1,
       "cartesia": 2, "deepgram": 1, "http": 3}


async def drive(soak: Soak, rate: float) -> None:
    args, rng = soak.args, random.Random(soak.args.seed)
    end = time.monotonic() + args.minutes * 60
    faults = args.faults
    fault_every = args.minutes * 60 / (len(faults) + 1)
    next_fault, fault_i = time.monotonic() + fault_every, 0
    next_turn = time.monotonic() + 45      # slow readers and storms take turns
    kinds, weights = list(MIX), list(MIX.values())
    in_flight = soak.in_flight
    n = turn = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=soak.ssl_context(), limit=0)) as http:
        if not rate:
            rate = args.load * await measure_capacity(soak, http, 20, args.capacity_concurrency)
            soak.args.measured_rate = rate
            print(f"soak: driving {rate:.2f} sessions/s ({args.load:.0%} of measured capacity)", flush=True)
        start = time.monotonic()
        while time.monotonic() < end or fault_i < len(faults):     # every fault runs, late ones after the end
            await asyncio.sleep(rng.expovariate(rate))
            n += 1
            if len(in_flight) < MAX_IN_FLIGHT and not soak.paused:
                job = voice_cycle(soak, http, rng, n) if n % 25 == 0 else _speak(soak, http, rng.choices(kinds, weights)[0], rng)
                task = asyncio.ensure_future(job)
                in_flight.add(task)
                task.add_done_callback(lambda t: (in_flight.discard(t), t.cancelled() or soak.outcomes.append(t.result())))
            # one turn at a time, and none starts while a fault is due: turns queued on soak.quiet would take it
            # one after the other and a fault, which waits for it to be free, would never run
            fault_due = time.monotonic() >= next_fault and fault_i < len(faults)
            if time.monotonic() >= next_turn and time.monotonic() < end and not soak.paused and not soak.storm_tasks \
                    and not fault_due:
                next_turn = time.monotonic() + 45
                turn += 1
                if turn % 2:        # storms and slow readers alternate, a storm first: a short run has both
                    t = asyncio.ensure_future(storm(soak, http, rng))
                else:
                    t = asyncio.ensure_future(_slow_readers(soak, http, CUT_ENDPOINTS[(turn // 2 - 1) % len(CUT_ENDPOINTS)]))
                    t.add_done_callback(lambda t: t.cancelled() or soak.outcomes.extend(t.result()))
                soak.storm_tasks.add(t)      # a turn waiting for soak.quiet holds no socket yet: storms skip it
                t.add_done_callback(soak.storm_tasks.discard)
                in_flight.add(t)
                t.add_done_callback(in_flight.discard)
            if fault_due and not soak.quiet.locked():
                name = faults[fault_i]
                fault_i += 1
                print(f"soak: {soak.now():.0f} s: fault {name}", flush=True)
                async with soak.quiet:
                    rec = await run_fault(soak, http, name, rng)
                soak.faults.append(rec)
                print(f"soak: {name}: ready in {rec.ready_s:.1f} s; {rec.detail}", flush=True)
                next_fault = start + (fault_i + 1) * fault_every     # the schedule, not drifting by the waits
        if in_flight:
            # readers and storms take longest: a slow reader's hang is judged after up to SLOW_MOST_S
            await asyncio.wait(in_flight, timeout=SLOW_MOST_S + 60)
        soak.final_voice_check = await check_voices(soak, http)
        await asyncio.sleep(6)          # at rest, as a storm's levels (closed sockets linger up to 5 s)
        soak.levels["end"] = process_levels(soak.server.proc.pid)


# ----- sampling and the verdict -----
def sampler(soak: Soak, stop: threading.Event, path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["s", "process", "pid", "rss_mb", "fds", "threads"])
        while True:
            server = soak.server
            if server is not None and server.proc is not None and server.proc.poll() is None:
                root = server.proc.pid
                for pid in [root, *descendants(root)]:
                    try:
                        s = status_mb(pid)
                        w.writerow([round(soak.now(), 1), role(pid, root), pid, round(s["VmRSS"], 2), open_fds(pid),
                                    s["Threads"]])
                    except (OSError, KeyError):      # gone, or a zombie (no VmRSS) between its kill and its reaping
                        pass
                f.flush()
            if stop.wait(soak.args.sample_s):
                return


def slope_mb_per_10min(points: list[tuple[float, float]]) -> float:
    n = len(points)
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    var = sum((p[0] - mx) ** 2 for p in points)
    return 0.0 if var == 0 else sum((p[0] - mx) * (p[1] - my) for p in points) / var * 600


def rss_slopes(samples: list[dict], warm_up_s: float) -> dict[str, dict]:
    """process -> its RSS after warm-up, over its longest-lived pid (a killed process's successor has a warm-up of
    its own, so each pid's series starts at its own first sample + warm_up_s): slope (MB / 10 min, least squares),
    span (s), n (samples), first and last (MB), step (the largest rise between two samples, MB). A bounded
    high-water mark shows as a step or two and flat between; a leak as a steady rise."""
    by_pid: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for s in samples:
        by_pid.setdefault((s["process"], s["pid"]), []).append((float(s["s"]), float(s["rss_mb"])))
    best: dict[str, list[tuple[float, float]]] = {}
    for (proc, _), pts in by_pid.items():
        pts = [p for p in pts if p[0] >= pts[0][0] + warm_up_s]
        if len(pts) >= 3 and (proc not in best or pts[-1][0] - pts[0][0] > best[proc][-1][0] - best[proc][0][0]):
            best[proc] = pts
    return {proc: {"slope": slope_mb_per_10min(pts), "span": pts[-1][0] - pts[0][0], "n": len(pts),
                   "first": pts[0][1], "last": pts[-1][1],
                   "step": max(0.0, *(b[1] - a[1] for a, b in zip(pts, pts[1:])))} for proc, pts in best.items()}


def crashes(soak: Soak) -> list[str]:
    """Processes that exited without a fault killing them, and tracebacks in the servers' logs."""
    killed = sum(1 for f in soak.faults if f.name in ("worker SIGKILL", "engine SIGKILL")) + \
        2 * sum(1 for f in soak.faults if f.name == "kill mid-upload")
    exits = [line.strip() for line in soak.log_lines if re.search(r"exited with", line)]
    found = [f"{len(exits)} process exits for {killed} kills: " + " | ".join(exits)] if len(exits) != killed else []
    return found + [line.strip() for line in soak.log_lines if "Traceback" in line]


def plot(samples: list[dict], faults: list[FaultRecord], path: Path) -> None:
    """rss.svg: each process's VmRSS over the run, a panel each on its own scale (an engine of 580 MB and a
    supervisor of 55 share no useful axis), each pid a colour of its own, the faults as dashed lines. Plain SVG, so
    the report needs no plotting library."""
    procs = sorted({s["process"] for s in samples if s["process"].startswith(("supervisor", "engine", "worker"))})
    if not procs:
        return
    end = max(float(s["s"]) for s in samples) or 1.0
    w, h, left, top = 900, 150, 70, 20
    colours = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
    x = lambda t: left + (w - left - 10) * t / end       # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{top + len(procs) * (h + 30) + 20}" '
             'font-family="sans-serif" font-size="11"><rect width="100%" height="100%" fill="white"/>']
    for i, proc in enumerate(procs):
        y0 = top + i * (h + 30)
        rows = [s for s in samples if s["process"] == proc]
        born = {}
        for s in rows:
            born.setdefault(s["pid"], float(s["s"]))
        # the scale leaves out each pid's first 30 s (a starting engine loads its model from 300 MB up): clipped
        scaled = [float(s["rss_mb"]) for s in rows if float(s["s"]) >= born[s["pid"]] + 30] or \
            [float(s["rss_mb"]) for s in rows]
        lo, hi = min(scaled), max(scaled)
        hi = max(hi, lo + 1.0)              # at least 1 MB of scale: a flat line stays flat
        y = lambda mb: y0 + h - h * (min(max(mb, lo), hi) - lo) / (hi - lo)      # noqa: E731
        parts.append(f'<rect x="{left}" y="{y0}" width="{w - left - 10}" height="{h}" fill="none" stroke="#999"/>'
                     f'<text x="{left + 4}" y="{y0 + 12}">{proc}: VmRSS MB</text>'
                     f'<text x="{left - 4}" y="{y0 + 10}" text-anchor="end">{hi:.1f}</text>'
                     f'<text x="{left - 4}" y="{y0 + h}" text-anchor="end">{lo:.1f}</text>')
        for f in faults:
            parts.append(f'<line x1="{x(f.start):.1f}" x2="{x(f.start):.1f}" y1="{y0}" y2="{y0 + h}" '
                         'stroke="#bbb" stroke-dasharray="4 3"/>')
        for n, pid in enumerate(dict.fromkeys(s["pid"] for s in rows)):
            pts = " ".join(f"{x(float(s['s'])):.1f},{y(float(s['rss_mb'])):.1f}" for s in rows if s["pid"] == pid)
            parts.append(f'<polyline points="{pts}" fill="none" stroke="{colours[n % len(colours)]}"/>')
    y_axis = top + len(procs) * (h + 30) - 12
    for m in range(0, int(end // 60) + 1, max(1, int(end // 600))):
        parts.append(f'<text x="{x(m * 60):.1f}" y="{y_axis}" text-anchor="middle">{m}</text>')
    parts.append(f'<text x="{w - 10}" y="{y_axis + 14}" text-anchor="end">minutes; dashed: the faults</text></svg>')
    path.write_text("\n".join(parts) + "\n")


def in_window(o: Outcome, f: FaultRecord) -> bool:
    return o.start <= f.end + 2 and o.end >= f.start - 0.5


def report(soak: Soak, out: Path) -> bool:
    samples = list(csv.DictReader(open(out / "samples.csv")))
    slopes = rss_slopes(samples, soak.args.warm_up_s)
    for f in soak.faults:
        owned = [o for o in soak.outcomes if in_window(o, f)]
        f.sessions_in_window, f.failed_sessions = len(owned), sum(1 for o in owned if not o.ok)
        if f.name in SESSIONLESS_FAULTS:    # failed sessions a process fault beside it owns too are that fault's
            f.failed_sessions = sum(1 for o in owned if not o.ok and not any(
                in_window(o, g) for g in soak.faults if g.name not in SESSIONLESS_FAULTS))
    outside = [o for o in soak.outcomes if not any(in_window(o, f) for f in soak.faults)]
    readers = ("slow reader", "cut reader")
    failed_outside = [o for o in outside if not o.ok and o.kind not in readers]
    cut = [o for o in soak.outcomes if o.kind == "cut reader"]
    for o in cut:       # the others running while it was cut off (those in a fault's window are the fault's)
        others = [x for x in outside if x.kind not in readers and x.start <= o.end and x.end >= o.start]
        o.others, o.others_failed = len(others), sum(1 for x in others if not x.ok)
    start_level = soak.storms[0]["before"] if soak.storms else {}
    end_level = soak.levels.get("end", {})
    no_code = [o for o in outside if o.closed_by_server and o.close_code is None]
    slow = [o for o in soak.outcomes if o.kind == "slow reader"]
    slow_silent = [o for o in slow if not o.ok]
    crash_lines = crashes(soak)
    checks = {      # key -> (what it checks, whether it held); checks.json has them (tests/system/test_soak.py)
        "rss_slope": (f"every process's RSS slope after warm-up < {soak.args.slope_limit_mb} MB / 10 min (each with "
                      "a pid living past its warm-up)",
                      bool(slopes) and all(v["slope"] < soak.args.slope_limit_mb for v in slopes.values()) and
            all(p in slopes for p in {s["process"] for s in samples} if p.startswith(("supervisor", "engine", "worker")))),
        "storms": ("descriptors and threads back to their level after every storm (at least one)",
                   bool(soak.storms) and all(s["back"] for s in soak.storms)),
        "faults_ready": ("every fault of the schedule ran and was ready again within its limit",
                         [f.name for f in soak.faults] == list(soak.args.faults) and
                         all(f.within_limit for f in soak.faults)),
        "voices": ("stored voices intact after every fault and at the end",
                   all(f.voices_intact for f in soak.faults) and not soak.final_voice_check),
        "sessions": ("no session failed outside a fault's window", not failed_outside),
        "close_codes": ("0 closes without a code outside process faults", not no_code),
        "slow_readers": ("every slow reader (at least one) kept (context.done) or cut off with slow_consumer, never "
                         "silent", bool(slow) and not slow_silent),
        "cut_readers": ("every cut reader (at least one) cut off with slow_consumer and its protocol's close, or "
                        "kept by the rule (at most --max-backlog-ms + 1 s + 0.5 s of its audio made by the time it "
                        "read again, measured before its marker's reply), never another error or a close without a "
                        "code, no other session failing while it was", bool(cut) and all(o.ok and not o.others_failed
                                                                                for o in cut)),
        "sessionless_faults": ("no session failed in the window of a fault that stops no process (disk full, voice "
                               "file truncated)", all(f.failed_sessions == 0 for f in soak.faults
                                                      if f.name in SESSIONLESS_FAULTS)),
        "disk_faults": ("every disk fault (full, read-only) answered an upload 500 voice_store_unavailable",
                        all(f.clear_error for f in soak.faults if f.name in DISK_FAULTS)),
        "levels_at_end": ("descriptors and threads at the end (at rest) back to their level at the first storm",
                          bool(start_level) and bool(end_level) and _at_level(start_level, end_level)),
        "crashes": ("0 crashes", not crash_lines),
    }
    passed = all(ok for _, ok in checks.values())
    (out / "checks.json").write_text(json.dumps({k: {"check": text, "ok": bool(ok)} for k, (text, ok) in
                                                checks.items()}, indent=1) + "\n")
    with open(out / "sessions.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kind", "start", "end", "ok", "close_code", "detail"])
        for o in soak.outcomes:
            w.writerow([o.kind, round(o.start, 2), round(o.end, 2), o.ok, o.close_code, o.detail])
    with open(out / "faults.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["fault", "start", "ready_s", "limit_s", "failed", "sessions_in_window", "voices_intact", "detail"])
        for r in soak.faults:
            w.writerow([r.name, round(r.start), round(r.ready_s, 2), RECOVERY_LIMIT_S[r.name], r.failed_sessions,
                        r.sessions_in_window, r.voices_intact, r.detail])
    kinds: dict[str, list[int]] = {}
    for o in soak.outcomes:
        kinds.setdefault(o.kind, [0, 0])[0 if o.ok else 1] += 1
    plot(samples, soak.faults, out / "rss.svg")
    a = soak.args
    lines = [f"# talkgate soak: {'PASSED' if passed else 'FAILED'}", "",
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {a.minutes} min, seed {a.seed}, load "
             f"{getattr(a, 'measured_rate', a.capacity):.2f} sessions/s; {len(soak.outcomes)} sessions, "
             f"{soak.uploads} voice uploads, {soak.deletions} deletions, {len(soak.storms)} storms of {STORM_SOCKETS} "
             "sockets", "", "## Checks", ""]
    lines += [f"- [{'x' if ok else ' '}] {name}" for name, ok in checks.values()]
    lines += ["", "## RSS slope per process (after its own first %d s)" % soak.args.warm_up_s, "",
              "| process | MB / 10 min | over s | samples | first MB | last MB | largest step MB |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {p} | {v['slope']:+.2f} | {v['span']:.0f} | {v['n']} | {v['first']:.2f} | {v['last']:.2f} | "
              f"{v['step']:.2f} |" for p, v in sorted(slopes.items())]
    lines += ["", "## Faults", "", "| s | fault | ready after s (limit) | failed / sessions in its window | voices intact | "
              "detail |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r.start:.0f} | {r.name} | {r.ready_s:.1f} ({RECOVERY_LIMIT_S[r.name]}) | {r.failed_sessions} / "
              f"{r.sessions_in_window} | {r.voices_intact} | {r.detail} |" for r in soak.faults]
    lines += ["", "## Sessions", "", "| kind | ok | failed |", "| --- | --- | --- |"]
    lines += [f"| {k} | {v[0]} | {v[1]} |" for k, v in sorted(kinds.items())]
    lines += ["", "## Slow and cut readers", ""] + [
        f"- {o.start:.0f}-{o.end:.0f} s, {o.kind}: {'ok' if o.ok else 'FAILED'}: {o.detail}" +
        (f"; {o.others_failed} of the {o.others} sessions running meanwhile failed" if o.kind == "cut reader" else "")
        for o in soak.outcomes if o.kind in readers]
    lines += ["", "## Descriptors and threads at rest", "",
              f"- at the first storm: {start_level}", f"- at the end: {end_level}"]
    lines += ["", "## Storms", ""] + [f"- {s['t']} s: back to level: {s['back']}; before {s['before']}; after "
                                      f"{s['after']}" for s in soak.storms]
    lines += ["", "## Findings", ""]
    lines += [f"- failed outside a fault: {o.kind} at {o.start:.0f} s: {o.detail}" for o in failed_outside[:30]]
    lines += [f"- closed without a code: {o.kind} at {o.start:.0f} s" for o in no_code[:30]]
    lines += [f"- slow reader at {o.start:.0f} s: {o.detail}" for o in slow_silent[:10]]
    lines += [f"- cut reader at {o.start:.0f} s: {o.detail}; {o.others_failed} of {o.others} others failed meanwhile"
              for o in cut if not o.ok or o.others_failed]
    lines += [f"- crash: {c[:300]}" for c in crash_lines[:30]]
    if soak.final_voice_check:
        lines.append(f"- voices at the end: {soak.final_voice_check}")
    lines += ["", "![RSS over time](rss.svg)"]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return passed


def _fault_list(text: str) -> tuple[str, ...]:
    names = () if text == "none" else tuple(n.strip() for n in text.split(","))
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown faults {unknown}; known: {', '.join(FAULTS)}")
    return names


def heap_prober(soak: Soak, stop: threading.Event) -> None:
    """SIGUSR2 to every server process at --warm-up-s (tracemalloc starts), then every --probe-s (a snapshot)."""
    if stop.wait(soak.args.warm_up_s):
        return
    while True:
        root = soak.server.proc.pid if soak.server is not None and soak.server.proc is not None else None
        for pid in ([root, *descendants(root)] if root else []):
            try:
                if b"talkgate" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGUSR2)
            except OSError:
                pass
        if stop.wait(soak.args.probe_s):
            return


def mount_store(path: Path, size_mb: int) -> None:
    """The voice store on a filesystem of its own, small enough to fill (needs root: mount)."""
    path.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", str(path)], check=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("soak-out"))
    ap.add_argument("--load", type=float, default=0.7, help="fraction of the measured capacity to drive")
    ap.add_argument("--capacity", type=float, default=0.0, help="sessions/s to drive, instead of measuring")
    ap.add_argument("--capacity-concurrency", type=int, default=8)
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--store-mb", type=int, default=8)
    ap.add_argument("--warm-up-s", type=float, default=300,
                    help="each process's RSS slope is fitted from this long after its start: the engine's glibc heap "
                         "takes its high-water steps in its first minutes of load (docs/reliability.md, the RSS slope)")
    ap.add_argument("--slope-limit-mb", type=float, default=1.0,
                    help="the largest RSS slope per 10 minutes that passes (issue 50: 1 MB over the hour)")
    ap.add_argument("--faults", type=_fault_list, default=FAULTS,
                    help="the faults to inject, comma-separated, in order (default: all of them; 'none': no fault)")
    ap.add_argument("--trace-heap", type=Path, default=None, metavar="DIR",
                    help="heap probes of every server process into DIR every --probe-s after --warm-up-s "
                         "(tests/heapprobe; python -m tests.heapprobe DIR diffs them). tracemalloc slows the workers: "
                         "under load some sessions fail worker_behind, so such a run is for the heap, not the verdict")
    ap.add_argument("--probe-s", type=float, default=120)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="talkgate-soak-") as tmp:
        tmp = Path(tmp)
        cert, key = self_signed(tmp)
        ckpt = create_checkpoint(tmp / "tiny-base", preset="tiny", variant="base", seed=0)
        soak = Soak(args, tmp, tmp / "store", cert, key, ckpt)
        mount_store(soak.store, args.store_mb)
        stop = threading.Event()
        sampling = threading.Thread(target=sampler, args=(soak, stop, args.out / "samples.csv"), daemon=True)
        probing = threading.Thread(target=heap_prober, args=(soak, stop), daemon=True)
        if args.trace_heap:
            args.trace_heap.mkdir(parents=True, exist_ok=True)
        try:
            soak.start_server()
            sampling.start()
            if args.trace_heap:
                probing.start()
            asyncio.run(drive(soak, args.capacity * args.load if args.capacity else 0.0))
        finally:
            stop.set()
            sampling.join(30)
            if soak.server is not None and soak.server.proc.poll() is None:
                soak.stop_server()
            subprocess.run(["umount", "-l", str(soak.store)], check=False)
        (args.out / "server.log").write_text("".join(soak.log_lines))
        passed = report(soak, args.out)
    print(f"soak: {'PASSED' if passed else 'FAILED'} (report: {args.out / 'report.md'})")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
