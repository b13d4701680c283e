"""Moves bytes between one WebSocket and one Sans-I/O protocol object. Nothing else lives here.

Shape (websockets style): a reader task feeds client frames to the protocol, a writer task drains
the bounded outbox into the socket; whichever ends first ends the connection. Engine events are
turned into actions on the pump thread (gateway/pump.py), so every call into the protocol object
holds this connection's lock. Actions reach `apply` in order per thread; a frame of a stream that was
purged (its context cancelled) is dropped whenever it arrives, so no stale audio follows a cancel.
"""
from __future__ import annotations

import asyncio
import logging
import threading

from aiohttp import WSMsgType, web

from talkgate.gateway.outbox import Outbox, OutboxFull
from talkgate.synth.api import EngineEvent

log = logging.getLogger("talkgate.connection")


class Connection:
    def __init__(self, ws: web.WebSocketResponse, protocol, max_outbox: int, idle_timeout_s: float):
        """`protocol` offers ready(), receive_text(), receive_binary(), engine_event(), note_sent(),
        connection_lost(), each returning actions (Send / Purge / Close) as in sessions.native."""
        self.ws, self.protocol = ws, protocol
        self.outbox = Outbox(max_outbox)
        # a protocol may have its own inactivity timeout (ElevenLabs' inactivity_timeout query parameter)
        self.idle_timeout_s = getattr(protocol, "idle_timeout_s", None) or idle_timeout_s
        self.lock = threading.Lock()
        self.purged: set[int] = set()
        self._closing: tuple[int, str] | None = None
        self._lost = False

    def call(self, method: str, *args):
        """Call the protocol object under the connection's lock (the pump thread calls it too)."""
        with self.lock:
            return getattr(self.protocol, method)(*args)

    def engine_event(self, ev: EngineEvent) -> list:
        """On the pump thread: the actions for one engine event ([] once the connection is over)."""
        with self.lock:
            if self._lost or self._closing is not None:
                return []
            try:
                return self.protocol.engine_event(ev)
            except Exception:      # a bug in one connection must not stop the pump
                log.exception("engine event handling failed")
                return []

    def apply(self, actions) -> None:
        for a in actions:
            kind = type(a).__name__
            if kind == "Send":
                if a.stream is not None and a.stream in self.purged:
                    continue
                try:
                    self.outbox.put(a)
                except OutboxFull:
                    self.close(1008, "slow consumer: the client is not reading")
                    return
            elif kind == "Purge":
                self.purged.add(a.stream)
                self.outbox.purge(a.stream)
            elif kind == "Close":
                self.close(a.code, a.reason)

    def close(self, code: int, reason: str) -> None:
        """Close after what is queued so far has been written."""
        if self._closing is None:
            self._closing = (code, reason)
            self.outbox.close()

    async def run(self, drain_timeout_s: float = 5.0) -> None:
        self.apply(self.call("ready"))
        reader = asyncio.create_task(self._read())
        writer = asyncio.create_task(self._write())
        try:
            await asyncio.wait([reader, writer], return_when=asyncio.FIRST_COMPLETED)
            if reader.done() and self._closing is not None:
                # we are closing (idle timeout, client `close`): write what is queued first
                await asyncio.wait([writer], timeout=drain_timeout_s)
        finally:
            for t in (reader, writer):
                t.cancel()
            await asyncio.gather(reader, writer, return_exceptions=True)
            with self.lock:
                self._lost = True
                self.protocol.connection_lost()
            if not self.ws.closed:
                code, reason = self._closing or (1000, "")
                await self.ws.close(code=code, message=reason.encode()[:120])

    async def _read(self) -> None:
        while self._closing is None:
            try:
                msg = await self.ws.receive(timeout=self.idle_timeout_s)
            except asyncio.TimeoutError:
                self.apply(self.call("idle_timeout"))   # closes unless contexts are in flight
                continue
            if msg.type == WSMsgType.TEXT:
                self.apply(self.call("receive_text", msg.data))
            elif msg.type == WSMsgType.BINARY:
                self.apply(self.call("receive_binary", msg.data))
            else:   # CLOSE, CLOSING, CLOSED, ERROR
                return

    async def _write(self) -> None:
        while (item := await self.outbox.get()) is not None:
            if isinstance(item.data, bytes):
                await self.ws.send_bytes(item.data)
            else:
                await self.ws.send_str(item.data)
            if item.stream is not None:
                self.call("note_sent", item.stream, item.audio_ms)
