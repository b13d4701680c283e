"""Moves bytes between one WebSocket and one Sans-I/O protocol object. Nothing else lives here.

Shape (websockets style): a reader task feeds client frames to the protocol, a writer task drains
the bounded outbox into the socket; whichever ends first ends the connection. Engine events arrive
on the engine thread and are handed to the event loop with call_soon_threadsafe.
"""
from __future__ import annotations

import asyncio
import logging

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
        self.loop = asyncio.get_running_loop()
        self._closing: tuple[int, str] | None = None

    # engine thread -> event loop
    def engine_sink(self, ev: EngineEvent) -> None:
        self.loop.call_soon_threadsafe(self._engine_event, ev)

    def _engine_event(self, ev: EngineEvent) -> None:
        if self._closing is None:
            self.apply(self.protocol.engine_event(ev))

    def apply(self, actions) -> None:
        for a in actions:
            kind = type(a).__name__
            if kind == "Send":
                try:
                    self.outbox.put(a)
                except OutboxFull:
                    self.close(1008, "slow consumer: the client is not reading")
                    return
            elif kind == "Purge":
                self.outbox.purge(a.stream)
            elif kind == "Close":
                self.close(a.code, a.reason)

    def close(self, code: int, reason: str) -> None:
        """Close after what is queued so far has been written."""
        if self._closing is None:
            self._closing = (code, reason)
            self.outbox.close()

    async def run(self, drain_timeout_s: float = 5.0) -> None:
        self.apply(self.protocol.ready())
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
            self.protocol.connection_lost()
            if not self.ws.closed:
                code, reason = self._closing or (1000, "")
                await self.ws.close(code=code, message=reason.encode()[:120])

    async def _read(self) -> None:
        while self._closing is None:
            try:
                msg = await self.ws.receive(timeout=self.idle_timeout_s)
            except asyncio.TimeoutError:
                self.apply(self.protocol.idle_timeout())   # closes unless contexts are in flight
                continue
            if msg.type == WSMsgType.TEXT:
                self.apply(self.protocol.receive_text(msg.data))
            elif msg.type == WSMsgType.BINARY:
                self.apply(self.protocol.receive_binary(msg.data))
            else:   # CLOSE, CLOSING, CLOSED, ERROR
                return

    async def _write(self) -> None:
        while (item := await self.outbox.get()) is not None:
            if isinstance(item.data, bytes):
                await self.ws.send_bytes(item.data)
            else:
                await self.ws.send_str(item.data)
            if item.stream is not None:
                self.protocol.note_sent(item.stream, item.audio_ms)
