"""How much of what was written to a client's socket the client has taken.

A frame handed to the socket is not yet read: it may wait in the transport's buffer or in the kernel's
send queue (Linux SIOCOUTQ: bytes not yet acknowledged by the peer). Those count as queued on the
server. So the slow-consumer rule and the idle rule measure the client, socket buffer included, and a
client that stopped reading is seen as soon as its TCP window closes, not megabytes later.

    d = Delivery(transport)
    d.wrote(n_bytes, stream, audio_ms)     # after each frame handed to the transport
    for stream, audio_ms in d.taken(): ... # frames the client's TCP has acknowledged since last time
    d.in_flight_ms                         # audio handed to the socket and not taken, as of the last taken()

The writers keep at most SOCKET_AUDIO_MS of audio in the socket (connection.py Link.room): the rest waits
in the outbox, where a cancel purges it. Audio in the kernel's send queue cannot be taken back, and the
kernel grows that queue to megabytes, seconds of audio a barge-in or a slow-consumer cancel would let through.
"""
from __future__ import annotations

import collections
import fcntl
import struct
import termios

_OUTQ = getattr(termios, "TIOCOUTQ", None)     # SIOCOUTQ on Linux: unsent + unacknowledged bytes


def socket_queue_bytes(transport) -> int:
    """Bytes written to `transport` that the peer has not acknowledged yet (transport buffer + kernel
    send queue); the transport buffer alone where the kernel cannot tell."""
    if transport is None:
        return 0
    queued = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if sock is not None and _OUTQ is not None:
        try:
            queued += struct.unpack("i", fcntl.ioctl(sock.fileno(), _OUTQ, b"\0\0\0\0"))[0]
        except (OSError, ValueError):      # closed, or not a TCP socket (a test's pipe)
            pass
    return queued


class Delivery:
    def __init__(self, transport):
        self.transport = transport
        self.written = 0                    # bytes handed to the transport, framing included
        self.taken_bytes = 0                # of which the client has taken this many
        self._frames: collections.deque = collections.deque()   # (end offset, stream, audio_ms) of audio
        self.in_flight_ms = 0.0             # audio of those frames

    def wrote(self, n_bytes: int, stream: int | None = None, audio_ms: float = 0.0) -> None:
        self.written += n_bytes
        if stream is not None:
            self._frames.append((self.written, stream, audio_ms))
            self.in_flight_ms += audio_ms

    def taken(self) -> list[tuple[int, float]]:
        """(stream, audio_ms) of the audio frames the client took since the last call."""
        self.taken_bytes = max(self.taken_bytes, self.written - socket_queue_bytes(self.transport))
        out = []
        while self._frames and self._frames[0][0] <= self.taken_bytes:
            _, stream, audio_ms = self._frames.popleft()
            out.append((stream, audio_ms))
            self.in_flight_ms -= audio_ms
        if not self._frames:
            self.in_flight_ms = 0.0         # no float drift
        return out
