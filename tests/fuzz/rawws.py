"""A WebSocket client on a raw TCP socket that builds every frame by hand (RFC 6455), so a test can send
what no library client sends (unmasked frames, bad close codes, reserved bits, invalid UTF-8, lying
lengths) and see exactly what the server writes back, byte for byte: an HTTP answer instead of the
upgrade, frames, a close frame's code and reason, a reset.

    ws = RawWebSocket.connect(port, "/v1/ws")
    ws.send_text('{"type":"ping"}'); frame = ws.recv_frame(timeout=5)
"""
from __future__ import annotations

import base64
import hashlib
import os
import socket
import ssl
import struct
import time
from dataclasses import dataclass, field

OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class HandshakeRefused(Exception):
    """The server answered the upgrade request with an HTTP response other than 101."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        super().__init__(f"HTTP {status}: {body[:200]!r}")
        self.status, self.headers, self.body = status, headers, body


class HttpInStream(Exception):
    pass


@dataclass
class Frame:
    fin: bool
    opcode: int
    payload: bytes
    rsv: int = 0
    masked: bool = False

    @property
    def close_code(self) -> int | None:
        return struct.unpack("!H", self.payload[:2])[0] if self.opcode == OP_CLOSE and len(self.payload) >= 2 else None

    @property
    def close_reason(self) -> str:
        return self.payload[2:].decode("utf-8", "replace") if self.opcode == OP_CLOSE else ""


@dataclass
class Ended:
    """How the byte stream ended when no more frames came: 'eof' (FIN), 'reset' (RST), 'timeout', or
    'http-in-stream' (HTTP bytes where frames belong, e.g. an error page after the 101)."""
    how: str
    garbage: bytes = b""        # bytes that were not a valid server frame (e.g. an HTTP response in the stream)


def build_frame(opcode: int, payload: bytes = b"", fin: bool = True, mask: bool = True, rsv: int = 0,
                length: int | None = None) -> bytes:
    """One frame as a client sends it; `length` overrides the declared payload length (a lie)."""
    n = len(payload) if length is None else length
    head = bytes([(0x80 if fin else 0) | (rsv & 7) << 4 | opcode & 0x0F])
    m = 0x80 if mask else 0
    if n < 126:
        head += bytes([m | n])
    elif n < 1 << 16:
        head += bytes([m | 126]) + struct.pack("!H", n)
    else:
        head += bytes([m | 127]) + struct.pack("!Q", n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + _xor(payload, key)


def _xor(data: bytes, key: bytes) -> bytes:
    if not data:
        return b""
    k = (key * (len(data) // 4 + 1))[:len(data)]
    return (int.from_bytes(data, "big") ^ int.from_bytes(k, "big")).to_bytes(len(data), "big")


def close_payload(code: int | None, reason: bytes = b"") -> bytes:
    return b"" if code is None else struct.pack("!H", code) + reason


@dataclass
class RawWebSocket:
    sock: socket.socket
    response_headers: dict[str, str] = field(default_factory=dict)
    buf: bytes = b""

    @classmethod
    def connect(cls, port: int, path: str, headers: dict[str, str] | None = None, rcvbuf: int | None = None,
                raw_headers: bytes = b"", host: str = "127.0.0.1", timeout: float = 30.0,
                tls: ssl.SSLContext | None = None) -> "RawWebSocket":
        """Open the TCP connection (TLS with `tls`) and upgrade; raises HandshakeRefused with the HTTP answer
        otherwise. `raw_headers`: extra header lines sent as bytes (e.g. a non-ASCII API key), each ending in CRLF."""
        sock = socket.socket()
        if rcvbuf is not None:     # before connect: the window is negotiated at the handshake
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(timeout)
        sock.connect((host, port))
        if tls is not None:
            sock = tls.wrap_socket(sock, server_hostname=host)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Upgrade: websocket", "Connection: Upgrade",
                 f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        sock.sendall("\r\n".join(lines).encode("latin-1") + b"\r\n" + raw_headers + b"\r\n")
        ws = cls(sock)
        status, hdrs, rest = ws._read_http_head()
        if status != 101:
            body = ws._read_http_body(hdrs, rest)
            sock.close()
            raise HandshakeRefused(status, hdrs, body)
        expect = base64.b64encode(hashlib.sha1(key.encode() + GUID).digest()).decode()
        assert hdrs.get("sec-websocket-accept") == expect, hdrs
        ws.response_headers, ws.buf = hdrs, rest
        return ws

    def _read_http_head(self) -> tuple[int, dict[str, str], bytes]:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError(f"connection closed during the handshake: {data!r}")
            data += chunk
        head, rest = data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        hdrs = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        return status, hdrs, rest

    def _read_http_body(self, hdrs: dict[str, str], rest: bytes) -> bytes:
        n = int(hdrs.get("content-length", "-1"))
        self.sock.settimeout(5)
        try:
            while n < 0 or len(rest) < n:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                rest += chunk
        except (TimeoutError, OSError):
            pass
        return rest if n < 0 else rest[:n]

    # ----- sending -----
    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, opcode: int, payload: bytes = b"", **kw) -> None:
        self.sock.sendall(build_frame(opcode, payload, **kw))

    def send_text(self, text: str | bytes, **kw) -> None:
        self.send_frame(OP_TEXT, text.encode() if isinstance(text, str) else text, **kw)

    def send_close(self, code: int | None = 1000, reason: bytes = b"", **kw) -> None:
        self.send_frame(OP_CLOSE, close_payload(code, reason), **kw)

    # ----- receiving -----
    def recv_frame(self, timeout: float = 10.0) -> Frame | Ended:
        """The next whole frame, or Ended when the stream ends (or nothing comes within `timeout`)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                frame = self._parse()
            except HttpInStream:
                return Ended("http-in-stream", self.buf)
            if frame is not None:
                return frame
            left = deadline - time.monotonic()
            if left <= 0:
                return Ended("timeout", self.buf)
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                return Ended("timeout", self.buf)
            except ConnectionResetError:
                return Ended("reset", self.buf)
            if not chunk:
                return Ended("eof", self.buf)
            self.buf += chunk

    def _parse(self) -> Frame | None:
        b = self.buf
        if b.startswith(b"HTTP/"):      # an HTTP response written into the upgraded stream
            raise HttpInStream(b)
        if len(b) < 2:
            return None
        n, off = b[1] & 0x7F, 2
        if n == 126:
            if len(b) < 4:
                return None
            n, off = struct.unpack("!H", b[2:4])[0], 4
        elif n == 127:
            if len(b) < 10:
                return None
            n, off = struct.unpack("!Q", b[2:10])[0], 10
        masked = bool(b[1] & 0x80)
        key = b""
        if masked:
            if len(b) < off + 4:
                return None
            key, off = b[off:off + 4], off + 4
        if len(b) < off + n:
            return None
        payload = b[off:off + n]
        self.buf = b[off + n:]
        return Frame(bool(b[0] & 0x80), b[0] & 0x0F, _xor(payload, key) if masked else payload, (b[0] >> 4) & 7, masked)

    def frames_until_close(self, timeout: float = 10.0, pong: bool = False) -> tuple[list[Frame], Frame | Ended]:
        """Every frame up to and including the server's close frame (or how the stream ended). `pong`: each ping
        is answered with its pong (RFC 6455 5.5.2) and left out."""
        frames: list[Frame] = []
        deadline = time.monotonic() + timeout
        while True:
            f = self.recv_frame(max(0.01, deadline - time.monotonic()))
            if isinstance(f, Ended) or f.opcode == OP_CLOSE:
                return frames, f
            if pong and f.opcode == OP_PING:
                try:
                    self.send_frame(OP_PONG, f.payload)
                except OSError:         # the server closed it: the rest is read on
                    pass
            else:
                frames.append(f)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def abort(self) -> None:
        """Close with a TCP reset (SO_LINGER 0): a client that vanished."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.close()
