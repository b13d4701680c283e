"""The server end of one WebSocket: aiohttp's, plus the RFC 6455 check aiohttp 3.x leaves out.

aiohttp answers a client's close frame with 1000 whatever code it carried, and accepts 1006 and codes
from 5000 up (its reader only refuses unregistered codes below 3000). Here the close frame is answered
by talkgate: an invalid code fails the connection with 1002, as RFC 6455 section 7.4 and the Autobahn
testsuite (cases 7.9.x, 7.13.x) expect. docs/reliability.md lists which frame-level behaviours are
aiohttp's and which are talkgate's. Once closed, the socket no longer re-arms aiohttp's heartbeat, so
nothing holds it after its handler ends. Frames queued together are written with one call to the transport
(`write_frames`): aiohttp writes each frame on its own, a send() system call per 20-ms Opus packet, which
was as much of a worker's time as libopus (docs/benchmarks.md).
"""
from __future__ import annotations

import struct

from aiohttp import WSCloseCode, WSMsgType, web


def close_code_valid(code: int) -> bool:
    """May a peer send this close code? 1000-1003 and 1007-1014 (the IANA registry), 3000-4999, or none
    (aiohttp reads a close frame without a code as 0). 1004-1006 and 1015 are reserved, never sent."""
    return code == 0 or 1000 <= code <= 1003 or 1007 <= code <= 1014 or 3000 <= code <= 4999


def server_frame(data: str | bytes) -> tuple[bytes, bytes]:
    """(header, payload) of one unmasked, unfragmented RFC 6455 frame: text for str, binary for bytes (no
    extension: talkgate never negotiates permessage-deflate). Apart, so that a write copies a payload once."""
    payload, opcode = (data.encode(), 0x1) if isinstance(data, str) else (data, 0x2)
    n = len(payload)
    if n < 126:
        return struct.pack("!BB", 0x80 | opcode, n), payload
    if n < 65536:
        return struct.pack("!BBH", 0x80 | opcode, 126, n), payload
    return struct.pack("!BBQ", 0x80 | opcode, 127, n), payload


class GatewayWebSocket(web.WebSocketResponse):
    def __init__(self, **kwargs):
        super().__init__(autoclose=False, **kwargs)

    def _reset_heartbeat(self) -> None:
        # aiohttp 3.14 re-arms the heartbeat for every chunk the peer sends, also after the close (the client's
        # close frame, frames sent after ours): its timer, 20 s and then the pong's 10 s, would hold the closed
        # connection's objects that long. A worker closing hundreds a second held thousands: tens of MB, and
        # full garbage collections of 300 ms on its event loop (docs/reliability.md, the release check)
        if not (self._closed or self._closing):
            super()._reset_heartbeat()

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

    async def receive(self, timeout: float | None = None):
        msg = await super().receive(timeout)
        if msg.type is WSMsgType.CLOSE and not self.closed:
            # the peer is closing: answer at once, without waiting for queued frames to drain
            code = WSCloseCode.OK if close_code_valid(msg.data) else WSCloseCode.PROTOCOL_ERROR
            await self.close(code=code, drain=False)
        return msg
