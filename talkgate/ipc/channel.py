"""The engine boundary's transport: messages (lists of byte parts, ipc/wire.py's) over one AF_UNIX stream socket
per gateway worker, written by the thread that sends them and read by the thread that uses them.

No I/O thread stands in between (ZMQ had one in each process): at a low rate every thread hand-off is a wake-up of
an idle core, which is what a one-way message cost (bench/wakeup.py: ZMQ ROUTER/DEALER 0.5 ms p50 where the same
message over a plain socket took 0.03-0.16 ms; docs/benchmarks.md). A send writes straight to the socket; what the
socket cannot take at once (a large STEP while the worker is busy) waits in the connection's own queue for the
owner to flush it (a worker's event loop when the socket is writable; an engine process's Flusher thread, so that
its engine thread never waits for a worker).

On the wire a message is [parts u32][length u64 per part][the parts' bytes]. Reader turns received bytes back into
messages whose parts are views of the receive buffer (nothing copied per message; a buffer is never written again
once a view of it has been handed out). Sizes are bounded: MAX_PARTS parts, MAX_MESSAGE_BYTES in all, else
ProtocolError and the connection is closed.

    listener = listen("ipc:///tmp/tg/engine-0.ipc")           # the engine process
    sock = connect("ipc:///tmp/tg/engine-0.ipc")              # a worker: None while nothing listens there
    out, reader = Outgoing(sock), Reader()
    out.send([b"C", payload])                                  # -> True, or False once the peer is gone
    n = receive(sock, reader)                                  # bytes read (0: nothing now), Closed at the end
    for parts in reader.messages(): ...
"""
from __future__ import annotations

import collections
import contextlib
import os
import select
import socket
import struct
import threading

MAX_PARTS = 8
MAX_MESSAGE_BYTES = 1 << 30
CHUNK = 1 << 16             # a receive buffer's least size
MAX_IOV = 512               # buffers a sendmsg call takes at most (IOV_MAX is 1024 on Linux)
_COUNT = struct.Struct("<I")


class ProtocolError(Exception):
    """The bytes received are not messages of this format (or exceed its bounds): the connection is closed."""


class Closed(Exception):
    """The connection is closed (the peer went away, or its bytes made no sense)."""


def path_of(endpoint: str) -> str:
    """The socket's file of an endpoint "ipc://PATH" (the form talkgate serve and the engine's --endpoint use)."""
    if not endpoint.startswith("ipc://"):
        raise ValueError(f"endpoint {endpoint!r}: expected ipc://PATH (a local socket file)")
    return endpoint[len("ipc://"):]


def listen(endpoint: str) -> socket.socket:
    """A non-blocking listening socket at the endpoint's path (a dead predecessor's socket file is replaced)."""
    path = path_of(endpoint)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def accept(listener: socket.socket, send_buffer: int | None = None) -> socket.socket | None:
    """A connection waiting on the listener, non-blocking; None when none waits. send_buffer: the socket's send
    buffer asked for (the kernel caps it at net.core.wmem_max)."""
    try:
        sock, _ = listener.accept()
    except (BlockingIOError, InterruptedError, ConnectionAbortedError):
        return None
    sock.setblocking(False)
    if send_buffer:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    return sock


