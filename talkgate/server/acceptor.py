"""A gateway worker's accepts from the port's listening sockets, which every worker shares (server/listen.py shared).

A new connection goes to the worker whose loop reaches the socket first: one busy in a callback (encoding a step's
audio for its streams) does not, so the connection goes to one that is free to serve it. A worker at its connection
cap (its `full`: limits.max_connections, its share of the server's) leaves new connections to the others: it looks
away for FULL_ACCEPT_S, and takes a connection still waiting then (every worker full, or none free to take it: the
gateway refuses it with 1013), so that a client hears the refusal within about that long instead of waiting in the
kernel's queue. One connection an event, so that where several arrive together the other workers' loops get their
turn at them.

    acceptor = Acceptor(loop, sockets, runner.server, ssl_context, full=lambda: gateway.full)
    acceptor.start(backlog)   # listening
    ...
    acceptor.stop()           # no more accepts; the sockets closed in this process (the other workers' stay open)
"""
from __future__ import annotations

import asyncio
import logging
import select
import socket
import ssl
from typing import Callable

log = logging.getLogger("talkgate.acceptor")
FULL_ACCEPT_S = 0.05        # a full worker takes one connection at most this often (the rest: the other workers)
ERROR_PAUSE_S = 1.0         # accept failed (out of file descriptors or memory): look again after this long


class Acceptor:
    def __init__(self, loop: asyncio.AbstractEventLoop, sockets: list[socket.socket], protocol_factory,
                 ssl_context: ssl.SSLContext | None, full: Callable[[], bool]):
        self.loop, self.sockets, self.factory, self.ssl, self.full = loop, sockets, protocol_factory, ssl_context, full
        self._owed: set[int] = set()        # sockets whose connection waited out a pause while full: taken next
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._opening: set[asyncio.Task] = set()
        self._stopped = False

    def start(self, backlog: int) -> None:
        """Listen (the socket is the same in every worker: the first worker to listen opens the port to clients)."""
        for s in self.sockets:
            s.listen(backlog)
            self.loop.add_reader(s.fileno(), self._readable, s)

    def stop(self) -> None:
        self._stopped = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for s in self.sockets:
            self.loop.remove_reader(s.fileno())
            s.close()

    def _pause(self, s: socket.socket, seconds: float) -> None:
        self.loop.remove_reader(s.fileno())
        self._timers[s.fileno()] = self.loop.call_later(seconds, self._resume, s)

    def _resume(self, s: socket.socket) -> None:
        self._timers.pop(s.fileno(), None)
        if self._stopped:
            return
        if waiting(s):                      # no other worker took it while this one looked away
            self._owed.add(s.fileno())
        self.loop.add_reader(s.fileno(), self._readable, s)

    def _readable(self, s: socket.socket) -> None:
        if self.full() and s.fileno() not in self._owed:
            self._pause(s, FULL_ACCEPT_S)
            return
        self._owed.discard(s.fileno())
        try:
            conn, _ = s.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return                          # another worker took it, or its client gave up
        except OSError as e:                # out of descriptors or memory (the others: the same, logged)
            log.warning("accepting a connection failed (%s): trying again in %g s", e.strerror, ERROR_PAUSE_S)
            self._pause(s, ERROR_PAUSE_S)
            return
        conn.setblocking(False)
        task = self.loop.create_task(self._open(conn))
        self._opening.add(task)
        task.add_done_callback(self._opening.discard)

    async def _open(self, conn: socket.socket) -> None:
        """The connection handed to the HTTP server (its TLS handshake first, where the port has TLS)."""
        try:
            await self.loop.connect_accepted_socket(self.factory, conn, ssl=self.ssl)
        except (OSError, ssl.SSLError, asyncio.TimeoutError) as e:
            log.debug("a connection closed before it was open: %r", e)
            conn.close()


def waiting(s: socket.socket) -> bool:
    """A connection waits in the listening socket's queue now."""
    poller = select.poll()
    poller.register(s, select.POLLIN)
    return bool(poller.poll(0))
