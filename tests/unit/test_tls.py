"""The server's TLS context (server/listen.py tls_context) on a real loopback connection."""
from __future__ import annotations

import select
import socket
import ssl
import subprocess
import threading

import pytest

from talkgate.server.listen import tls_context


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "key.pem"),
                    "-out", str(d / "cert.pem"), "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return str(d / "cert.pem"), str(d / "key.pem")


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
