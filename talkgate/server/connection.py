"""Moves bytes between a client (a WebSocket here, a streamed HTTP response in http_speech.py) and one
Sans-I/O protocol object (sessions/protocol.py), and holds it to its limits.

Shape (websockets style): a reader task feeds client frames to the protocol, a writer task drains
the bounded outbox into the socket, a watch task follows the clock; whichever of reader and writer
ends first ends the connection. Engine events arrive from server/engine_client.py, one at a time, on the
same event loop: one thread touches the protocol object and its session, no lock.

Every call into the protocol goes through `call`, the connection's error funnel: the wire actions it returns are
applied, then the engine commands its session made are submitted, those of one call together (also when the call
raised: a context that ended must be cancelled). An exception (a bug) is logged once, counted as internal_error
and answered with the protocol's own abort (its error event and close 1011); the connection ends and its contexts
with it. Every error the client is told about is counted in /metrics here, from the actions (Send.error,
Close.error).

Limits (docs/protocol.md): messages a second (bursts of BURST_S seconds' worth); the
outbox; idle: no client message, no audio made for the client and nothing taken by it (delivery.py:
socket buffer included) for the idle timeout closes the connection, contexts or not, so a client that
streams nothing and reads nothing cannot hold engine slots, while one receiving audio stays (and one
that stops reading it is a slow consumer first, session.py).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from aiohttp import WSMsgType, web

from talkgate.server.delivery import Delivery
from talkgate.server.engine_client import EngineClient
from talkgate.server.latency_trace import LinkTrace
from talkgate.server.outbox import Outbox, OutboxFull
from talkgate.server.usage import KeyAccount
from talkgate.server.websocket import close_flushed
from talkgate.sessions.actions import Close, Purge, Send
from talkgate.sessions.limits import Limits
from talkgate.sessions.protocol import ClientProtocol, SocketProtocol
from talkgate.synth.api import EngineEvent

log = logging.getLogger("talkgate.connection")
TICK_S = 0.25           # how often the watch task measures the client and asks the protocol's clock
SOCKET_AUDIO_MS = 1000  # audio in the socket not yet taken by the client, at most (delivery.py)
ROOM_POLL_S = 0.02      # how often a writer held by that looks again
DRAIN_S = 5.0           # a closing connection writes what is queued for at most this long
FRAMES_PER_WRITE = 16   # frames already queued that go out with one transport write (an 80-ms Opus frame is 4)
DISCONNECTED = (ConnectionError, asyncio.CancelledError)


BURST_S = 5.0           # a connection may send this many seconds' worth of its message rate at once


class RateLimit:
    """At most `rate` messages a second on average: a bucket of BURST_S seconds' worth of tokens, refilled
    continuously (an LLM's buffered tokens may arrive at once)."""

    def __init__(self, rate: float, now: float):
        self.rate, self.size, self.t = rate, rate * BURST_S, now
        self.tokens = self.size

    def take(self, now: float) -> bool:
        self.tokens = min(self.size, self.tokens + (now - self.t) * self.rate)
        self.t = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


def close_reason(reason: str) -> bytes:
    """A close frame's reason: at most 123 bytes of UTF-8, never a character cut in half."""
    data = reason.encode("utf-8", "replace")
    return data if len(data) <= 123 else data[:123].decode("utf-8", "ignore").encode()


class Link:
    """What a WebSocket connection and a streamed HTTP response share: the protocol object behind the
    error funnel, the outbox, what the client took, the clock (slow consumers, idle)."""

    def __init__(self, transport, protocol: ClientProtocol, engine: EngineClient, limits: Limits, label: str,
                 count_error: Callable[[str], None], trace: LinkTrace | None = None):
        """`count_error(code)` records an error the client was told about; `trace`: serve --trace-latency's."""
        self.protocol, self.engine, self.limits, self.label = protocol, engine, limits, label
        self.trace = trace
        self.count_error = count_error
        self.outbox = Outbox(limits.max_outbox_items, limits.max_outbox_bytes)
        self.delivery = Delivery(transport)
        # a protocol may have its own inactivity timeout (ElevenLabs' inactivity_timeout query parameter)
        self.idle_timeout_s = protocol.idle_timeout_s or limits.idle_timeout_s
        self.loop = asyncio.get_running_loop()
        self.last_activity = self.loop.time()
        self._closing: tuple[int, str] | None = None
        self._closing_since = 0.0
        self._lost = False
        self._due: asyncio.TimerHandle | None = None    # the protocol's next due_in(), when it has one
        self.account: KeyAccount | None = None     # the client key's limits and usage (Gateway.keep_account)

    # ----- the protocol, behind the error funnel -----
    def call(self, method: Callable, *args) -> None:
        """One call of a protocol method: its wire actions applied, its session's engine commands submitted; an
        exception becomes the protocol's abort (close 1011)."""
        if self._lost:
            return
        if self.trace is not None:
            self.trace.call_started()
        try:
            actions = method(*args)
        except Exception:
            log.exception("%s connection: %s failed", self.label, method.__name__)
            actions = self._abort("internal_error", "internal server error", 1011)
        if self.trace is not None:
            self.trace.call_returned()
        self.apply(actions or ())
        self.submit()
        if self.account is not None:
            self.account.settle()
        self._arm()

    def _arm(self) -> None:
        """One timer for the protocol's due_in() (a session's held first audio, 40 ms): armed, or moved earlier."""
        due = self.protocol.due_in()
        if due is None or self._lost:
            return
        when = self.loop.time() + due
        if self._due is not None:
            if self._due.when() <= when:
                return
            self._due.cancel()
        self._due = self.loop.call_at(when, self._on_due)

    def _on_due(self) -> None:
        self._due = None
        self.call(self.protocol.tick)

    def _abort(self, code: str, message: str, ws_code: int) -> list:
        try:
            return self.protocol.abort(code, message, ws_code)
        except Exception:
            log.exception("%s connection: abort failed", self.label)
            return [Close(1011, "internal error", error="internal_error")]

    def submit(self) -> None:
        """The engine commands the protocol's session made, in order (taken also after a call that raised)."""
        commands = self.protocol.engine_commands()
        if commands:
            if self.trace is None:
                self.engine.submit(self, commands)
            else:
                self.engine.submit(self, self.trace.traced(commands))
                self.trace.submitted(commands)

    def engine_event(self, ev: EngineEvent) -> None:
        """An event of one of this link's contexts (server/engine_client.py)."""
        if self.trace is None:
            self.call(self.protocol.engine_event, ev)
        elif not self.trace.engine_event(ev):
            self.call(self.protocol.engine_event, ev)
            self.trace.handled()

    def apply(self, actions) -> None:
        for a in actions:
            if isinstance(a, Send):
                if a.error is not None:
                    self.count_error(a.error)
                if a.stream is not None:        # audio made for the client: not idle
                    self.last_activity = self.loop.time()
                    if self.trace is not None:
                        self.trace.queued(a.stream, self.protocol.session.context_of)
                try:
                    self.outbox.put(a)
                    if a.stream is not None and self.account is not None and not self.outbox.closed:
                        self.account.queued(a.stream)
                except OutboxFull:      # the client is not reading: what is queued goes, the error goes out
                    self.dropped(self.outbox.clear())
                    self.call(self.protocol.abort, "slow_consumer", "the client is not reading: over "
                              f"{self.limits.max_outbox_items} messages or {self.limits.max_outbox_bytes >> 20} MiB "
                              "waiting", 1008)
            elif isinstance(a, Purge):
                self.dropped(self.outbox.purge(a.stream))
            elif isinstance(a, Close):
                if a.error is not None:
                    self.count_error(a.error)
                self.close(a.code, a.reason)
            else:
                self.other(a)

    def dropped(self, items: list) -> None:
        if self.account is not None:
            self.account.dropped(items)

    def metered(self, stream: int, audio_ms: float) -> None:
        """A frame of `stream`'s audio goes to the client's socket now, in this step: metered, and the usage record
        of a context it completes written before its bytes go, so that a client that sees its context end has its
        record in the log whatever kills the server then."""
        if self.account is not None:
            self.account.sent(stream, audio_ms)
            self.account.settle()

    def wrote_audio(self, stream: int, audio_ms: float) -> None:
        """A frame of `stream`'s audio was written to the client (metered just before): the protocol told."""
        if self.trace is not None:
            self.trace.written(stream)
        self.call(self.protocol.note_sent, stream, audio_ms)

    def end(self) -> None:
        """The link is over: its session's contexts end (their cancels submitted), nothing more reaches it; their
        usage is recorded with what was written."""
        self.call(self.protocol.connection_lost)
        self._lost = True
        if self._due is not None:
            self._due.cancel()
            self._due = None
        self.engine.forget(self)
        if self.account is not None:
            self.account.close()

    def other(self, action) -> None:
        raise TypeError(f"unknown action {action!r}")

    def close(self, code: int, reason: str) -> None:
        """Close after what is queued so far has been written (for at most DRAIN_S)."""
        if self._closing is None:
            self._closing = (code, reason)
            self._closing_since = self.loop.time()
            self.outbox.close()

    def take(self) -> None:
        """Tell the protocol what the client's TCP took since the last look (its slow-consumer clock)."""
        taken_before = self.delivery.taken_bytes
        for stream, audio_ms in self.delivery.taken():
            self.call(self.protocol.note_delivered, stream, audio_ms)
        if self.delivery.taken_bytes > taken_before:
            self.last_activity = self.loop.time()

    async def room(self) -> None:
        """Wait until the socket holds less than SOCKET_AUDIO_MS of audio the client has not taken, so that a
        frame about to be written is the client's next second, not one behind megabytes of kernel buffer."""
        while self.delivery.in_flight_ms >= SOCKET_AUDIO_MS:
            await asyncio.sleep(ROOM_POLL_S)
            self.take()

    async def next_frame(self):
        """The outbox's next frame once the socket has room for it (a frame waiting here can still be purged)."""
        await self.room()
        return await self.outbox.get()

    async def _watch(self) -> None:
        """Every TICK_S: what the client took, the protocol's clock (slow consumers), the idle rule;
        returns when the client went away or a close has been draining for DRAIN_S."""
        idle_said = False
        transport = self.delivery.transport
        while True:
            await asyncio.sleep(TICK_S)
            if transport is None or transport.is_closing():      # the client went away
                return
            if self._closing is not None:
                if self.loop.time() - self._closing_since > DRAIN_S:
                    return
                continue
            self.take()
            now = self.loop.time()
            self.call(self.protocol.tick)
            if not idle_said and now - self.last_activity > self.idle_timeout_s:
                idle_said = True
                self.call(self.protocol.idle_timeout)


class Connection(Link):
    """One WebSocket."""

    protocol: SocketProtocol

    def __init__(self, ws: web.WebSocketResponse, transport, protocol: SocketProtocol, engine: EngineClient,
                 limits: Limits, label: str, count_error: Callable[[str], None], trace: LinkTrace | None = None):
        super().__init__(transport, protocol, engine, limits, label, count_error, trace)
        self.ws = ws
        self.rate = RateLimit(limits.max_messages_per_s, self.last_activity)

    # ----- the tasks -----
    async def run(self) -> None:
        """Until the client or the server closes; then every context of the connection ends."""
        self.call(self.protocol.ready)
        reader = asyncio.create_task(self._read())
        writer = asyncio.create_task(self._write())
        watch = asyncio.create_task(self._watch())
        try:
            # closing (idle timeout, client `close`, an error): the writer writes what is queued first;
            # the watch task ends a close that takes over DRAIN_S (a client that does not read)
            await asyncio.wait([reader, writer, watch], return_when=asyncio.FIRST_COMPLETED)
            if reader.done() and self._closing is not None:
                await asyncio.wait([writer, watch], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (reader, writer, watch):
                t.cancel()
            await asyncio.gather(reader, writer, watch, return_exceptions=True)
            self.end()
            await self._close_socket()

    async def _close_socket(self) -> None:
        if self.ws.closed:
            return
        code, reason = self._closing or (1000, "")
        try:
            await asyncio.wait_for(self.ws.close(code=code, message=close_reason(reason)), DRAIN_S)
        except (asyncio.TimeoutError, *DISCONNECTED):
            # no answer to the close in DRAIN_S: a client that does not read (a slow consumer's close, written
            # behind its unread audio) may still read it within close_flushed's linger
            if self.delivery.transport is not None:
                close_flushed(self.delivery.transport)

    async def _read(self) -> None:
        while self._closing is None:
            msg = await self.ws.receive()
            if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):   # CLOSE, CLOSING, CLOSED, ERROR
                return
            self.last_activity = now = self.loop.time()
            if self.trace is not None:
                self.trace.read()
            if not self.rate.take(now):
                self.call(self.protocol.abort, "rate_limited", f"over {self.limits.max_messages_per_s:g} messages "
                          "a second", 1008)
            elif msg.type == WSMsgType.TEXT:
                self.call(self.protocol.receive_text, msg.data)
            else:
                self.call(self.protocol.receive_binary, msg.data)
            # aiohttp returns buffered messages without yielding: a client's burst (one TCP read holds
            # hundreds of small messages) is read in turns with the worker's other sockets
            await asyncio.sleep(0)

    async def _write(self) -> None:
        try:
            while (item := await self.next_frame()) is not None:
                batch = [item, *self.outbox.take_ready(FRAMES_PER_WRITE - 1)]
                if not self.ws.writable():
                    return              # closing: nothing more goes out (the reader sees it too)
                for i in batch:
                    if i.stream is not None:
                        self.metered(i.stream, i.audio_ms)
                sizes = self.ws.write_frames([i.data for i in batch])
                for i, size in zip(batch, sizes):
                    self.delivery.wrote(size, i.stream, i.audio_ms)
                    if i.stream is not None:
                        self.wrote_audio(i.stream, i.audio_ms)
        except ConnectionError:         # the client went away: the reader sees it too
            pass
