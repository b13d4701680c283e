"""The engine processes, seen from a gateway worker as one engine (synth.api.EngineInterface: connect / submit /
disconnect / stats / info / new_tokenizer, as synth.engine.Engine offers them in-process), over the messages of
ipc/wire.py.

    engines = RemoteEngines(["ipc:///tmp/tg/engine-0.ipc", ...], worker=3)
    engines.start()                         # on the worker's event loop
    await engines.wait_info()               # the first engine's WELCOME: ModelInfo, checkpoint (tokenizer)
    client = engines.connect(deliver)       # deliver(events) on the event loop, once per read of the engines
    engines.submit(client, [OpenContext(1, params), AppendText(1, ids, seconds), EndText(1)])

It serves one client, the worker's EngineClient (server/engine_client.py): the engines see one client per worker,
and the client's ids (contexts, voice requests: unique in the worker) are the ids on the wire, so events come back
as they went, their audio rows as views of the received buffer. Nothing is filtered here: events of a context
cancelled meanwhile go on to the client, which drops them.

Everything runs on the worker's event loop: each engine's socket (ipc/channel.py: a local socket, written and read
by this loop itself, no I/O thread between) is read by a loop reader, and the commands submitted during one loop
iteration go out as one COMMANDS message per engine, written at once (what the socket cannot take is written when
it can). submit may also be called from another thread: it only queues under a lock and wakes the loop.

Placement: a new context goes to the ready engine with the most free slots as last heard (each STEP and
STATS message carries the engine's free slots; opens sent since are counted off). That view may be stale
either way, so an engine that seems full is still asked: one that is full answers ContextFailed
(engine_full), and the context (its commands are kept until its first event) is sent to the next ready
engine not tried yet; when none is left the client gets that engine_full, the capacity error of a single
engine.

Faults: an engine process that dies closes its connection (the read finds its end): its contexts fail with
`engine_failed`, except those that have had no event yet, which move to another ready engine. The worker connects
again every RECONNECT_S (up to RECONNECT_MAX_S while nothing listens); the restarted successor is greeted (HELLO ->
WELCOME) and takes new contexts once it says "ready".
Backpressure: STEPs are read when the loop is free, while the EngineClient holds fewer than `max_behind` steps'
events not yet routed to every Link (`hold`): it hands a new context's first frames out before the older audio
it still holds, so the next STEPs are read while that waits. Those that queued meanwhile (up to
MAX_MESSAGES_PER_READ) are read together and handed over as one batch, so a loop that fell behind catches up in
one pass. Each is acknowledged when read; a loop that falls behind acknowledges late, and the engine, which never
waits, fails this worker's contexts once it is WORKER_LAG_LIMIT_S behind (ipc/engine_server.py).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field

from talkgate.ipc import channel, wire
from talkgate.synth.api import (
    AudioChunk, CancelContext, ContextFailed, Deliver, EngineCommand, MakeVoice, ModelInfo, OpenContext, VoiceFailed,
)

log = logging.getLogger("talkgate.remote_engines")
CLIENT = 1                  # the id of the one client
ACK_EVERY = 8               # STEP messages handled before an acknowledgement goes out ...
ACK_DELAY_S = 0.05          # ... or this long after the first unacknowledged one
MAX_MESSAGES_PER_READ = 8   # then other loop callbacks (client messages) run before the rest is read
# steps' events the EngineClient may hold not yet routed to every Link: no STEP is read then (at 256 rows, 20-ms
# steps: 160 ms of audio of the contexts past their first frames)
STEPS_HELD_BEFORE_READING = 8
RECONNECT_S = 0.1           # a connection lost or refused is tried again after this, ...
RECONNECT_MAX_S = 1.0       # ... doubling up to this while it is refused


@dataclass(eq=False)
class _Route:
    """One open context of the client, and the engine it runs on."""
    context: int
    engine: "_Engine"
    tried: set = field(default_factory=set)


@dataclass(eq=False)
class _Engine:
    """One engine process as this worker knows it."""
    index: int
    endpoint: str
    sock: socket.socket | None = None          # connected; None while it is not
    out: channel.Outgoing | None = None
    reader: channel.Reader | None = None
    retry: asyncio.TimerHandle | None = None   # the next connection attempt
    retry_s: float = RECONNECT_S
    state: str = "down"            # down | warming | ready | stopping
    incarnation: int | None = None
    stats: dict = field(default_factory=dict)
    free: int = 0                  # free slots as last heard
    opened: int = 0                # opens sent since
    routes: set = field(default_factory=set)       # its contexts
    outbox: list = field(default_factory=list)     # wire commands not sent yet
    acked: int = 0                 # last STEP seq handled
    ack_sent: int = 0
    ack_timer: asyncio.TimerHandle | None = None
    inbox: collections.deque = field(default_factory=collections.deque)     # whole messages read, not handled

    @property
    def room(self) -> int:
        return self.free - self.opened if self.state == "ready" else 0


class RemoteEngines:
    max_behind = STEPS_HELD_BEFORE_READING

    def __init__(self, endpoints: list[str], worker: int = 0):
        self.worker = worker
        self.engines = [_Engine(i, e) for i, e in enumerate(endpoints)]
        self.info: ModelInfo | None = None
        self.checkpoint: str | None = None
        self._tokenizer = None
        self._lock = threading.Lock()
        self._deliver: Deliver | None = None       # the one client's
        self._routes: dict[int, _Route] = {}       # context -> its route
        # the contexts that have had no event yet: their commands (wire form), re-sent to another engine on engine_full
        self._unplaced: dict[int, list] = {}
        self._voice_requests: dict[int, _Engine] = {}   # voice request -> the engine making it
        self._local: list = []                     # events made here (refusals, engine_failed), not delivered yet
        self._flush_pending = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = None
        self._closed = False
        self._info_ready: asyncio.Event | None = None
        # called on the loop whenever `ready` may have changed
        self.on_state = None
        # called on the loop with each STEP's age when its audio is handled (the engine's emit to here: the socket and
        # this loop's backlog); perf_counter is the host's monotonic clock, shared by the processes
        self.on_delivery = None
        # while it returns true no message is read: the loop still hands the last STEPs out (EngineClient.behind)
        self.hold = None

    # ----- lifecycle (on the loop) -----
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._info_ready = asyncio.Event()
        for engine in self.engines:
            self._connect(engine)

    async def wait_info(self) -> ModelInfo:
        await self._info_ready.wait()
        return self.info

    def close(self) -> None:
        self._closed = True
        for engine in self.engines:
            if engine.retry is not None:
                engine.retry.cancel()
                engine.retry = None
            self._hang_up(engine)

    @property
    def ready(self) -> bool:
        return any(engine.state == "ready" for engine in self.engines)

    def new_tokenizer(self):
        from talkgate.synth.tokenizer import QwenTokenizer, StreamingTokenizer
        if self._tokenizer is None:
            self._tokenizer = QwenTokenizer.from_dir(self.checkpoint)
        return StreamingTokenizer(self._tokenizer)

    def capacity(self) -> int:
        """Free slots over the ready engines, as last heard."""
        return sum(max(0, engine.room) for engine in self.engines)

    def stats(self) -> dict:
        engines = [{**engine.stats, "state": engine.state} for engine in self.engines]
        return {"engines": engines, "free_slots": self.capacity(),
                "slots": sum(e.get("slots", 0) for e in engines if e["state"] != "down"),
                "contexts": len(self._routes)}

    # ----- the client -----
    def connect(self, deliver: Deliver) -> int:
        with self._lock:
            if self._deliver is not None:
                raise RuntimeError("RemoteEngines serves one client, and it is connected")
            self._deliver = deliver
        return CLIENT

    def disconnect(self, client: int) -> None:
        with self._lock:
            self._deliver = None
            self._local.clear()
            self._voice_requests.clear()
            for r in list(self._routes.values()):
                r.engine.outbox.append([wire.CANCEL, r.context])
                self._forget(r)
        self._wake()

    def submit(self, client: int, commands: list[EngineCommand]) -> None:
        """Queue commands; they leave with this loop iteration's COMMANDS message. Never raises for a context:
        refusals come back as ContextFailed through deliver."""
        with self._lock:
            if self._deliver is None:
                return
            for cmd in commands:
                if isinstance(cmd, OpenContext):
                    self._open(cmd)
                    continue
                if isinstance(cmd, MakeVoice):
                    self._make_voice(cmd)
                    continue
                r = self._routes.get(cmd.context)
                if r is None:
                    continue
                w = wire.command_to_wire(cmd)
                if (sent := self._unplaced.get(cmd.context)) is not None:
                    sent.append(w)
                r.engine.outbox.append(w)
                if isinstance(cmd, CancelContext):
                    self._forget(r)
        self._wake()

    def send_now(self) -> None:
        """On the loop: what was submitted leaves now instead of at the end of the loop's turn (an HTTP request's
        open goes ahead of its text: server/http_speech.py)."""
        if self._flush_pending:
            self._flush()

    def _open(self, cmd: OpenContext) -> None:
        if cmd.context in self._routes:
            return self._refuse(cmd.context, "invalid_params", f"context {cmd.context} is already open")
        command = wire.command_to_wire(cmd)
        if not wire.encodable(command):
            return self._refuse(cmd.context, "invalid_params", "a number in the context parameters does not fit in "
                                "64 bits")
        engine = self._place(())
        if engine is None:
            return self._refuse(cmd.context, "engine_full", self._full_message())
        self._routes[cmd.context] = _Route(cmd.context, engine, {engine.index})
        self._unplaced[cmd.context] = [command]
        engine.routes.add(cmd.context)
        engine.outbox.append(command)
        engine.opened += 1

    def _make_voice(self, cmd: MakeVoice) -> None:
        """A voice is the same made on any engine: the ready one with the most room makes it."""
        engine = self._place(())
        if engine is None:
            self._local.append(VoiceFailed(cmd.request, "engine_full", self._full_message()))
            return
        self._voice_requests[cmd.request] = engine
        engine.outbox.append(wire.command_to_wire(cmd))

    def _place(self, tried) -> _Engine | None:
        """The ready engine not tried yet with the most free slots as last heard. One that seems full is still
        asked (the view may be stale either way): it refuses with engine_full if it is."""
        ready = [engine for engine in self.engines if engine.index not in tried and engine.state == "ready"]
        return max(ready, key=lambda e: e.room, default=None)

    def _full_message(self) -> str:
        if not self.ready:
            return "no engine is ready (starting or restarting): try again shortly"
        return f"all context slots of the {len(self.engines)} engine(s) are in use"

    def _refuse(self, context: int, code: str, message: str) -> None:
        self._local.append(ContextFailed(context, code, message))

    def _forget(self, r: _Route) -> None:
        self._routes.pop(r.context, None)
        self._unplaced.pop(r.context, None)
        r.engine.routes.discard(r.context)

    def _move(self, r: _Route, engine: _Engine) -> None:
        """A context that has had no event yet goes to another engine with everything it was sent."""
        r.engine.routes.discard(r.context)
        r.engine, r.tried = engine, r.tried | {engine.index}
        engine.routes.add(r.context)
        engine.outbox.extend(self._unplaced[r.context])
        engine.opened += 1

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
            out = [(engine, engine.outbox) for engine in self.engines if engine.outbox]
            for engine, _ in out:
                engine.outbox = []
            local, self._local = self._local, []
        for engine, commands in out:
            self._send(engine, wire.commands_message(engine.acked, commands))
            engine.ack_sent = engine.acked
        self._hand_over(local)

    def _send(self, engine: _Engine, frames: list) -> None:
        if engine.out is None:              # not connected: the engine is down, its contexts moved or failed
            return
        if not engine.out.send(frames):
            self._lost(engine, engine.out.broken)
        elif engine.out.pending:            # the rest when the socket takes it
            self._loop.add_writer(engine.sock, self._writable, engine)

    def _writable(self, engine: _Engine) -> None:
        if engine.out is None:
            return
        if engine.out.flush():
            self._loop.remove_writer(engine.sock)
            if engine.out.broken is not None:
                self._lost(engine, engine.out.broken)

    def _ack(self, engine: _Engine) -> None:
        engine.ack_timer = None
        if engine.acked > engine.ack_sent and engine.sock is not None:
            engine.ack_sent = engine.acked
            self._send(engine, wire.ack_message(engine.acked))

    # ----- the connection (on the loop) -----
    def _connect(self, engine: _Engine) -> None:
        engine.retry = None
        if self._closed:
            return
        try:
            sock = channel.connect(engine.endpoint)
        except OSError as e:
            log.warning("engine %d: cannot connect to %s (%s)", engine.index, engine.endpoint, e)
            sock = None
        if sock is None:                    # nothing listens there yet (starting, restarting)
            engine.retry = self._loop.call_later(engine.retry_s, self._connect, engine)
            engine.retry_s = min(2 * engine.retry_s, RECONNECT_MAX_S)
            return
        engine.retry_s = RECONNECT_S
        engine.sock, engine.out, engine.reader = sock, channel.Outgoing(sock), channel.Reader()
        self._loop.add_reader(sock, self._readable, engine)
        self._send(engine, wire.hello_message(self.worker, os.getpid()))

    def _hang_up(self, engine: _Engine) -> None:
        if engine.sock is None:
            return
        self._loop.remove_reader(engine.sock)
        self._loop.remove_writer(engine.sock)
        engine.out.close()
        engine.sock.close()
        engine.sock = engine.out = engine.reader = None
        engine.inbox.clear()

    def _lost(self, engine: _Engine, why: str | None) -> None:
        """The connection to the engine ended: the engine is down, and it is connected to again shortly."""
        if engine.sock is None:
            return
        self._hang_up(engine)
        self._engine_down(engine, f"its connection closed: {why}" if why else "its connection closed")
        if not self._closed:
            engine.retry = self._loop.call_later(RECONNECT_S, self._connect, engine)

    # ----- receiving (on the loop) -----
    def _readable(self, engine: _Engine) -> None:
        if engine.sock is None:
            return
        events: list = []       # the STEPs read now, handed over as one (a loop that fell behind catches up)
        try:
            for _ in range(MAX_MESSAGES_PER_READ):
                if self.hold is not None and self.hold():
                    break
                message = self._next_message(engine)
                if message is None:
                    return
                try:
                    self._handle(engine, message, events)
                except Exception:
                    log.exception("bad message from engine %d", engine.index)
                if engine.sock is None:         # a message that closed the connection
                    return
        except (channel.Closed, channel.ProtocolError) as e:
            self._hand_over(events)
            events = []
            self._lost(engine, str(e))
            return
        finally:
            self._hand_over(events)
        self._loop.call_soon(self._readable, engine)

    def _next_message(self, engine: _Engine) -> list | None:
        """The engine's next whole message: read from the socket when none is waiting; None when none has come."""
        while not engine.inbox:
            engine.inbox.extend(engine.reader.messages())
            if engine.inbox or not channel.receive(engine.sock, engine.reader):
                break
        return engine.inbox.popleft() if engine.inbox else None

    def _handle(self, engine: _Engine, frames: list, events: list) -> None:
        """One message; a STEP's events are added to `events`, handed over by the caller."""
        kind = bytes(frames[0])
        if kind == wire.STEP:
            self._step(engine, frames[1], frames[2], events)
            return
        self._hand_over(events[:])      # the steps before it first: a WELCOME may fail their contexts
        events.clear()
        if kind == wire.STATS:
            self._stats(engine, wire.decode(frames[1]))
        elif kind == wire.WELCOME:
            self._welcome(engine, wire.decode(frames[1]))

    def _step(self, engine: _Engine, header, pcm, events: list) -> None:
        """One STEP's events onto `events`, in order."""
        seq, t, step_s, free, contexts, frames, rows, ends, voices = wire.read_step(header, pcm)
        engine.free, engine.opened = free, 0
        if self.on_delivery is not None and len(contexts):
            self.on_delivery(time.perf_counter() - t)
        contexts = contexts.tolist()
        events += [AudioChunk(context, rows[i], int(frames[i]), 1, t, step_s) for i, context in enumerate(contexts)]
        with self._lock:
            for context in self._unplaced.keys() & contexts:    # a first event: placed for good
                del self._unplaced[context]
            for end in ends:
                r = self._routes.get(end[0])
                if r is not None and end[1] in (wire.SPOKEN, wire.STAGES):     # not an end: the context goes on
                    self._unplaced.pop(r.context, None)
                elif r is not None:
                    if end[1] == wire.FAILED and end[2] == "engine_full" and r.context in self._unplaced:
                        other = self._place(r.tried)
                        if other is not None:
                            self._move(r, other)
                            continue
                    self._forget(r)
                events.append(wire.end_event(end))
            for answer in voices:
                self._voice_requests.pop(answer[0], None)
                events.append(wire.voice_event(answer))
        engine.acked = seq
        if engine.acked - engine.ack_sent >= ACK_EVERY:
            self._ack(engine)
        elif engine.ack_timer is None:
            engine.ack_timer = self._loop.call_later(ACK_DELAY_S, self._ack, engine)
        if any(e.outbox for e in self.engines):
            self._wake()

    def _stats(self, engine: _Engine, stats: dict) -> None:
        engine.stats = stats
        engine.free, engine.opened = stats["free_slots"], 0
        self._set_state(engine, stats["state"])

    def _welcome(self, engine: _Engine, w: dict) -> None:
        if engine.incarnation is not None and w["incarnation"] != engine.incarnation and engine.routes:
            self._engine_down(engine, "it was restarted")
        engine.incarnation = w["incarnation"]
        engine.acked = engine.ack_sent = 0                  # the engine counts this connection's STEPs from 1
        if self.info is None:
            self.info, self.checkpoint = wire.info_from_wire(w["info"]), w["checkpoint"]
            self._info_ready.set()
        log.info("engine %d (pid %d) greeted worker %d: %s", engine.index, w["incarnation"], self.worker,
                 w["stats"]["state"])
        self._stats(engine, w["stats"])

    def _set_state(self, engine: _Engine, state: str) -> None:
        if state != engine.state:
            engine.state = state
            if self.on_state is not None:
                self.on_state()

    def _engine_down(self, engine: _Engine, why: str) -> None:
        """The engine process is gone: its contexts move (no event yet) or fail with engine_failed."""
        if engine.state != "down" or engine.routes:
            log.warning("engine %d is down (%s): %d contexts of worker %d on it", engine.index, why, len(engine.routes),
                        self.worker)
        events: list = []
        with self._lock:
            engine.outbox = []
            engine.state, engine.free, engine.opened = "down", 0, 0
            for request, on in list(self._voice_requests.items()):
                if on is engine:
                    del self._voice_requests[request]
                    events.append(VoiceFailed(request, "engine_failed",
                                              f"the engine process making this voice stopped ({why})"))
            for context in list(engine.routes):
                r = self._routes[context]
                other = self._place(r.tried) if context in self._unplaced else None
                if other is not None:
                    self._move(r, other)
                    continue
                self._forget(r)
                events.append(ContextFailed(context, "engine_failed",
                                            f"the engine process serving this context stopped ({why})"))
        if self.on_state is not None:
            self.on_state()
        self._wake()
        self._hand_over(events)

    def _hand_over(self, events: list) -> None:
        if not events or self._deliver is None:
            return
        try:
            self._deliver(events)
        except Exception:
            log.exception("delivering to the client failed: disconnecting it")
            self.disconnect(CLIENT)
