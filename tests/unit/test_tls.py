"""The server's TLS context (server/listen.py tls_context) on a real loopback connection."""
from __future__ import annotations

import select
import socket
import ssl
import threading

import pytest

from talkgate.server.listen import tls_context
from tests.tlscert import self_signed


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    return tuple(str(p) for p in self_signed(tmp_path_factory.mktemp("tls")))


def test_the_server_sends_nothing_after_its_handshake_until_the_client_speaks(cert):
    """No TLS 1.3 session tickets: a client that reads in one thread and writes its request in another (websockets'
    sync client, under the vendors' SDKs) must find nothing to read before the server's answer, or its read and
    write meet in one OpenSSL connection (docs/compat.md, TLS)."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def serve():
        raw, _ = listener.accept()
        conn = tls_context(*cert).wrap_socket(raw, server_side=True)   # completes the handshake
        accepted.append(conn)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    client_ctx = ssl.create_default_context(cafile=cert[0])
    with client_ctx.wrap_socket(socket.create_connection(listener.getsockname()), server_hostname="127.0.0.1") as c:
        server.join(10)
        assert accepted and c.version() == "TLSv1.3"
        readable, _, _ = select.select([c], [], [], 0.5)
        assert readable == [] and c.pending() == 0
        c.sendall(b"ping")                       # the connection works: what the client says arrives
        assert accepted[0].recv(4) == b"ping"
    accepted[0].close()
    listener.close()
