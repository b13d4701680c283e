"""The engine processes, seen from a gateway worker as one engine: connect / submit / disconnect / stats / info
/ new_tokenizer, as synth.engine.Engine offers them in-process, over the messages of ipc/wire.py.

    engines = RemoteEngines(["ipc:///tmp/tg/engine-0.ipc", ...], worker=3)
    engines.start()                         # on the worker's event loop
    await engines.wait_info()               # the first engine's WELCOME: ModelInfo, checkpoint (tokenizer)
    client = engines.connect(deliver)       # deliver(events) on the event loop, once per engine step
    engines.submit(client, [OpenContext(1, params), AppendText(1, ids, seconds), EndText(1)])

Everything runs on the worker's event loop: each engine's DEALER socket is read by a loop reader, and the
commands submitted during one loop iteration go out as one COMMANDS message per engine. submit may also be
called from another thread: it only queues under a lock and wakes the loop.
A client's context id is mapped to a wire id unique in this worker, so the engine sees one client per
worker; events come back as the client's ids, their audio rows as views of the received buffer.

Placement: a new context goes to the ready engine with the most free slots as last heard (each STEP and
STATS message carries the engine's free slots; opens sent since are counted off). That view may be stale
either way, so an engine that seems full is still asked: one that is full answers ContextFailed
(engine_full), and the context (its commands are kept until its first event) is sent to the next ready
engine not tried yet; when none is left the client gets that engine_full, the capacity error of a single
engine.

Faults: an engine process that dies closes its connection (a ZMQ monitor event): its contexts fail with
`engine_failed`, except those that have had no event yet, which move to another ready engine. Its
restarted successor is greeted again (HELLO -> WELCOME) and takes new contexts once it says "ready".
Backpressure: STEPs are read when the loop is free, while the EngineClient holds fewer than `max_behind` steps'
events not yet routed to every Link (`hold`): it hands a new context's first frames out before the older audio
it still holds, so the next STEPs are read while that waits. Those that queued meanwhile (up to
MAX_MESSAGES_PER_READ) are read together and handed over as one batch, so a loop that fell behind catches up in
one pass. Each is acknowledged when read; a loop that falls behind acknowledges late, and the engine, which never
waits, fails this worker's contexts once it is WORKER_LAG_LIMIT_S behind (engine_process.py).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass, field

import zmq
from zmq.utils.monitor import parse_monitor_message

from talkgate.ipc import wire
from talkgate.synth.api import (
    AudioChunk, CancelContext, ContextFailed, Deliver, EngineCommand, MakeVoice, ModelInfo, OpenContext, VoiceFailed,
)

log = logging.getLogger("talkgate.remote_engines")
ACK_EVERY = 8               # STEP messages handled before an acknowledgement goes out ...
ACK_DELAY_S = 0.05          # ... or this long after the first unacknowledged one
MAX_MESSAGES_PER_READ = 8   # then other loop callbacks (client messages) run before the rest is read
MAX_BEHIND = 8              # steps' events the EngineClient may hold not yet routed to every Link: no STEP is read
                            # then (at 256 rows, 20-ms steps: 160 ms of audio of the contexts past their first frames)


@dataclass(eq=False)
class _Route:
    """One open context of a local client, and where it runs."""
    client: int
    context: int                   # the client's id
    wire: int                      # this worker's id for it on the wire
    link: "_Link"
    replay: list | None            # its commands (wire form) until its first event: re-sent on engine_full
    tried: set = field(default_factory=set)


@dataclass(eq=False)
class _Client:
    deliver: Deliver
    routes: dict = field(default_factory=dict)     # client's context id -> _Route


@dataclass(eq=False)
class _Link:
    """One engine process as this worker knows it."""
    index: int
    endpoint: str
    sock: zmq.Socket | None = None
    monitor: zmq.Socket | None = None
    state: str = "down"            # down | warming | ready | stopping
    incarnation: int | None = None
    stats: dict = field(default_factory=dict)
    free: int = 0                  # free slots as last heard
    opened: int = 0                # opens sent since
    routes: set = field(default_factory=set)       # wire ids
    outbox: list = field(default_factory=list)     # wire commands not sent yet
    acked: int = 0                 # last STEP seq handled
    ack_sent: int = 0
    ack_timer: asyncio.TimerHandle | None = None

    @property
    def room(self) -> int:
        return self.free - self.opened if self.state == "ready" else 0


class RemoteEngines:
    max_behind = MAX_BEHIND

    def __init__(self, endpoints: list[str], worker: int = 0):
        self.worker = worker
        self.links = [_Link(i, e) for i, e in enumerate(endpoints)]
        self.info: ModelInfo | None = None
        self.checkpoint: str | None = None
        self._tokenizer = None
        self._lock = threading.Lock()
        self._clients: dict[int, _Client] = {}
        self._client_ids = itertools.count(1)
        self._routes: dict[int, _Route] = {}
        self._wire_ids = itertools.count(1)
        self._voice_requests: dict[int, tuple[int, int, _Link]] = {}   # wire id -> (client, its request id, engine)
        self._local: dict[int, list] = {}          # events made here (refusals, engine_failed), not delivered yet
        self._flush_pending = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = None
        self._zctx: zmq.Context | None = None
        self._info_ready: asyncio.Event | None = None
        # called on the loop whenever `ready` may have changed
        self.on_state = None
        # called on the loop with each STEP's age when its audio is handled (the engine's emit to here: ZMQ and
        # this loop's backlog); perf_counter is the host's monotonic clock, shared by the processes
        self.on_delivery = None
        # while it returns true no message is read: the loop still hands the last STEPs out (EngineClient.behind)
        self.hold = None

    # ----- lifecycle (on the loop) -----
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._info_ready = asyncio.Event()
        self._zctx = zmq.Context(io_threads=1)
        for link in self.links:
            s = link.sock = self._zctx.socket(zmq.DEALER)
            s.setsockopt(zmq.IDENTITY, f"w{self.worker}".encode())
            s.setsockopt(zmq.IMMEDIATE, 1)          # no queue for an engine that is not connected
            s.setsockopt(zmq.SNDHWM, 0)
            s.setsockopt(zmq.RCVHWM, 0)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RECONNECT_IVL, 100)
            s.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
            link.monitor = s.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
            s.connect(link.endpoint)
            self._loop.add_reader(s.FD, self._readable, link)
            self._loop.add_reader(link.monitor.FD, self._monitor_readable, link)
            self._loop.call_soon(self._monitor_readable, link)

    async def wait_info(self) -> ModelInfo:
        await self._info_ready.wait()
        return self.info

    def close(self) -> None:
        for link in self.links:
            if link.sock is not None:
                self._loop.remove_reader(link.sock.FD)
                self._loop.remove_reader(link.monitor.FD)
                link.sock.disable_monitor()
                link.monitor.close(linger=0)
                link.sock.close(linger=0)
                link.sock = None
        if self._zctx is not None:
            self._zctx.term()
            self._zctx = None

    @property
    def ready(self) -> bool:
        return any(link.state == "ready" for link in self.links)

    def new_tokenizer(self):
        from talkgate.synth.tokenizer import QwenTokenizer, StreamingTokenizer
        if self._tokenizer is None:
            self._tokenizer = QwenTokenizer.from_dir(self.checkpoint)
        return StreamingTokenizer(self._tokenizer)

    def capacity(self) -> int:
        """Free slots over the ready engines, as last heard."""
        return sum(max(0, link.room) for link in self.links)

    def stats(self) -> dict:
        engines = [{**link.stats, "state": link.state} for link in self.links]
        return {"engines": engines, "free_slots": self.capacity(),
                "slots": sum(e.get("slots", 0) for e in engines if e["state"] != "down"),
                "contexts": len(self._routes)}

    # ----- clients -----
    def connect(self, deliver: Deliver) -> int:
        with self._lock:
            client = next(self._client_ids)
            self._clients[client] = _Client(deliver)
        return client

    def disconnect(self, client: int) -> None:
        with self._lock:
            c = self._clients.pop(client, None)
            self._local.pop(client, None)
            for w in [w for w, (k, _, _) in self._voice_requests.items() if k == client]:
                del self._voice_requests[w]
            for r in list(c.routes.values()) if c is not None else ():
                r.link.outbox.append([wire.CANCEL, r.wire])
                self._forget(r)
        self._wake()

    def submit(self, client: int, commands: list[EngineCommand]) -> None:
        """Queue commands; they leave with this loop iteration's COMMANDS message. Never raises for a context:
        refusals come back as ContextFailed through deliver."""
        with self._lock:
            c = self._clients.get(client)
            if c is None:
                return
            for cmd in commands:
                if isinstance(cmd, OpenContext):
                    self._open(client, c, cmd)
                    continue
                if isinstance(cmd, MakeVoice):
                    self._make_voice(client, cmd)
                    continue
                r = c.routes.get(cmd.context)
                if r is None:
                    continue
                w = wire.command_to_wire(cmd, r.wire)
                if r.replay is not None:
                    r.replay.append(w)
                r.link.outbox.append(w)
                if isinstance(cmd, CancelContext):
                    self._forget(r)
        self._wake()

    def _open(self, client: int, c: _Client, cmd: OpenContext) -> None:
        if cmd.context in c.routes:
            return self._refuse(client, cmd.context, "invalid_params", f"context {cmd.context} is already open")
        w = next(self._wire_ids)
        command = [wire.OPEN, w, wire.params_to_wire(cmd.params)]
        if not wire.encodable(command):
            return self._refuse(client, cmd.context, "invalid_params", "a number in the context parameters does "
                                "not fit in 64 bits")
        link = self._place(())
        if link is None:
            return self._refuse(client, cmd.context, "engine_full", self._full_message())
        r = _Route(client, cmd.context, w, link, [command], {link.index})
        c.routes[cmd.context] = self._routes[w] = r
        link.routes.add(w)
        link.outbox.append(command)
        link.opened += 1

    def _make_voice(self, client: int, cmd: MakeVoice) -> None:
        """A voice is the same made on any engine: the ready one with the most room makes it."""
        link = self._place(())
        if link is None:
            self._local.setdefault(client, []).append(VoiceFailed(cmd.request, "engine_full", self._full_message()))
            return
        w = next(self._wire_ids)
        self._voice_requests[w] = (client, cmd.request, link)
        link.outbox.append(wire.voice_command(w, cmd))

    def _place(self, tried) -> _Link | None:
        """The ready engine not tried yet with the most free slots as last heard. One that seems full is still
        asked (the view may be stale either way): it refuses with engine_full if it is."""
        ready = [link for link in self.links if link.index not in tried and link.state == "ready"]
        return max(ready, key=lambda l: l.room, default=None)

    def _full_message(self) -> str:
        if not self.ready:
            return "no engine is ready (starting or restarting): try again shortly"
        return f"all context slots of the {len(self.links)} engine(s) are in use"

    def _refuse(self, client: int, context: int, code: str, message: str) -> None:
        self._local.setdefault(client, []).append(ContextFailed(context, code, message))

    def _forget(self, r: _Route) -> None:
        self._routes.pop(r.wire, None)
        r.link.routes.discard(r.wire)
        c = self._clients.get(r.client)
        if c is not None and c.routes.get(r.context) is r:
            del c.routes[r.context]

    def _move(self, r: _Route, link: _Link) -> None:
        """A context that has had no event yet goes to another engine with everything it was sent."""
        r.link.routes.discard(r.wire)
        r.link, r.tried = link, r.tried | {link.index}
        link.routes.add(r.wire)
        link.outbox.extend(r.replay)
        link.opened += 1

    # ----- sending -----
    def _wake(self) -> None:
        if self._flush_pending or self._loop is None:
            return
        self._flush_pending = True
        if threading.get_ident() == self._loop_thread:
            self._loop.call_soon(self._flush)
        else:
            self._loop.call_soon_threadsafe(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        with self._lock:
            out = [(link, link.outbox) for link in self.links if link.outbox]
            for link, _ in out:
                link.outbox = []
            local, self._local = self._local, {}
        for link, commands in out:
            self._send(link, wire.commands_message(link.acked, commands))
            link.ack_sent = link.acked
        self._deliver_batches(local)

    def _send(self, link: _Link, frames: list) -> None:
        try:
            link.sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:                   # not connected (IMMEDIATE): the engine is gone
            self._engine_down(link, "its connection is closed")
        self._loop.call_soon(self._readable, link)    # a send can consume the socket's read edge

    def _ack(self, link: _Link) -> None:
        link.ack_timer = None
        if link.acked > link.ack_sent and link.sock is not None:
            link.ack_sent = link.acked
            self._send(link, wire.ack_message(link.acked))

    # ----- receiving (on the loop) -----
    def _readable(self, link: _Link) -> None:
        if link.sock is None:
            return
        batches: dict[int, list] = {}   # the STEPs read now, handed over as one (a loop that fell behind catches up)
        try:
            for _ in range(MAX_MESSAGES_PER_READ):
                if self.hold is not None and self.hold():
                    break
                try:
                    frames = link.sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    return
                try:
                    self._handle(link, frames, batches)
                except Exception:
                    log.exception("bad message from engine %d", link.index)
        finally:
            self._deliver_batches(batches)
        self._loop.call_soon(self._readable, link)

    def _handle(self, link: _Link, frames: list, batches: dict[int, list]) -> None:
        """One message; a STEP's events are added to `batches`, handed over by the caller."""
        kind = frames[0].bytes
        if kind == wire.STEP:
            self._step(link, frames[1].buffer, frames[2].buffer, batches)
            return
        self._deliver_batches(batches)      # the steps before it first: a WELCOME may fail their contexts
        batches.clear()
        if kind == wire.STATS:
            self._stats(link, wire.decode(frames[1].buffer))
        elif kind == wire.WELCOME:
            self._welcome(link, wire.decode(frames[1].buffer))

    def _step(self, link: _Link, header, pcm, batches: dict[int, list]) -> None:
        """One STEP's events into `batches` (client -> its events in order)."""
        seq, t, free, contexts, frames, rows, ends, voices = wire.read_step(header, pcm)
        link.free, link.opened = free, 0
        if self.on_delivery is not None and len(contexts):
            self.on_delivery(time.perf_counter() - t)
        with self._lock:
            for i, w in enumerate(contexts.tolist()):
                r = self._routes.get(w)
                if r is None:
                    continue                                    # cancelled meanwhile: stale
                r.replay = None
                batches.setdefault(r.client, []).append(AudioChunk(r.context, rows[i], int(frames[i]), 1, t))
            for end in ends:
                r = self._routes.get(end[0])
                if r is None:
                    continue
                if end[1] == wire.SPOKEN:                      # a flush's end: the context goes on
                    r.replay = None
                    batches.setdefault(r.client, []).append(wire.end_event(r.context, end))
                    continue
                if end[1] == wire.FAILED and end[2] == "engine_full" and r.replay is not None:
                    other = self._place(r.tried)
                    if other is not None:
                        self._move(r, other)
                        continue
                self._forget(r)
                batches.setdefault(r.client, []).append(wire.end_event(r.context, end))
            for answer in voices:
                asked = self._voice_requests.pop(answer[0], None)
                if asked is not None:
                    batches.setdefault(asked[0], []).append(wire.voice_event(asked[1], answer))
        link.acked = seq
        if link.acked - link.ack_sent >= ACK_EVERY:
            self._ack(link)
        elif link.ack_timer is None:
            link.ack_timer = self._loop.call_later(ACK_DELAY_S, self._ack, link)
        if any(l.outbox for l in self.links):
            self._wake()

    def _stats(self, link: _Link, stats: dict) -> None:
        link.stats = stats
        link.free, link.opened = stats["free_slots"], 0
        self._set_state(link, stats["state"])

    def _welcome(self, link: _Link, w: dict) -> None:
        if link.incarnation is not None and w["incarnation"] != link.incarnation and link.routes:
            self._engine_down(link, "it was restarted")
        link.incarnation = w["incarnation"]
        link.acked = link.ack_sent = 0                  # the engine counts this connection's STEPs from 1
        if self.info is None:
            self.info, self.checkpoint = wire.info_from_wire(w["info"]), w["checkpoint"]
            self._info_ready.set()
        log.info("engine %d (pid %d) greeted worker %d: %s", link.index, w["incarnation"], self.worker,
                 w["stats"]["state"])
        self._stats(link, w["stats"])

    def _set_state(self, link: _Link, state: str) -> None:
        if state != link.state:
            link.state = state
            if self.on_state is not None:
                self.on_state()

    def _monitor_readable(self, link: _Link) -> None:
        while link.monitor is not None:
            try:
                event = parse_monitor_message(link.monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:      # connected and able to send
                self._send(link, wire.hello_message(self.worker, os.getpid()))
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self._engine_down(link, "its connection closed")

    def _engine_down(self, link: _Link, why: str) -> None:
        """The engine process is gone: its contexts move (no event yet) or fail with engine_failed."""
        if link.state != "down" or link.routes:
            log.warning("engine %d is down (%s): %d contexts of worker %d on it", link.index, why, len(link.routes),
                        self.worker)
        batches: dict[int, list] = {}
        with self._lock:
            link.outbox = []
            link.state, link.free, link.opened = "down", 0, 0
            for w, (client, request, on) in list(self._voice_requests.items()):
                if on is link:
                    del self._voice_requests[w]
                    batches.setdefault(client, []).append(VoiceFailed(
                        request, "engine_failed", f"the engine process making this voice stopped ({why})"))
            for w in list(link.routes):
                r = self._routes[w]
                other = self._place(r.tried) if r.replay is not None else None
                if other is not None:
                    self._move(r, other)
                    continue
                self._forget(r)
                batches.setdefault(r.client, []).append(ContextFailed(
                    r.context, "engine_failed", f"the engine process serving this context stopped ({why})"))
        if self.on_state is not None:
            self.on_state()
        self._wake()
        self._deliver_batches(batches)

    def _deliver_batches(self, batches: dict[int, list]) -> None:
        for client, events in batches.items():
            c = self._clients.get(client)
            if c is None:
                continue
            try:
                c.deliver(events)
            except Exception:
                log.exception("delivering to client %d failed: disconnecting it", client)
                self.disconnect(client)
