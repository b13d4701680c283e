"""The engine boundary's transport (ipc/channel.py): the message format through Reader however the bytes are split,
its bounds, and Outgoing / Flusher on real socket pairs (a socket that takes only part of a message, a peer that
goes away). tests/system/test_engine_process.py runs it between real engine processes and workers."""
from __future__ import annotations

import socket
import struct
import time

import numpy as np
import pytest

from talkgate.ipc import channel


def wire_bytes(messages) -> bytes:
    return b"".join(bytes(b) for parts in messages for b in channel.encode(parts))


def read_all(data: bytes, cut: int) -> list:
    """Feed `data` to a Reader `cut` bytes at a time; every message taken, as lists of bytes."""
    reader, got = channel.Reader(), []
    for i in range(0, len(data), cut):
        piece = data[i:i + cut]
        while piece:
            space = reader.space()
            n = min(len(space), len(piece))
            space[:n] = piece[:n]
            reader.received(n)
            piece = piece[n:]
            got += reader.messages()
    return got


def test_messages_come_back_whole_however_the_bytes_are_split():
    pcm = np.arange(3 * 1920, dtype=np.float32).reshape(3, 1920)
    big = bytes(range(256)) * 2000                         # larger than a receive buffer's first size
    messages = [[b"S", b"header", pcm], [b"A", b""], [b"W", big], [b"T", b"x" * 7]]
    data = wire_bytes(messages)
    want = [[bytes(memoryview(p).cast("B")) if isinstance(p, np.ndarray) else p for p in m] for m in messages]
    for cut in (1, 3, 13, 4096, 70_000, len(data)):
        got = read_all(data, cut)
        assert [[bytes(p) for p in m] for m in got] == want, cut


def test_views_handed_out_stay_valid_while_more_is_received():
    first = [b"S", b"a" * 100, np.ones(1920, np.float32)]
    data = wire_bytes([first] + [[b"T", bytes([i]) * 5000] for i in range(60)])
    reader, got = channel.Reader(), []
    for i in range(0, len(data), 1000):
        piece = data[i:i + 1000]
        space = reader.space()
        space[:len(piece)] = piece
        reader.received(len(piece))
        got += reader.messages()
    assert len(got) == 61
    np.testing.assert_array_equal(np.frombuffer(got[0][2], np.float32), np.ones(1920, np.float32))
    assert all(bytes(m[1]) == bytes([i]) * 5000 for i, m in enumerate(got[1:]))


def test_bytes_that_are_not_messages_are_refused():
    for bad in (struct.pack("<I", 0), struct.pack("<I", channel.MAX_PARTS + 1),
                struct.pack("<IQ", 1, channel.MAX_MESSAGE_BYTES)):
        reader = channel.Reader()
        reader.space()[:len(bad)] = bad
        reader.received(len(bad))
        with pytest.raises(channel.ProtocolError):
            reader.messages()
    with pytest.raises(ValueError):
        channel.encode([])


def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.setblocking(False)
    b.setblocking(False)
    return a, b


def drain(sock, reader, want: int, timeout=10.0) -> list:
    got, deadline = [], time.monotonic() + timeout
    while len(got) < want:
        assert time.monotonic() < deadline, f"{len(got)} of {want} messages"
        if not channel.receive(sock, reader):
            time.sleep(0.001)
        got += reader.messages()
    return got


def test_what_the_socket_cannot_take_waits_and_is_flushed_in_order():
    a, b = pair()
    try:
        out = channel.Outgoing(a)
        block = bytes(1 << 20)                            # far more than a socket buffer takes at once
        assert out.send([b"S", block]) and out.pending and out.pending_bytes > 0
        assert out.send([b"T", b"after"])                 # queued behind, never written ahead of the rest
        reader, got = channel.Reader(), []
        deadline = time.monotonic() + 10
        while len(got) < 2:
            assert time.monotonic() < deadline
            out.flush()
            channel.receive(b, reader)
            got += reader.messages()
        assert [bytes(m[0]) for m in got] == [b"S", b"T"] and bytes(got[1][1]) == b"after"
        assert len(got[0][1]) == 1 << 20 and not out.pending and out.pending_bytes == 0
    finally:
        a.close()
        b.close()


def test_a_flusher_writes_the_queue_without_its_sender():
    a, b = pair()
    flusher = channel.Flusher()
    try:
        out = channel.Outgoing(a, flusher.watch)
        for i in range(8):
            assert out.send([b"S", bytes([i]) * (300_000)])
        got = drain(b, channel.Reader(), 8)                 # only the reader works here: the flusher writes
        assert [bytes(m[1][:1]) for m in got] == [bytes([i]) for i in range(8)]
        deadline = time.monotonic() + 5
        while not flusher.idle():
            assert time.monotonic() < deadline
            time.sleep(0.001)
    finally:
        flusher.close()
        a.close()
        b.close()


def test_a_peer_that_goes_away_breaks_the_connection():
    a, b = pair()
    out = channel.Outgoing(a)
    b.close()
    assert not out.send([b"T", b"x"]) and out.broken
    assert not out.send([b"T", b"y"])                     # and stays broken
    a.close()
    c, d = pair()
    d.close()
    with pytest.raises(channel.Closed):
        channel.receive(c, channel.Reader())
    c.close()


def test_listen_and_connect_by_endpoint(tmp_path):
    endpoint = f"ipc://{tmp_path}/e.ipc"
    assert channel.connect(endpoint) is None               # nothing listens yet: try later
    listener = channel.listen(endpoint)
    try:
        assert channel.accept(listener) is None
        client = channel.connect(endpoint)
        server = channel.accept(listener)
        assert client is not None and server is not None
        assert channel.Outgoing(client).send([b"H", b"hi"])
        assert [bytes(p) for p in drain(server, channel.Reader(), 1)[0]] == [b"H", b"hi"]
        client.close()
        server.close()
    finally:
        listener.close()
    listener = channel.listen(endpoint)                    # a predecessor's file is replaced
    listener.close()
    with pytest.raises(ValueError):
        channel.listen(f"tcp://{tmp_path}")