def connect(endpoint: str) -> socket.socket | None:
    """A non-blocking connection to the endpoint; None while nothing listens there (no file yet, a dead process's
    file, or its backlog full): try again later."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        sock.connect(path_of(endpoint))
    except (FileNotFoundError, ConnectionRefusedError, BlockingIOError, InterruptedError):
        sock.close()
        return None
    except BaseException:
        sock.close()
        raise
    return sock


def encode(parts: list) -> list:
    """The buffers of one message on the wire: its header, then its parts as they are (not copied)."""
    if not 0 < len(parts) <= MAX_PARTS:
        raise ValueError(f"a message has 1..{MAX_PARTS} parts, not {len(parts)}")
    views = [_bytes(p) for p in parts]
    header = _COUNT.pack(len(views)) + struct.pack(f"<{len(views)}Q", *(v.nbytes for v in views))
    return [header, *views]


def _bytes(part) -> memoryview:
    view = memoryview(part)
    return view.cast("B") if view.nbytes else memoryview(b"")


class Reader:
    """Received bytes in, whole messages out (Sans-I/O): `space()` is where the next bytes go, `received(n)` says how
    many went there, `messages()` takes every whole message received so far."""

    def __init__(self):
        self._buf = bytearray(CHUNK)
        self._lo = self._hi = 0          # bytes received, not yet taken as messages: _buf[_lo:_hi]
        self._need = 0                   # bytes the message at _lo takes in all, once its header is in (0: unknown)

    def space(self) -> memoryview:
        """The free end of the buffer. A buffer too full for more (or for the whole of the message being received)
        is left as it is, its partial message copied to a new one: views of it handed out stay valid."""
        tail = self._hi - self._lo
        if len(self._buf) - self._hi < CHUNK // 4 or (self._need and self._lo + self._need > len(self._buf)):
            buf = bytearray(max(CHUNK, self._need, tail + CHUNK))
            buf[:tail] = self._buf[self._lo:self._hi]
            self._buf, self._lo, self._hi = buf, 0, tail
        return memoryview(self._buf)[self._hi:]

    def received(self, n: int) -> None:
        self._hi += n

    def messages(self) -> list[list[memoryview]]:
        """The whole messages received so far, each a list of its parts (views of the buffer); ProtocolError if the
        bytes are not messages."""
        out = []
        view = memoryview(self._buf)
        while True:
            avail = self._hi - self._lo
            if avail < _COUNT.size:
                break
            (count,) = _COUNT.unpack_from(view, self._lo)
            if not 0 < count <= MAX_PARTS:
                raise ProtocolError(f"a message of {count} parts (1..{MAX_PARTS})")
            head = _COUNT.size + 8 * count
            if avail < head:
                break
            sizes = struct.unpack_from(f"<{count}Q", view, self._lo + _COUNT.size)
            total = head + sum(sizes)
            if total > MAX_MESSAGE_BYTES:
                raise ProtocolError(f"a message of {total} bytes (at most {MAX_MESSAGE_BYTES})")
            if avail < total:
                self._need = total
                break
            at, parts = self._lo + head, []
            for size in sizes:
                parts.append(view[at:at + size])
                at += size
            out.append(parts)
            self._lo, self._need = at, 0
        return out


def receive(sock: socket.socket, reader: Reader) -> int:
    """One non-blocking read into the reader: the bytes read, 0 when none are waiting; Closed at the end of the
    connection or on an error."""
    try:
        n = sock.recv_into(reader.space())
    except (BlockingIOError, InterruptedError):
        return 0
    except OSError as e:
        raise Closed(f"receiving failed ({e.strerror or e})") from None
    if n == 0:
        raise Closed("the peer closed the connection")
    reader.received(n)
    return n


class Outgoing:
    """A connection's sending side: send() writes at once what the socket takes and queues the rest, which flush()
    writes when the socket is writable again (by the owner's loop, or a Flusher: `on_pending(self)` is called when
    bytes start to wait). With `direct_bytes`, a larger message is not written by the sender at all but queued for
    on_pending's thread: the copy of a large STEP into the socket (a few MB a step at hundreds of rows) runs beside
    the engine thread, as it did in ZMQ's I/O thread, while a small one (a first frame) leaves at once. Thread-safe:
    one thread may send while another flushes. After an error every send returns False (`broken` says why)."""

    def __init__(self, sock: socket.socket, on_pending=None, direct_bytes: int | None = None):
        self.sock = sock
        self.on_pending = on_pending
        self.direct_bytes = direct_bytes
        self.pending: collections.deque = collections.deque()
        self.pending_bytes = 0
        self.broken: str | None = None
        self.lock = threading.Lock()

    def send(self, parts: list) -> bool:
        buffers = encode(parts)
        with self.lock:
            if self.broken is not None:
                return False
            queued = bool(self.pending)
            self._queue(buffers)
            if queued:                              # behind what waits: the flusher writes it in order
                return True
            if self.direct_bytes is None or self.pending_bytes <= self.direct_bytes or self.on_pending is None:
                self._write()
            if self.pending and self.broken is None and self.on_pending is not None:
                self.on_pending(self)
            return self.broken is None

    def flush(self) -> bool:
        """Write what waits, as far as the socket takes it: True once nothing waits (or the connection broke)."""
        with self.lock:
            if self.broken is None:
                self._write()
            return not self.pending

    def close(self, why: str = "closed") -> None:
        """No more sends (they return False); what waits is dropped."""
        with self.lock:
            if self.broken is None:
                self._break(why)

    def _queue(self, buffers: list) -> None:
        for b in buffers:
            n = len(b) if isinstance(b, bytes) else b.nbytes
            if n:
                self.pending.append(b if isinstance(b, memoryview) else memoryview(b))
                self.pending_bytes += n

    def _write(self) -> None:
        pending = self.pending
        while pending:
            batch = [pending[i] for i in range(min(len(pending), MAX_IOV))]
            try:
                sent = self.sock.sendmsg(batch)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._break(f"sending failed ({e.strerror or e})")
                return
            self.pending_bytes -= sent
            while sent:
                first = pending[0]
                if sent >= first.nbytes:
                    sent -= first.nbytes
                    pending.popleft()
                else:
                    pending[0] = first[sent:]
                    sent = 0

    def _break(self, why: str) -> None:
        self.broken = why
        self.pending.clear()
        self.pending_bytes = 0


class Flusher:
    """A thread that writes the queued bytes of Outgoing connections as their sockets become writable: an engine
    process's sends never wait for a worker. Idle (asleep in poll) while every queue is empty."""

    def __init__(self, name: str = "talkgate-flusher"):
        self._waiting: set[Outgoing] = set()
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def watch(self, out: Outgoing) -> None:
        """Outgoing.on_pending: `out` has bytes waiting."""
        with self._lock:
            self._waiting.add(out)
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:             # a wake-up is pending already
            pass

    def idle(self) -> bool:
        with self._lock:
            return not self._waiting

    def close(self) -> None:
        self._stop = True
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass
        self._thread.join(5)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self) -> None:
        while not self._stop:
            with self._lock:
                waiting = list(self._waiting)
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            by_fd = {}
            for out in waiting:
                try:
                    fd = out.sock.fileno()
                except OSError:
                    fd = -1
                if fd < 0:                   # closed by its owner: nothing more to write there
                    self._done(out)
                    continue
                by_fd[fd] = out
                poller.register(fd, select.POLLOUT)
            try:
                ready = poller.poll()
            except InterruptedError:
                continue
            for fd, _ in ready:
                if fd == self._wake_r:
                    try:
                        while os.read(self._wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
                    continue
                out = by_fd[fd]
                if out.flush():
                    self._done(out)

    def _done(self, out: Outgoing) -> None:
        with out.lock, self._lock:           # the order of Outgoing.send -> watch
            if not out.pending:
                self._waiting.discard(out)

