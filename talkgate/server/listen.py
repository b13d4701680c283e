"""A server's sockets: bound before the model loads (a busy port is reported at once), shared by the gateway
workers (one listening socket that they all accept from: `shared`), and its TLS context (https:// and wss:// on the
same port).

What a user gets wrong here (a busy port, an address not this machine's, TLS files that do not load) raises
ListenError, told in one line before anything loads.
"""
from __future__ import annotations

import errno
import socket
import ssl
from pathlib import Path

BACKLOG = 128                # connections the kernel queues while the model loads or the loop is busy
CLEANUP_TIMEOUT_S = 2.0      # after the drain: HTTP handlers still running get this long, then are cancelled


class ListenError(Exception):
    """The port or the TLS files cannot be used: a mistake the user can fix, one line."""


def listen(host: str, port: int, backlog: int | None = BACKLOG) -> list[socket.socket]:
    """Listening sockets on every address of `host` (port 0: one free port, the same for every address).
    backlog None: bound, not listening (the supervisor's: its workers listen on them, `shared`). ListenError when
    the port is busy, the address is not this machine's, ..."""
    where = f"{host}:{port}"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ListenError(f"--host {host}: {e.strerror}") from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            s = socket.socket(family, kind, proto)
            sockets.append(s)
            # as asyncio does: a port still in TIME_WAIT from the last run can be bound, a listening one cannot
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            s.bind(address)
            if backlog is not None:
                s.listen(backlog)
            s.setblocking(False)
    except OSError as e:
        for s in sockets:
            s.close()
        if e.errno == errno.EADDRINUSE:
            raise ListenError(f"cannot listen on {where}: the port is in use (another talkgate?); "
                               "choose another with --port") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise ListenError(f"--host {host}: not an address of this machine") from None
        if e.errno == errno.EACCES:
            raise ListenError(f"cannot listen on {where}: permission denied (ports below 1024 need root); "
                               "choose another with --port") from None
        raise ListenError(f"cannot listen on {where}: {e.strerror}") from None
    return sockets


def shared(fds: list[int]) -> list[socket.socket]:
    """The listening sockets a gateway worker was handed (the supervisor's, bound by serve.py): one socket that every
    worker accepts from (server/acceptor.py), so that a new connection goes to a worker whose loop is free to take it.
    With SO_REUSEPORT the kernel would hash it to one worker at random, however far behind that worker is, and a
    worker behind keeps its streams longer, so it gathers more of them (512 Opus streams on an H200, docs/benchmarks.md
    "Low load after last session's changes, and streams that pause with their worker")."""
    sockets = [socket.socket(fileno=fd) for fd in fds]
    for s in sockets:
        s.setblocking(False)
    return sockets


def tls_context(certfile: str | None, keyfile: str | None) -> ssl.SSLContext | None:
    """The server's TLS context from --ssl-certfile / --ssl-keyfile (both or neither); ListenError for a
    missing file, a file that is not PEM, or a key that does not match the certificate."""
    if certfile is None and keyfile is None:
        return None
    if certfile is None or keyfile is None:
        raise ListenError("--ssl-certfile and --ssl-keyfile go together: give both")
    for flag, path in (("--ssl-certfile", certfile), ("--ssl-keyfile", keyfile)):
        if not Path(path).is_file():
            raise ListenError(f"{flag} {path}: no such file")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(certfile, keyfile)
    except ssl.SSLError as e:
        raise ListenError(f"--ssl-certfile {certfile} / --ssl-keyfile {keyfile}: cannot load them ({e.reason or e}); "
                           "they must be PEM files of a certificate and its private key") from None
    except OSError as e:
        raise ListenError(f"--ssl-certfile {certfile} / --ssl-keyfile {keyfile}: {e.strerror}") from None
    # No TLS 1.3 session tickets. OpenSSL sends them after its handshake, before the client has said anything;
    # a client that reads in one thread while it writes its request in another (websockets' sync client, under
    # the Cartesia, Deepgram and ElevenLabs SDKs) then reads them in SSL_read while SSL_write sends the request,
    # which OpenSSL does not allow on one connection: about one connection in a thousand never got its answer and
    # hung in the client (docs/compat.md, TLS). Without tickets nothing arrives before the server's answer; a
    # client that reconnects does a full handshake instead of resuming a session.
    context.num_tickets = 0
    return context
