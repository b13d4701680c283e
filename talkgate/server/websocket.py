"""The server end of one WebSocket: aiohttp's, plus the RFC 6455 check aiohttp 3.x leaves out.

aiohttp answers a client's close frame with 1000 whatever code it carried, and accepts 1006 and codes
from 5000 up (its reader only refuses unregistered codes below 3000). Here the close frame is answered
by talkgate: an invalid code fails the connection with 1002, as RFC 6455 section 7.4 and the Autobahn
testsuite (cases 7.9.x, 7.13.x) expect. docs/reliability.md lists which frame-level behaviours are
aiohttp's and which are talkgate's. Once closed, the socket no longer re-arms aiohttp's heartbeat, so
nothing holds it after its handler ends. Frames queued together are written with one call to the transport
(`write_frames`): aiohttp writes each frame on its own, a send() system call per 20-ms Opus packet, which
was as much of a worker's time as libopus (docs/benchmarks.md). When aiohttp's reader fails the connection
(a message over the frame limit: 1009; a protocol error: 1002; invalid UTF-8: 1007), what the client still sends
is read and dropped after the close frame (`LingeringClose`), so that the client reads the close frame instead
of a reset. A client that does not answer the heartbeat's ping in time (one that stopped reading: the ping waits
behind its audio) gets close 1008 `keepalive ping timeout` after what was already written, not just the end of
the stream (`_handle_ping_pong_exception`); the transport has CLOSE_LINGER_S to hand it over.
"""
from __future__ import annotations

import asyncio
import struct

from aiohttp import WSCloseCode, WSMsgType, WebSocketError, web

LINGER_S = 5.0                   # a failed connection reads what its client still sends for at most this long
LINGER_BYTES = 64 * 1024 * 1024  # and this much (4 times the largest message tried: 16 MiB, read in ~10 ms)
QUIET_S = 0.5                    # the server's FIN follows once the client has sent nothing for this long
PING_TIMEOUT_CLOSE = (1008, b"keepalive ping timeout")   # the client broke RFC 6455: no pong
CLOSE_LINGER_S = 30.0            # a transport closed on a client that does not read flushes for at most this long


def close_code_valid(code: int) -> bool:
    """May a peer send this close code? 1000-1003 and 1007-1014 (the IANA registry), 3000-4999, or none
    (aiohttp reads a close frame without a code as 0). 1004-1006 and 1015 are reserved, never sent."""
    return code == 0 or 1000 <= code <= 1003 or 1007 <= code <= 1014 or 3000 <= code <= 4999


def server_frame(data: str | bytes, opcode: int | None = None) -> tuple[bytes, bytes]:
    """(header, payload) of one unmasked, unfragmented RFC 6455 frame: text for str, binary for bytes, or `opcode`'s
    (no extension: talkgate never negotiates permessage-deflate). Apart, so that a write copies a payload once."""
    payload = data.encode() if isinstance(data, str) else data
    if opcode is None:
        opcode = 0x1 if isinstance(data, str) else 0x2
    n = len(payload)
    if n < 126:
        return struct.pack("!BB", 0x80 | opcode, n), payload
    if n < 65536:
        return struct.pack("!BBH", 0x80 | opcode, 126, n), payload
    return struct.pack("!BBQ", 0x80 | opcode, 127, n), payload


class LingeringClose(asyncio.Protocol):
    """A failed connection's transport from its close frame on. Closed at once, the socket would answer what
    the client still sends (the rest of an oversized message) with a reset, and the client would report that
    (1006) instead of the close frame already in its receive queue. So what the client sends is read and
    dropped, nothing kept, until the client ends its side, and for at most LINGER_S or LINGER_BYTES (then the
    transport is aborted). The server's end of the stream (FIN) waits until the client has been quiet for
    QUIET_S: aiohttp's client (3.14) that finds the end of the stream before it has answered the close frame
    fails to write its answer and reports 1006, while the websockets client answers and then waits for the
    server's end. aiohttp's protocol, replaced here, still hears of the end and of write flow control."""

    def __init__(self, transport: asyncio.Transport, replaced: asyncio.BaseProtocol):
        self.loop = asyncio.get_running_loop()
        self.transport, self.replaced = transport, replaced
        self.bytes_left = LINGER_BYTES
        self.last_data = self.loop.time()
        self.ended = self.loop.create_future()
        self.deadline = self.loop.call_later(LINGER_S, transport.abort)
        self.quiet = self.loop.call_later(QUIET_S, self.end_stream_once_quiet)
        transport.set_protocol(self)
        transport.resume_reading()      # aiohttp may have paused reading while its message queue was full

    def end_stream_once_quiet(self) -> None:
        quiet_for = self.loop.time() - self.last_data
        if quiet_for < QUIET_S:
            self.quiet = self.loop.call_later(QUIET_S - quiet_for, self.end_stream_once_quiet)
        elif self.transport.can_write_eof():   # TLS cannot half-close: there the client's own end ends it
            self.transport.write_eof()

    def data_received(self, data: bytes) -> None:
        self.last_data = self.loop.time()
        self.bytes_left -= len(data)
        if self.bytes_left < 0:         # the budget is spent: a client that keeps sending gets the reset
            self.transport.abort()

    def eof_received(self) -> bool:
        return False                    # the client has ended its side: the transport closes

    def pause_writing(self) -> None:
        self.replaced.pause_writing()

    def resume_writing(self) -> None:
        self.replaced.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.deadline.cancel()
        self.quiet.cancel()
        self.replaced.connection_lost(exc)
        if not self.ended.done():
            self.ended.set_result(None)


def close_flushed(transport: asyncio.BaseTransport) -> None:
    """Close `transport` once what it holds is written (a close frame last), aborted after CLOSE_LINGER_S: a client
    that stopped reading and reads again within it gets every byte and the close frame with its code, where an abort
    would drop what asyncio still buffers (the close frame too) and leave it the end of the stream alone; one that
    never reads again is dropped then, its buffers freed."""
    transport.close()
    asyncio.get_running_loop().call_later(CLOSE_LINGER_S, transport.abort)


class GatewayWebSocket(web.WebSocketResponse):
    def __init__(self, **kwargs):
        super().__init__(autoclose=False, **kwargs)
        self._lingering: LingeringClose | None = None

    def _reset_heartbeat(self) -> None:
        # aiohttp 3.14 re-arms the heartbeat for every chunk the peer sends, also after the close (the client's
        # close frame, frames sent after ours): its timer, 20 s and then the pong's 10 s, would hold the closed
        # connection's objects that long. A worker closing hundreds a second held thousands: tens of MB, and
        # full garbage collections of 300 ms on its event loop (docs/reliability.md, the release check)
        if not (self._closed or self._closing):
            super()._reset_heartbeat()

    def _handle_ping_pong_exception(self, exc: BaseException) -> None:
        # aiohttp 3.14 closes the transport without a close frame when the pong is late: a client that had
        # stopped reading (the ping waits in its socket behind audio) and reads again finds the end of the stream,
        # no code, no reason. The close frame goes after what is written; the transport's close flushes them
        # (CLOSE_LINGER_S at most: a client that never reads again is aborted then, its buffers freed).
        transport = self._writer.transport if self._writer is not None else None
        if not self._closed and transport is not None and not transport.is_closing():
            code, reason = PING_TIMEOUT_CLOSE
            transport.write(b"".join(server_frame(struct.pack("!H", code) + reason, opcode=0x8)))
            close_flushed(transport)
        super()._handle_ping_pong_exception(exc)

    def writable(self) -> bool:
        """Whether write_frames writes now (else it raises ConnectionResetError)."""
        return self._writer is not None and not self.closed and not self._writer.transport.is_closing()

    def write_frames(self, messages: list[str | bytes]) -> list[int]:
        """Write `messages` (text or binary) as frames, in order, with one transport write; returns each
        frame's bytes. The caller bounds what the socket holds (Connection.room). Once the close frame is
        sent, or the transport is closing, raises ConnectionResetError, as aiohttp's send_bytes does: no
        data frame follows a close frame."""
        if self._writer is None:
            raise RuntimeError("Call .prepare() first")
        transport = self._writer.transport
        if self.closed or transport.is_closing():
            raise ConnectionResetError("Cannot write to closing transport")
        frames = [server_frame(m) for m in messages]
        transport.write(b"".join(part for frame in frames for part in frame))
        return [len(header) + len(payload) for header, payload in frames]

    def _close_transport(self) -> None:
        # aiohttp 3.14 fails a connection whose frames its reader refused (web_ws.py receive(): close() writes the
        # close frame, its read for the client's close raises the reader's error, exception() is that
        # WebSocketError) by closing the transport here at once. The client may still be sending (the rest of
        # an oversized message), and may never read the close frame: LingeringClose reads the rest first.
        if self._lingering is not None:
            return                      # it owns the transport and closes it
        transport = self._writer.transport if self._writer is not None else None
        if isinstance(self.exception(), WebSocketError) and transport is not None and not transport.is_closing():
            self._lingering = LingeringClose(transport, transport.get_protocol())
        else:
            super()._close_transport()

    async def write_eof(self) -> None:
        # aiohttp awaits this after the handler returns and closes the transport right after (web_protocol.py
        # finish_response, start()): a lingering close must have ended by then, or that close resets it
        await super().write_eof()
        if self._lingering is not None:
            await self._lingering.ended

    async def receive(self, timeout: float | None = None):
        msg = await super().receive(timeout)
        if msg.type is WSMsgType.CLOSE and not self.closed:
            # the peer is closing: answer at once, without waiting for queued frames to drain
            code = WSCloseCode.OK if close_code_valid(msg.data) else WSCloseCode.PROTOCOL_ERROR
            await self.close(code=code, drain=False)
        return msg
